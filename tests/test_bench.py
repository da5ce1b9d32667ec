"""The benchmark's helpers: the report's arithmetic is right, and one tiny run
goes end to end. No timing assertions: the machine may be busy. (The device
probes it calls are tested in test_timing.py.)"""

import json

import pytest
import torch

import labkit
from labkit import bench, costs


def fake_measurements():
    return {
        "bandwidth": {"read": 10e9, "copy": 8e9},
        "flops": {"fp32": 1e11},
        "new_tokens": 10,
        "engines": {
            "labkit fp32": {"precision": "fp32", "kind": "labkit", "weight_nbytes": 400_000_000,
                            "kv_bytes_per_token": 1000,
                            "runs": {5: [{"ttft_s": 0.010, "tpot_s": 0.040},
                                         {"ttft_s": 0.030, "tpot_s": 0.050},
                                         {"ttft_s": 0.020, "tpot_s": 0.045}]}},
            "transformers fp32": {"precision": "fp32", "kind": "transformers", "weight_nbytes": 400_000_000,
                                  "kv_bytes_per_token": 1000,
                                  "runs": {5: [{"ttft_s": 0.040, "tpot_s": 0.090},
                                               {"ttft_s": 0.040, "tpot_s": 0.090}]}},
        },
        "pairs": [("labkit fp32", "transformers fp32", "labkit / transformers, fp32")],
        "nocache": {"length": 512, "engine": "labkit fp32", "cache": [0.04, 0.05, 0.06],
                    "nocache": [1.0, 2.0, 0.5]},
    }


def test_report_medians_ratios_and_utilisation():
    report = bench.build_report(fake_measurements())
    lab = next(r for r in report["rows"] if r["engine"] == "labkit fp32")
    assert lab["ttft_ms"] == pytest.approx(20.0) and lab["tpot_ms"] == pytest.approx(45.0)
    nbytes = 400_000_000 + 1000 * (5 + 10 // 2)       # weights + K/V of the median step's context
    assert lab["bytes_per_token"] == nbytes == costs.forward_bytes(400_000_000, 1000, 5 + 10 // 2)
    assert lab["utilisation"] == pytest.approx(nbytes / 0.045 / 10e9)
    (ratio,) = report["ratios"]
    # per round: 40/90 and 50/90 (the third labkit round has no partner); median of the two
    assert ratio["tpot_ratio"] == pytest.approx((40 / 90 + 50 / 90) / 2)
    assert ratio["tpot_ratio_range"] == pytest.approx((40 / 90, 50 / 90))
    assert ratio["ttft_ratio"] == pytest.approx((10 / 40 + 30 / 40) / 2)
    assert report["nocache"]["speedup"] == pytest.approx(1.0 / 0.05)


def test_format_report_mentions_everything():
    info = {"device_name": "test CPU", "threads": 2, "torch": "x", "transformers": "y",
            "load_before": "1.0", "load_after": "1.0", "bandwidth": {"read": 1e10, "copy": 8e9},
            "flops": {"fp32": 1e11}, "quality": [{"engine": "labkit int8", "text": "KL mean 0.01"}],
            "notes": ["a note"]}
    text = bench.format_report(info, bench.build_report(fake_measurements()))
    for needle in ("10.0 GB/s", "labkit / transformers, fp32", "x0.50 [0.44-0.56]", "x20", "KL mean 0.01", "a note"):
        assert needle in text, needle


def test_prompt_ids_have_the_asked_length(model):
    for n in (5, 128):
        assert len(bench.prompt_ids(model, n)) == n


def test_tiny_run_end_to_end(model, tmp_path):
    """The smallest real run: fp32 and int8, one prompt length, two rounds."""
    info, report = bench.run(precisions=("fp32", "int8"), lengths=(5,), new_tokens=3, rounds=1,
                             device="cpu", with_llama_cpp=False, bandwidth_nbytes=8 << 20,
                             quality_prompts=1, log=lambda *_: None)
    engines = {r["engine"] for r in report["rows"]}
    assert engines == {"labkit fp32", "transformers fp32", "labkit int8"}
    assert all(r["tpot_ms"] > 0 and r["ttft_ms"] > 0 for r in report["rows"])
    assert {r["label"] for r in report["ratios"]} == {"labkit / transformers, fp32"}
    assert report["nocache"]["speedup"] > 0
    assert [q["engine"] for q in info["quality"]] == ["labkit int8"]
    assert not [n for n in info["notes"] if "differ" in n]     # greedy tokens agreed
    text = bench.format_report(info, report)
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"info": info, "report": report}, default=str))
    assert "labkit int8" in text and json.loads(path.read_text())["report"]["rows"]
