"""The FLOP and byte formulas against PyTorch's FLOP counter running labkit's forward, the bytes
of real tensors, and the default model's sizes counted by hand from its config."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import labkit
from labkit import costs
from tiny_models import tiny_hf_model


def counted_flops(model, ids, cache=None, last_only=False):
    with FlopCounterMode(display=False) as counter:
        model.forward(ids, cache=cache, last_only=last_only)
    return counter.get_total_flops()


def extra_square_flops(c, t):
    """The by-hand attention multiplies the full (T x T) score matrix, masked
    afterwards, so it does T*T key products rather than the causal T(T+1)/2:
    this many FLOPs more than the formula counts (scores and weighted sum)."""
    return c.n_layers * c.n_heads * 4 * c.head_dim * (t * t - t * (t + 1) // 2)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
@pytest.mark.parametrize("last_only", [False, True])
def test_prefill_flops_match_counter(kind, last_only):
    m = labkit.Model(tiny_hf_model(kind))
    m.attention = "by_hand"         # plain matmuls, which the counter sees
    ids = torch.arange(24)
    c = m.config
    expected = costs.forward_flops(c, 24, last_only=last_only) + extra_square_flops(c, 24)
    assert counted_flops(m, ids, last_only=last_only) == expected


def test_decode_flops_match_counter():
    m = labkit.Model(tiny_hf_model("llama"))
    m.attention = "by_hand"
    cache = m.new_cache(max_len=64)
    m.forward(torch.arange(30), cache=cache)
    assert counted_flops(m, torch.tensor([5]), cache) == costs.forward_flops(m.config, 1, n_cached=30)


# SmolLM2-135M counted by hand from its config: 30 layers, d_model 576, 9 query and
# 3 KV heads of size 64, d_ff 1536, vocab 49152, embedding tied to the LM head.
BLOCK_MATMUL = 30 * (2 * 576 * 576 + 2 * 576 * 3 * 64 + 3 * 576 * 1536)   # q, o; k, v; gate, up, down
LM_HEAD = 576 * 49152
NORMS = 30 * 2 * 576 + 576
KV_FP32 = 2 * 30 * 3 * 64 * 4                                              # K and V, per token


def test_default_model_counts(model):
    c = model.config
    assert BLOCK_MATMUL + LM_HEAD == 134_479_872 and KV_FP32 == 46_080
    assert costs.matmul_params(c) == BLOCK_MATMUL + LM_HEAD
    assert model.n_params == BLOCK_MATMUL + LM_HEAD + NORMS            # the embedding is the LM head
    assert costs.kv_bytes_per_token(c, 4) == KV_FP32 and costs.kv_bytes_per_token(c, 2) == KV_FP32 // 2
    # The bytes the cache's real tensors hold, filled with 8 tokens.
    cache = model.new_cache(max_len=8)
    model.forward(torch.arange(8), cache=cache)
    held = cache.k.numel() * cache.k.element_size() + cache.v.numel() * cache.v.element_size()
    assert held == 8 * KV_FP32 and cache.nbytes == held and cache.bytes_per_token == KV_FP32


def test_one_kv_formula_and_bytes_per_value():
    """The KV cache's formula has one home (labkit.kv_cache.bytes_per_token); costs and
    the charts call it; bytes per value is the dtype's size."""
    from labkit import charts, kv_cache

    assert kv_cache.bytes_per_token(30, 3, 64, 4) == KV_FP32
    assert kv_cache.bytes_per_token(30, 3, 64, 4, batch_size=5) == 5 * KV_FP32
    assert [costs.bytes_per_value(d) for d in (torch.float32, torch.bfloat16, torch.float16, torch.int8)] \
        == [4, 2, 2, 1]
    assert charts.kv_cache_bytes(30, 3, 64, seq_len=7, bytes_per_value=4, batch_size=2) == 14 * KV_FP32


def test_forward_bytes_are_weights_and_kv():
    """Every weight once, shared by the batch; each sequence's K and V of its positions."""
    assert costs.forward_bytes(100, 10, 7) == 170
    assert costs.forward_bytes(100, 10, 7, batch_size=3) == 100 + 3 * 70


@pytest.fixture
def manual(model):
    """The session model with by-hand attention (plain matmuls the counter sees), restored after."""
    before, model.attention = model.attention, "by_hand"
    yield model
    model.attention = before


