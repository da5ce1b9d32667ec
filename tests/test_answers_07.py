"""The numbers in docs/answers/07_prefill_vs_decode.md, recomputed independently.

Each `**Answer N:**` line of the key is parsed and checked against the FLOP and
byte formulas (labkit.costs, itself checked against PyTorch's FLOP counter in
test_costs.py), the datasheet figures written out here and the default model's
config and weights, so that the key cannot silently go wrong.
"""

import re
from pathlib import Path

import pytest

from labkit import costs
from labkit.model import ModelConfig

KEY = Path(__file__).resolve().parents[1] / "docs" / "answers" / "07_prefill_vs_decode.md"

# The course's example configuration, with Llama 3 8B's other shapes (untied embedding).
LLAMA3_8B = ModelConfig("llama", n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, head_dim=128,
                        d_ff=14336, vocab_size=128256, max_len=8192, norm_eps=1e-5, rope_theta=500000.0)
# Datasheets: NVIDIA H100 SXM, 1,979 TFLOP/s bf16 with 2:4 sparsity (half dense), 3.35 TB/s;
# NVIDIA H200 SXM, the same compute, 4.8 TB/s.
H100_RIDGE = 1979e12 / 2 / 3.35e12
H200_RIDGE = 1979e12 / 2 / 4.8e12


def answer(n: str) -> str:
    """The text after `**Answer n:**` in the key."""
    found = re.search(rf"^\*\*Answer {n}:\*\*(.*)$", KEY.read_text(encoding="utf-8"), re.M)
    assert found, f"no '**Answer {n}:**' line in {KEY}"
    return found.group(1).strip()


def numbers(text: str) -> list[float]:
    return [float(x.replace(",", "")) for x in re.findall(r"\d[\d,]*\.?\d*", text)]


def llama3_8b_decode_intensity() -> float:
    """Batch 1, bf16, no context: FLOPs of one token over the 2 bytes of every weight
    the step reads (the untied embedding table is not read, only the new token's row)."""
    c = LLAMA3_8B
    params = (c.n_layers * (2 * c.d_model * c.n_heads * c.head_dim + 2 * c.d_model * c.n_kv_heads * c.head_dim
                            + 3 * c.d_model * c.d_ff + 2 * c.d_model)
              + 2 * c.vocab_size * c.d_model + c.d_model)              # embedding and LM head, final norm
    assert params == pytest.approx(8.03e9, rel=1e-3)                     # Llama 3 8B's published size
    matmul = params - c.vocab_size * c.d_model - (2 * c.n_layers + 1) * c.d_model   # the lookup does not multiply
    flops = 2 * matmul + 2 * c.n_layers * c.n_heads * 2 * c.head_dim   # + attention to its own key
    assert flops == costs.forward_flops(c, 1)
    read = params - c.vocab_size * c.d_model + c.d_model                 # all but the table, plus one row
    return flops / (2 * read + costs.kv_bytes_per_token(c, 2))


def test_answer_2_decode_on_an_h100():
    intensity = llama3_8b_decode_intensity()
    (a,) = numbers(answer("2a").split("FLOP")[0])
    assert a == pytest.approx(intensity, abs=0.005)
    (b,) = numbers(answer("2b"))
    assert b == pytest.approx(H100_RIDGE / intensity, abs=1)
    assert costs.H100_SXM.ridge == pytest.approx(H100_RIDGE, rel=1e-3)   # 989.4 dense; the sheet rounds 1,978.9


def test_answer_3_kv_share(model):
    (share,) = numbers(answer(3).split("%")[0])
    kv = 2 * 30 * 3 * 64 * 4 * 16 * (1024 + 1)       # fp32 K and V of 1,025 positions, 16 sequences
    assert share == pytest.approx(100 * kv / (model.weight_nbytes + kv), abs=0.5)
    assert share == pytest.approx(100 * kv / costs.decode_workload(model, 1024, 16).bytes, abs=0.5)


def test_answer_4_bf16_decode_intensity(load_default):
    bf16 = load_default("bf16")
    intensity, fp32_intensity = numbers(answer(4).split("positions")[0].replace("256", "")) + \
        numbers(answer(4).split("fp32:")[1])
    c = bf16.config
    flops = costs.forward_flops(c, 1, 256)
    assert bf16.weight_nbytes == pytest.approx(538_060_288 / 2, rel=1e-3)
    assert intensity == pytest.approx(flops / (bf16.weight_nbytes + 257 * 2 * 30 * 3 * 64 * 2), abs=0.005)
    assert fp32_intensity == pytest.approx(flops / (538_060_288 + 257 * 2 * 30 * 3 * 64 * 4), abs=0.005)


def test_answer_5_h200():
    text = answer(5)
    ridge = numbers(text.split("FLOP/byte")[0])[-1]
    tokens = numbers(text.split("tokens")[0])[-1]
    assert ridge == pytest.approx(H200_RIDGE, abs=0.5)
    assert tokens == pytest.approx(H200_RIDGE * 2 / 2, abs=0.5)
    assert costs.crossover_tokens(costs.H200_SXM.ridge, 2) == pytest.approx(tokens, abs=0.5)
