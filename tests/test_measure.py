"""labkit.measure: the structure of what it returns, never the timing values.

Timings depend on the machine and its load, so these tests check only what
holds everywhere: the shapes of the results, that they carry the device they
ran on, that the tokens with and without the KV cache are the same, that the
clock waits for a GPU, and that bad arguments are refused. The sweeps run on
a tiny random model (no download) at tiny sizes, to keep the tests fast.
"""

import statistics

import pytest
import torch

import labkit
from labkit import measure, perf
from tiny_models import tiny_hf_model


@pytest.fixture(scope="module")
def tiny():
    return labkit.Model(tiny_hf_model("llama"))


# --- labels and the clock ------------------------------------------------------

def test_device_label_names_device_threads_and_dtype(tiny):
    label = measure.device_label(tiny)
    assert label.startswith("cpu (") and f"{torch.get_num_threads()} threads" in label
    assert label.endswith("torch.float32")
    assert measure.device_label("cpu") == measure.device_name("cpu")


def test_sync_waits_for_cuda(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    measure.sync("cpu")
    assert calls == []
    measure.sync("cuda:0")
    assert calls == [torch.device("cuda:0")]


def test_time_fn_runs_setup_outside_each_timed_call(monkeypatch):
    events = []
    synced = []
    monkeypatch.setattr(measure, "sync", lambda device: synced.append(str(device)))
    timing, result = measure.time_fn(lambda: events.append("call") or len(events), "cuda", repeats=3,
                                     warmup=2, setup=lambda: events.append("setup"))
    assert events == ["setup", "call"] * 5
    assert len(timing.samples) == 3 and all(s >= 0 for s in timing.samples)
    assert timing.median == statistics.median(timing.samples) and timing.min == min(timing.samples)
    assert result == 10                        # the last call's result
    assert synced == ["cuda"] * 6              # before and after each timed call
    with pytest.raises(ValueError):
        measure.time_fn(lambda: None, "cpu", repeats=0)


def test_warm_up_on_accelerators_only(monkeypatch):
    monkeypatch.setattr(measure, "sync", lambda device: None)
    for device, calls_expected in (("cpu", 2), ("cuda", 3)):
        calls = []
        measure.time_fn(lambda: calls.append(1), device, repeats=2)
        assert len(calls) == calls_expected


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
    assert with_cache.device == measure.device_label(model)
    assert len(with_cache.step_seconds) == 6
    assert with_cache.gen.steps[-1].cache_len == 5 + 6 - 1      # 5 prompt tokens, the last token not yet fed
    assert without.gen.steps[-1].cache_len == 0


def test_cache_speedup_structure(tiny):
    ids = torch.arange(3, 40)
    s = measure.cache_speedup(tiny, ids, [2, 8, 32], repeats=2)
    assert s.lengths == [2, 8, 32] and s.repeats == 2 and s.device == measure.device_label(tiny)
    assert len(s.with_cache_s) == len(s.without_cache_s) == len(s.speedup) == 3
    assert all(t > 0 for t in s.with_cache_s + s.without_cache_s)
    assert s.same_token == [True, True, True]
    assert [r[0] for r in s.rows()] == [2, 8, 32]
    with pytest.raises(ValueError):
        measure.cache_speedup(tiny, ids, [1])
    with pytest.raises(ValueError):
        measure.cache_speedup(tiny, ids, [len(ids) + 1])


# --- prefill and batch sweeps ---------------------------------------------------

def test_ttft_sweep(tiny):
    s = measure.ttft_sweep(tiny, torch.arange(3, 40), [1, 8, 32], repeats=1)
    per_token = tiny.new_cache(1).bytes_per_token
    assert s.cache_nbytes == [n * per_token for n in (1, 8, 32)]
    assert s.flops == [perf.prefill_workload(tiny, n).flops for n in (1, 8, 32)]
    assert len(s.seconds) == len(s.ms_per_token) == len(s.flops_per_s) == 3
    assert "cpu" in s.device
    fig = measure.ttft_chart(s)
    assert list(fig.data[0].x) == [1, 8, 32] and s.device in fig.layout.title.text


def test_batch_sweep(tiny):
    s = measure.batch_sweep(tiny, [1, 2, 4], prompt_len=4, context=16, repeats=1)
    assert s.batch_sizes == [1, 2, 4] and s.prompt_len == 4 and s.context == 16
    assert len(s.prefill_s) == len(s.decode_s) == len(s.decode_tokens_per_s) == 3
    # Weights are read once per step, whatever the batch; each sequence adds its own cache.
    kv = perf.kv_bytes_per_token(tiny.config, 4) * 17
    assert s.decode_kv_bytes == [kv, 2 * kv, 4 * kv]
    assert s.decode_bytes == [tiny.weight_nbytes + b * kv for b in (1, 2, 4)]
    assert 0 < s.kv_fraction[0] < s.kv_fraction[1] < s.kv_fraction[2] < 1
    assert s.device == measure.device_label(tiny)
    fig = measure.batch_chart(s)
    assert list(fig.data[1].x) == ["1", "2", "4"] and s.device in fig.layout.title.text
    with pytest.raises(ValueError):
        measure.batch_sweep(tiny, [1], context=tiny.config.max_len)


# --- the roofline ---------------------------------------------------------------

def test_roofline_numbers_are_positive_and_points_well_formed(tiny):
    assert measure.measure_bandwidth("cpu", nbytes=4 * 2**20, repeats=2) > 0
    assert measure.measure_matmul_flops("cpu", torch.float32, n=64, repeats=2) > 0
    work = perf.decode_workload(tiny, 10)
    point = measure.roofline_point(work, 0.5)
    assert point == {"name": work.name, "intensity": work.intensity, "flops_per_s": work.flops / 0.5}
    assert measure.roofline_point(work, 1.0, name="decode")["name"] == "decode"
