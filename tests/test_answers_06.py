"""The numbers in docs/answers/06_kv_cache.md, recomputed independently.

Each `**Answer N:**` line of the key is parsed and checked against the formula
2 (K and V) x layers x kv_heads x head size x bytes per value written out here,
the model's config and weights, and the FLOP count written out here, so that the
key cannot silently go wrong.
"""

import re
from pathlib import Path

import pytest
import torch

import labkit

KEY = Path(__file__).resolve().parents[1] / "docs" / "answers" / "06_kv_cache.md"

# the course's example configuration (Llama 3 8B)
LAYERS, HEADS, KV_HEADS, HEAD_DIM = 32, 32, 8, 128


def answer(n: int) -> str:
    """The text after `**Answer n:**` in the key."""
    found = re.search(rf"^\*\*Answer {n}:\*\*(.*)$", KEY.read_text(encoding="utf-8"), re.M)
    assert found, f"no '**Answer {n}:**' line in {KEY}"
    return found.group(1).strip()


def numbers(text: str) -> list[float]:
    return [float(x.replace(",", "")) for x in re.findall(r"\d[\d,]*\.?\d*", text)]


def kv_bytes(layers, kv_heads, head_dim, bytes_per_value, tokens=1):
    return 2 * layers * kv_heads * head_dim * bytes_per_value * tokens


def test_answer_1_example_batch():
    gqa, with_weights, mha = numbers(answer(1))
    tokens = 64 * 4096
    weights = 8.03e9 * 2                   # Llama 3 8B: 8.03 B parameters, fp16
    assert gqa == pytest.approx(kv_bytes(LAYERS, KV_HEADS, HEAD_DIM, 2, tokens) / 1e9, abs=0.05)
    assert with_weights == pytest.approx((kv_bytes(LAYERS, KV_HEADS, HEAD_DIM, 2, tokens) + weights) / 1e9, abs=0.1)
    assert mha == pytest.approx(kv_bytes(LAYERS, HEADS, HEAD_DIM, 2, tokens) / 1e9, abs=0.05)
    assert with_weights < 80 < mha          # "fits" and "does not fit" on an 80 GB GPU
    assert "fits" in answer(1) and "does not fit" in answer(1)


def test_answer_2_flop_ratio(model):
    c = model.config
    stated = numbers(answer(2))             # four ratios, then the four lengths
    ratios, lengths = stated[:4], [int(n) for n in stated[4:]]
    assert lengths == [16, 64, 128, 256]
    weights = c.n_layers * (2 * c.d_model * c.n_heads * c.head_dim + 2 * c.d_model * c.n_kv_heads * c.head_dim
                            + 3 * c.d_model * c.d_ff) + c.vocab_size * c.d_model
    per_key = c.n_layers * c.n_heads * 2 * 2 * c.head_dim      # q.k and p.v, every head and layer
    for n, ratio in zip(lengths, ratios):
        without = 2 * weights * n + per_key * n * (n + 1) // 2     # all n tokens, causal attention
        cached = 2 * weights + per_key * n                        # one token against n - 1 cached + itself
        assert ratio == pytest.approx(without / cached, abs=0.06)


def test_answer_3_truncate_and_decode_again(model):
    stated = [int(x) for x in numbers(answer(3))]
    enc = labkit.encode(model, "The capital of France is")
    cache = model.new_cache(max_len=64)
    with torch.inference_mode():
        first = model.forward(enc.ids, cache=cache)[-1]          # the prefill
        runs = []
        for _ in range(2):                                       # decode 3, truncate, decode 3 again
            tokens, logits = [], first
            for _ in range(3):
                tokens.append(int(logits.argmax()))
                logits = model.forward(torch.tensor([tokens[-1]]), cache=cache)[-1]
            runs.append(tokens)
            cache.truncate(len(enc))
    assert runs[0] == runs[1] == stated
    assert [model.tokenizer.decode([t]) for t in stated] == [" Paris", ".", "\n"]


def test_answer_4_bf16_bytes_per_token(model):
    c = model.config
    assert numbers(answer(4))[0] == kv_bytes(c.n_layers, c.n_kv_heads, c.head_dim, 2)


def test_answer_5_cache_matches_weights(model):
    c = model.config
    tokens, context = numbers(answer(5))[:2]          # (the "16" of "bf16" comes after)
    exact = model.weight_nbytes / kv_bytes(c.n_layers, c.n_kv_heads, c.head_dim, 4)
    assert tokens == pytest.approx(exact, abs=1)
    assert context == c.max_len and tokens > context          # beyond the context, as the key says
    assert "beyond" in answer(5)
    # the same in bf16: weights and cache both halve (2 bytes per weight and per value)
    assert model.n_params * 2 / kv_bytes(c.n_layers, c.n_kv_heads, c.head_dim, 2) == pytest.approx(exact, rel=1e-3)
