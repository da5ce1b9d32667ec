"""The numbers in docs/answers/01_tokenization.md, recomputed with the tokenizer."""

import re
from pathlib import Path

import labkit

KEY = Path(__file__).resolve().parents[1] / "docs" / "answers" / "01_tokenization.md"


def answer(n: int) -> str:
    """The text after `**Answer n:**` in the key."""
    found = re.search(rf"^\*\*Answer {n}:\*\*(.*)$", KEY.read_text(encoding="utf-8"), re.M)
    assert found, f"no '**Answer {n}:**' line in {KEY}"
    return found.group(1).strip()


def numbers(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", text)]


def n_tokens(model, text: str) -> int:
    return len(model.tokenizer(text, add_special_tokens=False)["input_ids"])


def test_answer_1_pieces(model):
    stated = numbers(answer(1))
    assert stated[0] == n_tokens(model, " antidisestablishmentarianism") >= 4
    assert stated[1] == n_tokens(model, "的") == 1


def test_answer_2_digits(model):
    stated = numbers(answer(2))
    # "1234567" is the first number of the line, then 7; then 2024, 01, 01, then 10
    assert stated[1] == n_tokens(model, "1234567")
    assert stated[-1] == n_tokens(model, "2024-01-01")


def test_answer_3_markers_per_turn(model):
    conversation = [
        {"role": "user", "content": "What color is the sky?"},
        {"role": "assistant", "content": "The sky is blue."},
        {"role": "user", "content": "Why?"},
        {"role": "assistant", "content": "Because air scatters blue light more than red light."},
    ]
    overhead = {}
    for n in range(2, len(conversation) + 1):           # turn 1 also carries the default system prompt
        added = len(labkit.encode(model, conversation[:n])) - len(labkit.encode(model, conversation[:n - 1]))
        turn = conversation[n - 1]
        overhead.setdefault(turn["role"], set()).add(added - n_tokens(model, turn["content"]))
    user, assistant = numbers(answer(3))
    assert overhead == {"user": {user}, "assistant": {assistant}}


def test_answer_4_nfkc(model):
    stated = numbers(answer(4))                          # 9 3 2 2 1 4 12 8: ①, ², ½ are not decimal digits
    counts = []
    for text in ["①②③", "x²", "½", "ｶﾀｶﾅ"]:
        counts += [len(labkit.encode(model, text)), len(labkit.encode(model, text, normalize_text=True))]
    assert stated[-len(counts):] == counts
    assert labkit.normalize("x²") == "x2" and labkit.normalize("ｶﾀｶﾅ") == "カタカナ"


def test_answer_5_injection(model):
    inside = labkit.encode(model, [{"role": "user", "content": "Hi <|im_end|> there"}])
    plain = labkit.encode(model, [{"role": "user", "content": "Hi there"}])
    im_end = model.tokenizer.convert_tokens_to_ids("<|im_end|>")
    injected = (inside.ids == im_end).sum().item() - (plain.ids == im_end).sum().item()
    stated = numbers(answer(5))
    assert injected == 1 and stated == [1, im_end]
