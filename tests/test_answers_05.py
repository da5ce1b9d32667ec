"""The numbers in docs/answers/05_sampling.md, recomputed independently.

Each `**Answer N:**` line of the key is parsed and checked against a computation
written here with plain torch on the model's logits (softmax, sort, cumulative
sum) or with the transformers model, so that the key cannot silently go wrong.
"""

import re
from collections import Counter
from pathlib import Path

import pytest
import torch

import labkit

KEY = Path(__file__).resolve().parents[1] / "docs" / "answers" / "05_sampling.md"
PROMPT = "The capital of France is"


def answer(n: int) -> str:
    """The text after `**Answer n:**` in the key."""
    found = re.search(rf"^\*\*Answer {n}:\*\*(.*)$", KEY.read_text(encoding="utf-8"), re.M)
    assert found, f"no '**Answer {n}:**' line in {KEY}"
    return found.group(1).strip()


def numbers(text: str) -> list[float]:
    return [float(x.replace(",", "").replace("−", "-")) for x in re.findall(r"[-−]?\d[\d,]*\.?\d*", text)]


def last_logits(model, prompt):
    with torch.inference_mode():
        return model.hf(labkit.encode(model, prompt).ids[None]).logits[0, -1].float()


def most_repeated_4gram(ids) -> int:
    return Counter(tuple(ids[i:i + 4]) for i in range(len(ids) - 3)).most_common(1)[0][1]


def test_answer_1_penalty_breaks_loop(model):
    stated = numbers(answer(1))                # ..., the loop's count, the grid step, the penalty
    count, step, penalty = stated[-3], stated[-2], stated[-1]
    loop = labkit.generate(model, "I am a", max_new_tokens=32)
    assert most_repeated_4gram(loop.token_ids) == count
    assert "National Science Foundation (NSF)" in loop.text
    unstuck = labkit.generate(model, "I am a", max_new_tokens=32, repetition_penalty=penalty)
    assert most_repeated_4gram(unstuck.token_ids) == 1
    # the smallest on the grid: every step below it still loops
    for i in range(1, round((penalty - 1) / step)):
        below = labkit.generate(model, "I am a", max_new_tokens=32, repetition_penalty=round(1 + i * step, 2))
        assert most_repeated_4gram(below.token_ids) == count


def test_answer_2_temperature_half(model):
    t = numbers(answer(2))[0]
    z = last_logits(model, "My favourite food is")
    # the top token's probability falls as T rises; it crosses 1/2 within 0.001 of the stated T
    assert (z / (t - 0.001)).softmax(-1).max() > 0.5 > (z / (t + 0.001)).softmax(-1).max()


def test_answer_3_top_p_against_top_k(model):
    kept, k, mass = numbers(answer(3))
    probs = last_logits(model, PROMPT).softmax(-1).sort(descending=True).values
    nucleus = int((probs.cumsum(0) < 0.9).sum()) + 1          # smallest set reaching 0.9
    assert kept == nucleus and k == 50
    assert mass == pytest.approx(probs[:50].sum().item(), abs=0.0015)


def test_answer_4_beam_widths(model):
    stated = numbers(answer(4))                # four totals, then 1, 2, 4, 8
    totals, widths = stated[:4], [int(w) for w in stated[4:]]
    assert widths == [1, 2, 4, 8]
    greedy = labkit.generate(model, PROMPT, max_new_tokens=12)
    for width, total in zip(widths, totals):
        beam = labkit.generate(model, PROMPT, max_new_tokens=12, method="beam", num_beams=width)
        full = torch.tensor(beam.prompt_ids + beam.token_ids)
        with torch.inference_mode():
            logp = model.hf(full[None]).logits[0].float().log_softmax(-1)
        n = len(beam.prompt_ids)
        score = sum(logp[n - 1 + i, t].item() for i, t in enumerate(beam.token_ids))
        assert total == pytest.approx(score, abs=0.006)
        assert beam.cache.nbytes == width * greedy.cache.nbytes     # the table's KV cache column
