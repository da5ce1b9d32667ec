"""The FLOP formulas against PyTorch's own FLOP counter running labkit's forward."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import labkit
from labkit import perf
from tiny_models import tiny_hf_model


def counted_flops(model, ids, cache=None):
    with FlopCounterMode(display=False) as counter:
        model.forward(ids, cache=cache)
    return counter.get_total_flops()


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_prefill_flops_match_counter(kind):
    m = labkit.Model(tiny_hf_model(kind))
    m.attention = "manual"          # plain matmuls, which the counter sees
    ids = torch.arange(24)
    # The by-hand attention multiplies the full (T x T) score matrix, masked
    # afterwards, so it does T*T key products rather than the causal T(T+1)/2.
    c = m.config
    full_square = perf.forward_flops(c, 24) + c.n_layers * c.n_heads * 4 * c.head_dim * (24 * 24 - 24 * 25 // 2)
    assert counted_flops(m, ids) == full_square


def test_decode_flops_match_counter():
    m = labkit.Model(tiny_hf_model("llama"))
    m.attention = "manual"
    cache = m.new_cache(max_len=64)
    m.forward(torch.arange(30), cache=cache)
    assert counted_flops(m, torch.tensor([5]), cache) == perf.forward_flops(m.config, 1, n_cached=30)


def test_default_model_workloads(model):
    c = model.config
    assert perf.matmul_params(c) == model.n_params - c.n_layers * 2 * c.d_model - c.d_model  # minus norms
    dec = perf.decode_workload(model, n_cached=100)
    pre = perf.prefill_workload(model, 512)
    assert 0.4 < dec.intensity < 0.6          # ~2 FLOPs per 4-byte weight
    assert pre.intensity > 100 * dec.intensity
    assert perf.kv_bytes_per_token(c, 4) == model.new_cache(8).bytes_per_token
