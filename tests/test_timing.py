"""labkit.timing: the clock and the roofs, never the timing values.

Timings depend on the machine and its load, so these tests check what holds
everywhere: the clock waits for a GPU before and after the timed call, setup
and warm-up stay outside the timed region, the median is a time that was
measured, and the roofs divide the right amount of work by the fastest run.
"""

import statistics

import pytest
import torch

import labkit
from labkit import timing
from tiny_models import tiny_hf_model


# --- labels ---------------------------------------------------------------------

def test_device_label_names_device_threads_and_dtype():
    tiny = labkit.Model(tiny_hf_model("llama"))
    label = timing.device_label(tiny)
    assert label.startswith("cpu (") and f"{torch.get_num_threads()} threads" in label
    assert label.endswith("torch.float32")
    assert timing.device_label("cpu") == timing.device_name("cpu")


# --- the clock ------------------------------------------------------------------

def test_sync_waits_for_cuda(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    timing.sync("cpu")
    assert calls == []
    timing.sync("cuda:0")
    assert calls == [torch.device("cuda:0")]


def test_median_is_a_measured_value():
    assert timing.median([0.3, 0.1, 0.2]) == 0.2
    assert timing.median([0.9, 0.05, 0.06, 0.07, 0.04]) == 0.06        # robust to the one slow 0.9
    assert timing.median([0.4, 0.1, 0.3, 0.2]) == 0.3                  # even count: the upper middle,
    assert timing.median([0.4, 0.1, 0.3, 0.2]) != statistics.median([0.4, 0.1, 0.3, 0.2])  # not a mean
    assert timing.median(iter([2.0])) == 2.0                           # any iterable
    assert timing.median([]) != timing.median([])                      # nothing measured: NaN


def test_time_fn_runs_setup_outside_each_timed_call(monkeypatch):
    events = []
    synced = []
    monkeypatch.setattr(timing, "sync", lambda device: synced.append(str(device)))
    t, result = timing.time_fn(lambda: events.append("call") or len(events), "cuda", repeats=3,
                               warmup=2, setup=lambda: events.append("setup"))
    assert events == ["setup", "call"] * 5
    assert len(t.samples) == 3 and all(s >= 0 for s in t.samples)
    assert t.median == statistics.median(t.samples) and t.min == min(t.samples)
    assert result == 10                        # the last call's result
    assert synced == ["cuda"] * 6              # before and after each timed call
    with pytest.raises(ValueError):
        timing.time_fn(lambda: None, "cpu", repeats=0)


def test_timing_median_is_timing_median():
    t = timing.Timing([0.5, 0.25, 2.0, 1.0])
    assert t.median == timing.median(t.samples) == 1.0 and t.min == 0.25
    assert "1000.00 ms over 4 repeats" in repr(t)


def test_warm_up_on_accelerators_only(monkeypatch):
    monkeypatch.setattr(timing, "sync", lambda device: None)
    for device, calls_expected in (("cpu", 2), ("cuda", 3)):
        calls = []
        timing.time_fn(lambda: calls.append(1), device, repeats=2)
        assert len(calls) == calls_expected


# --- the roofs ------------------------------------------------------------------

def test_roofs_are_plausible():
    # Real measurements: plausible for any machine (a unit slip, bits or GB, is off by 8x or 1e9x).
    assert 1e8 < timing.read_bandwidth("cpu", nbytes=4 * 2**20, repeats=2) < 1e13
    assert 1e8 < timing.copy_bandwidth("cpu", nbytes=4 * 2**20, repeats=2) < 1e13
    assert 1e7 < timing.matmul_flops_per_s("cpu", torch.float32, n=64, repeats=2) < 1e15
    assert timing.matmul_flops_per_s("cpu", torch.bfloat16, n=128, repeats=2) > 1e7


def test_roofs_divide_the_work_by_the_fastest_run(monkeypatch):
    """Read bandwidth is bytes read / the fastest run; copy counts bytes read and
    written; matmul FLOP/s is 2 n^3 / the fastest run."""
    runs = []

    def fake_time_fn(fn, device, repeats=3, warmup=None, setup=None):
        runs.append(fn())
        return timing.Timing([0.5, 0.25, 2.0]), runs[-1]

    monkeypatch.setattr(timing, "time_fn", fake_time_fn)
    assert timing.read_bandwidth("cpu", nbytes=4 * 1000) == 4000 / 0.25
    assert float(runs[-1]) == 1000                       # it summed 1000 fp32 ones: every byte read
    assert timing.copy_bandwidth("cpu", nbytes=4 * 1000) == 2 * 4000 / 0.25
    assert runs[-1].shape == (1000,) and bool((runs[-1] == 1).all())   # the copy arrived
    assert timing.matmul_flops_per_s("cpu", torch.float32, n=16) == 2 * 16**3 / 0.25
    assert runs[-1].shape == (16, 16)


def test_timing_imports_no_plotting():
    """The engine imports labkit.timing (Generation.tpot_s): it must stay free of plotly."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(timing))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert not any(name.startswith(("plotly", "ipywidgets", "matplotlib")) for name in imported)


def test_percentile_nearest_rank_by_hand():
    """Nearest rank: the ceil(q/100 x n)-th smallest, always a measured value."""
    values = [5, 1, 4, 2, 3, 10, 9, 8, 7, 6]          # 1..10, shuffled
    assert timing.percentile(values, 50) == 5
    assert timing.percentile(values, 90) == 9
    assert timing.percentile(values, 91) == 10          # ceil(9.1) = 10th
    assert timing.percentile(values, 0) == 1 and timing.percentile(values, 100) == 10
    assert timing.percentile(range(1, 101), 7) == 7     # 7% of 100 is exactly the 7th, not the 8th
    assert timing.percentile([], 50) != timing.percentile([], 50)        # NaN
    with pytest.raises(ValueError, match="q must be"):
        timing.percentile(values, 101)
