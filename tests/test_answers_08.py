"""The numbers in docs/answers/08_precision.md, recomputed.

Each `**Answer N:**` line of the key is parsed and checked against an
independent computation (the model's config and formulas written out here,
torch.finfo, or labkit run again), so the key cannot silently go wrong when
the model, labkit or the notebook changes.
"""

import math
import re
from pathlib import Path

import pytest
import torch

import labkit
from labkit import kv_quant, precision, quantize

KEY = Path(__file__).resolve().parents[1] / "docs" / "answers" / "08_precision.md"
PROMPTS = ["The capital of France is", "The three primary colours are red,"]    # the notebook's


def answer(n: str) -> str:
    """The text after `**Answer n:**` in the key."""
    found = re.search(rf"^\*\*Answer {n}:\*\*(.*)$", KEY.read_text(encoding="utf-8"), re.M)
    assert found, f"no '**Answer {n}:**' line in {KEY}"
    return found.group(1).strip()


def numbers(text: str) -> list[float]:
    """The numbers in text, not the digits of names such as fp32 or int8."""
    return [float(x.replace(",", "")) for x in re.findall(r"(?<![\w.])\d[\d,]*\.?\d*", text)]


def per_token(config, bytes_per_value: float, scale_bytes: int = 0) -> int:
    """2 (K, V) x layers x KV heads x (head size x bytes per value + one scale), written out."""
    return int(2 * config.n_layers * config.n_kv_heads * (config.head_dim * bytes_per_value + scale_bytes))


def test_answer_1a_fp32_scales(model):
    c = model.config
    stated = numbers(answer("1a"))
    b = per_token(c, 1, 4)
    assert stated[0] == b == 12_240
    assert stated[1] == pytest.approx(100 * 4 / (c.head_dim + 4), abs=0.05)


def test_answer_1b_tokens_in_a_gigabyte(model):
    c = model.config
    stated = numbers(answer("1b"))
    fp32, bf16, int8 = per_token(c, 4), per_token(c, 2), per_token(c, 1, 2)
    assert int8 == kv_quant.new_int8_cache(model, 8).bytes_per_token       # the real cache agrees
    assert stated[0] == 10**9 // fp32 and stated[1] == 10**9 // bf16 and stated[2] == 10**9 // int8
    assert stated[3] == 10**9 // int8 // 2048 and stated[4] == 2048


def test_answer_2_int4_with_int8_head(model):
    stated = numbers(answer("2"))
    # Bytes by formula: int4 projections 0.5 byte + 4 bytes (bf16 scale, zero) per 32 weights;
    # the LM head int8 with a bf16 scale per row; norms in bf16; the RoPE buffer.
    c = model.config
    proj = c.n_layers * (2 * c.d_model * c.d_model + 2 * c.d_model * c.n_kv_heads * c.head_dim
                         + 3 * c.d_model * c.d_ff)
    head = c.vocab_size * c.d_model
    norms = (2 * c.n_layers + 1) * c.d_model
    formula = proj * (0.5 + 4 / 32) + head + 2 * c.vocab_size + 2 * norms
    q = quantize.quantize(model, "int4", head="int8")
    assert stated[0] == q.weight_nbytes
    assert abs(q.weight_nbytes - formula) < 1024            # what is left: the RoPE buffer
    # The KLs as the notebook measures them (one run: the reference's continuations once).
    _, r, int4 = precision.measure_precisions(model, {"int4, head int8": q, "int4": quantize.quantize(model, "int4")},
                                              PROMPTS, max_new_tokens=6)
    assert stated[1] == pytest.approx(r.kl_mean, abs=0.0002)
    assert stated[2] == pytest.approx(int4.kl_mean, abs=0.002)


def test_answer_3_fp8(model):
    stated = numbers(answer("3"))
    info = torch.finfo(torch.float8_e4m3fn)
    assert -math.log2(info.eps) == 3                         # 3 stored significand bits
    assert stated[0] == pytest.approx(4 * math.log10(2), abs=0.05)
    assert stated[1] == info.max == 448
    assert stated[2] == per_token(model.config, 1, 2)


def test_answer_4_keys_per_token_or_per_channel(model):
    stated = numbers(answer("4"))
    ids = labkit.encode(model, "The capital of France is").ids
    cache = model.new_cache(16)
    model.forward(ids, cache=cache)
    k = cache.k[:, :, :, :cache.length]                      # (layers, 1, kv, T, hs)
    # Written out here (not kv_quant): symmetric absmax int8 along the last dimension.
    def error(x):
        scale = x.abs().amax(-1, keepdim=True) / 127
        return float(((x / scale).round().clamp(-127, 127) * scale - x).abs().mean())
    assert stated[0] == pytest.approx(error(k), abs=0.0002)
    assert stated[1] == pytest.approx(error(k.transpose(-1, -2)), abs=0.0002)
