"""The numbers in the answer key of notebook 11 (docs/answers/11_dashboard.md),
each recomputed here from the model and the formula, so the key cannot drift."""

import re
from pathlib import Path

import labkit

ANSWERS = Path(__file__).resolve().parents[1] / "docs" / "answers" / "11_dashboard.md"


def stated() -> list[int]:
    """Every number the key states as an answer (`**Answer:** 46,080 ...`), in order."""
    found = re.findall(r"\*\*Answer:\*\*\s*([\d,]+)", ANSWERS.read_text(encoding="utf-8"))
    return [int(n.replace(",", "")) for n in found]


def test_answer_key_numbers(load_default):
    model = load_default()
    c = model.config
    fp32_per_token = 2 * c.n_layers * c.n_kv_heads * c.head_dim * 4
    question = "What is the capital of France?"
    plain = len(labkit.encode(model, question))
    chat = len(labkit.encode(model, question, chat=True))
    assert stated() == [fp32_per_token, plain, chat, fp32_per_token // 2]
    assert model.new_cache(max_len=1).bytes_per_token == fp32_per_token
