"""labkit.measure: the structure of what it returns, never the timing values.

Timings depend on the machine and its load, so these tests check only what
holds everywhere: the shapes of the results, that they carry the device they
ran on, that the tokens with and without the KV cache are the same, and that
bad arguments are refused (the clock is tested in test_timing.py). The sweeps
run on a tiny random model (no download) at tiny sizes, to keep the tests fast.
"""

import pytest
import torch

import labkit
from labkit import charts, costs, measure, timing
from tiny_models import tiny_hf_model


@pytest.fixture(scope="module")
def tiny():
    return labkit.Model(tiny_hf_model("llama"))


# The tiny llama counted by hand from tiny_models.py: 3 layers, d_model 64, 8 query and
# 2 KV heads of size 8, d_ff 160, vocab 211, LM head not tied to the embedding; fp32.
TINY_KV = 2 * 3 * 2 * 8 * 4                                   # K and V bytes per token: 384
TINY_BLOCKS = 3 * (2 * 64 * 64 + 2 * 64 * 16 + 3 * 64 * 160)   # q, o; k, v; gate, up, down
TINY_READ = TINY_BLOCKS + 3 * 2 * 64 + 64 + 211 * 64           # + norms + LM head (no embedding)


def tiny_prefill_flops(n):
    """2 per weight per token, attention 4 x head size per causal key per head, LM head once."""
    return 2 * TINY_BLOCKS * n + 3 * 8 * 4 * 8 * n * (n + 1) // 2 + 2 * 64 * 211


def tiny_weight_bytes(tiny):
    """Hand-counted weights in fp32, plus the real bytes of the model's buffers (RoPE's frequencies)."""
    return 4 * TINY_READ + sum(b.numel() * b.element_size() for b in tiny.hf.buffers())


# --- a prompt of any length ------------------------------------------------------

def test_long_prompt_ids(model):
    ids = measure.long_prompt_ids(model)
    assert ids.dim() == 1 and len(ids) > 256
    assert measure.long_prompt_ids(model, 100).tolist() == ids[:100].tolist()
    longer = measure.long_prompt_ids(model, len(ids) + 10)
    assert longer[len(ids):].tolist() == ids[:10].tolist()  # repeated from the start
    with pytest.raises(ValueError):
        measure.long_prompt_ids(model, 0)


# --- with and without the KV cache ---------------------------------------------

def test_generation_same_tokens_with_and_without_cache(model):
    with_cache = measure.time_generation(model, "The capital of France is", 6, use_cache=True)
    without = measure.time_generation(model, "The capital of France is", 6, use_cache=False)
    assert with_cache.token_ids == without.token_ids and len(with_cache.token_ids) == 6
    assert with_cache.text.startswith(" Paris")
    assert with_cache.use_cache and not without.use_cache
    assert with_cache.device == timing.device_label(model)
    assert len(with_cache.step_seconds) == 6
    assert with_cache.gen.steps[-1].cache_len == 5 + 6 - 1      # 5 prompt tokens, the last token not yet fed
    assert without.gen.steps[-1].cache_len == 0


def test_cache_speedup_structure(tiny):
    ids = torch.arange(3, 40)
    s = measure.cache_speedup(tiny, ids, [2, 8, 32], repeats=2)
    assert s.lengths == [2, 8, 32] and s.repeats == 2 and s.device == timing.device_label(tiny)
    assert len(s.with_cache_s) == len(s.without_cache_s) == len(s.speedup) == 3
    assert all(t > 0 for t in s.with_cache_s + s.without_cache_s)
    assert s.same_token == [True, True, True]
    # Speed-up is time without the cache over time with it; rows are in milliseconds.
    assert s.speedup == [w / c for w, c in zip(s.without_cache_s, s.with_cache_s)]
    assert s.rows()[1] == (8, s.with_cache_s[1] * 1e3, s.without_cache_s[1] * 1e3, s.speedup[1])
    with pytest.raises(ValueError):
        measure.cache_speedup(tiny, ids, [1])
    with pytest.raises(ValueError):
        measure.cache_speedup(tiny, ids, [len(ids) + 1])


# --- prefill and batch sweeps ---------------------------------------------------

