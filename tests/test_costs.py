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