def test_default_model_workloads(manual):
    model, c = manual, manual.config
    # Bytes: every real weight tensor once (parameters() yields the tied embedding once),
    # plus the fp32 K and V of every position.
    weights = sum(t.numel() * t.element_size() for t in (*model.hf.parameters(), *model.hf.buffers()))
    cache = model.new_cache(max_len=128)
    model.forward(torch.arange(100), cache=cache)
    dec = costs.decode_workload(model, n_cached=100)
    assert dec.flops == counted_flops(model, torch.tensor([5]), cache)
    assert dec.bytes == weights + 101 * KV_FP32
    pre = costs.prefill_workload(model, 16)
    assert pre.flops + extra_square_flops(c, 16) == counted_flops(model, torch.arange(16), last_only=True)
    assert pre.bytes == weights + 16 * KV_FP32
    # The module's claim, ~2 FLOPs per 4-byte weight: measured 0.508 FLOP/byte at 100 cached tokens.
    assert 0.45 < dec.intensity < 0.55 and dec.intensity == dec.flops / dec.bytes
    assert costs.prefill_workload(model, 512).intensity > 100 * dec.intensity


# --- when a prefill turns compute-bound -------------------------------------------

def test_crossover_formula_and_datasheets():
    # Weights only: 2T FLOPs per weight over b bytes per weight reaches the ridge at T = ridge x b / 2.
    assert costs.crossover_tokens(300.0, 2) == 300.0 and costs.crossover_tokens(3.0, 4) == 6.0
    # H100 SXM datasheet: 1,979 TFLOP/s bf16 with 2:4 sparsity (989.4 dense), 3.35 TB/s HBM3.
    assert costs.H100_SXM.ridge == pytest.approx(1979e12 / 2 / 3.35e12, rel=1e-3)
    assert 295 < costs.crossover_tokens(costs.H100_SXM.ridge, 2) < 296
    # H200: the same compute, 4.8 TB/s HBM3e, so a lower ridge.
    assert costs.H200_SXM.peak_flops == costs.H100_SXM.peak_flops
    assert costs.H200_SXM.ridge == pytest.approx(989.4e12 / 4.8e12)
    for bad in ((0, 2), (3, 0)):
        with pytest.raises(ValueError):
            costs.crossover_tokens(*bad)
    with pytest.raises(ValueError, match="bandwidth"):
        costs.ridge_point(1e12, 0)


def test_prefill_intensity_is_the_workloads(model):
    c, kv = model.config, costs.kv_bytes_per_token(model.config, 4)
    for n in (1, 7, 300):
        assert costs.prefill_intensity(c, n, model.weight_nbytes, kv) == \
            pytest.approx(costs.prefill_workload(model, n).intensity, rel=1e-12)
    assert costs.prefill_intensity(c, 8, model.weight_nbytes, kv, batch_size=4) == \
        pytest.approx(costs.prefill_workload(model, 8, batch_size=4).intensity, rel=1e-12)


@pytest.mark.parametrize("ridge", [1.5, 3.0, 50.0, 295.3])
def test_prefill_crossover_is_the_first_length_past_the_ridge(model, ridge):
    c, kv = model.config, costs.kv_bytes_per_token(model.config, 4)
    n = costs.prefill_crossover_tokens(c, ridge, model.weight_nbytes, kv)
    assert costs.prefill_intensity(c, n, model.weight_nbytes, kv) >= ridge
    assert n == 1 or costs.prefill_intensity(c, n - 1, model.weight_nbytes, kv) < ridge
    # Above the formula's weights-only estimate: the LM head (21% of the weights) is read in full
    # but multiplies the last position only, and the KV bytes add a little.
    approx = costs.crossover_tokens(ridge, 4)
    assert approx <= n <= 1.5 * approx + 1
    # Four prompts in one pass share the weight reads: each needs about a quarter of the tokens
    # (a little more: each sequence's KV bytes are its own).
    n4 = costs.prefill_crossover_tokens(c, ridge, model.weight_nbytes, kv, batch_size=4)
    assert 0.8 * n / 4 - 1 <= n4 <= 1.2 * n / 4 + 1


def test_prefill_crossover_out_of_reach_and_bad_input(model):
    c, kv = model.config, costs.kv_bytes_per_token(model.config, 4)
    assert costs.prefill_crossover_tokens(c, 1e6, model.weight_nbytes, kv) is None
    assert costs.prefill_crossover_tokens(c, 0.1, model.weight_nbytes, kv) == 1   # even one token passes
    with pytest.raises(ValueError, match="ridge"):
        costs.prefill_crossover_tokens(c, 0, model.weight_nbytes, kv)
    with pytest.raises(ValueError, match="batch_size"):
        costs.prefill_crossover_tokens(c, 3, model.weight_nbytes, kv, batch_size=0)