def test_prefill_sweep_keeps_the_fastest_run_and_the_old_name(tiny):
    s = measure.prefill_sweep(tiny, torch.arange(3, 40), [1, 8], repeats=3)
    assert len(s.min_seconds) == 2 and all(0 < m <= t for m, t in zip(s.min_seconds, s.seconds))
    # The old names still work: they time the prefill (TTFT also counts tokenization and set-up).
    assert measure.ttft_sweep is measure.prefill_sweep and measure.TTFTSweep is measure.PrefillSweep


def test_generation_timing_keeps_the_names_apart(model):
    t = measure.time_generation(model, "The capital of France is", 4)
    g = t.gen
    assert t.ttft_s == g.ttft_s and t.prefill_s == g.prefill_s and t.e2e_s == g.e2e_s and t.tpot_s == g.tpot_s
    assert t.ttft_s >= g.tokenize_s + t.prefill_s and t.e2e_s > t.ttft_s
    assert t.total_s >= t.e2e_s                                 # the whole call, timed from outside


def test_ttft_sweep(tiny):
    s = measure.ttft_sweep(tiny, torch.arange(3, 40), [1, 8, 32], repeats=1)
    assert s.cache_nbytes == [n * TINY_KV for n in (1, 8, 32)]
    assert s.flops == [tiny_prefill_flops(n) for n in (1, 8, 32)] == [273_536, 2_020_736, 8_296_832]
    assert s.flops_per_s == [f / t for f, t in zip(s.flops, s.seconds)]
    assert len(s.seconds) == len(s.ms_per_token) == len(s.flops_per_s) == 3
    assert "cpu" in s.device
    fig = charts.prefill_chart(s)
    assert list(fig.data[0].x) == [1, 8, 32] and s.device in fig.layout.title.text


def test_batch_sweep(tiny):
    s = measure.batch_sweep(tiny, [1, 2, 4], prompt_len=4, context=16, repeats=1)
    assert s.batch_sizes == [1, 2, 4] and s.prompt_len == 4 and s.context == 16
    assert len(s.prefill_s) == len(s.decode_s) == len(s.decode_tokens_per_s) == 3
    # Weights are read once per step, whatever the batch; each sequence adds its own cache.
    kv = TINY_KV * 17                                      # 16 cached + the new token
    assert s.decode_kv_bytes == [kv, 2 * kv, 4 * kv]
    weights = tiny_weight_bytes(tiny)
    assert s.decode_bytes == [weights + b * kv for b in (1, 2, 4)]
    assert s.kv_fraction == pytest.approx([b * kv / (weights + b * kv) for b in (1, 2, 4)], rel=1e-12)
    assert s.device == timing.device_label(tiny)
    # The fastest step of each batch size, and the throughput it gives.
    assert all(0 < m <= t for m, t in zip(s.decode_min_s + s.prefill_min_s, s.decode_s + s.prefill_s))
    assert s.decode_tokens_per_s_best == [b / m for b, m in zip((1, 2, 4), s.decode_min_s)]
    fig = charts.batch_chart(s)
    assert list(fig.data[1].x) == ["1", "2", "4"] and s.device in fig.layout.title.text
    with pytest.raises(ValueError):
        measure.batch_sweep(tiny, [1], context=tiny.config.max_len)


# --- the roofline ---------------------------------------------------------------

def test_roofline_points_are_well_formed(tiny):
    work = costs.decode_workload(tiny, 10)
    # Decode with 10 cached tokens, by hand: 2 per block weight, 4 x 8 per key (11 keys) per
    # head and layer, the LM head once; bytes: the weights and 11 tokens' K and V.
    flops = 2 * TINY_BLOCKS + 3 * 8 * 4 * 8 * 11 + 2 * 64 * 211
    nbytes = tiny_weight_bytes(tiny) + 11 * TINY_KV
    point = measure.roofline_point(work, 0.5)
    assert point == {"name": "decode step", "intensity": pytest.approx(flops / nbytes, rel=1e-12),
                     "flops_per_s": 2 * flops}
    assert measure.roofline_point(work, 1.0, name="decode")["name"] == "decode"
