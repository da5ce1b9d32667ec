"""Benchmark: labkit against transformers, in one run, on whatever device is here.

    python -m labkit.bench                  # the full run (a few minutes on a 2-core CPU)
    python -m labkit.bench --quick          # shorter: fewer lengths, tokens and rounds
    python -m labkit.bench --json out.json  # also write every number

What it measures, all in the same process so the numbers share a machine state:

1. The device: memory bandwidth (summing and copying a tensor larger than any
   cache) and matmul FLOP/s, the two roofs of the roofline.
2. Greedy generation at several prompt lengths, for each precision: labkit's
   `generate` against transformers' `generate` on the same weights and dtype
   (fp32, bf16); labkit int8 and int4 (labkit.quantize) against labkit bf16.
   TTFT runs from the call with token ids (so no tokenization) to the first
   token; TPOT is the mean gap between tokens, (e2e - TTFT) / (N - 1), as
   labkit.Generation defines both; each is then the median over rounds.
3. Decode without a KV cache against with one, at the longest prompt.
4. The quality cost of int8 / int4 (KL divergence, greedy agreement).
5. On CUDA: the captured decode step (labkit.cuda_graphs.GraphDecoder).
6. On a CPU: llama.cpp on the same GGUF file, running its Q4_1 / Q8_0
   weights as stored (labkit runs them de-quantised), when llama-cpp-python
   is installed (a benchmark-only extra: pip install llama-cpp-python).

Other programs on the machine make timings noisy, so the engines take turns
within each round (labkit, transformers, labkit, ...) and the report gives
medians over rounds, and ratios of medians measured side by side.

Memory-bandwidth utilisation of a decode step = bytes it must read (every
weight once, plus the cached K and V) / TPOT / the bandwidth measured above.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

import torch

from . import costs, timing
from .timing import median

GB = 1e9
FULL = dict(lengths=(5, 128, 512), new_tokens=32, rounds=5, nocache_tokens=4, quality_prompts=8)
QUICK = dict(lengths=(5, 512), new_tokens=12, rounds=3, nocache_tokens=3, quality_prompts=3)
PRECISIONS = ("fp32", "bf16", "int8", "int4")


# ----------------------------------------------------------------------------
# 1. The device
# ----------------------------------------------------------------------------
# The roofs are labkit.timing's probes (what notebook 07 shows), each the
# fastest of several tries: other programs can only slow a try down.

def measure_device(device: str | torch.device, bandwidth_nbytes: int | None = None) -> tuple[dict, dict]:
    """Memory bandwidth {"read", "copy"} (bytes/s) and matmul FLOP/s {"fp32", "bf16"}.

    bandwidth_nbytes must exceed the last-level cache, or the cache is what gets
    measured: 1 GiB on a CPU; on a GPU 4 GiB, its L2 being far smaller."""
    device = torch.device(device)
    nbytes = bandwidth_nbytes or ((1 << 30) if device.type == "cpu" else (4 << 30))
    bandwidth = {"read": timing.read_bandwidth(device, nbytes, repeats=7),
                 "copy": timing.copy_bandwidth(device, nbytes, repeats=7)}
    n = 2048 if device.type == "cpu" else 8192
    flops = {name: timing.matmul_flops_per_s(device, dtype, n) for name, dtype in
             (("fp32", torch.float32), ("bf16", torch.bfloat16))}
    return bandwidth, flops


# ----------------------------------------------------------------------------
# 2-3. Generation: one timed run of each engine
# ----------------------------------------------------------------------------

@dataclass
class EngineRun:
    """One timed greedy generation by one engine."""

    ttft_s: float
    tpot_s: float            # mean time per output token of this run
    token_ids: list[int] = field(default_factory=list)


def run_labkit(model, ids: list[int], new_tokens: int, use_cache: bool = True) -> EngineRun:
    from .generation import generate

    gen = generate(model, ids, new_tokens, use_cache=use_cache, stop_at_eos=False)
    return EngineRun(gen.ttft_s, gen.tpot_s, gen.token_ids)


def run_transformers(model, ids: list[int], new_tokens: int) -> EngineRun:
    """transformers' own generate on the same weights, greedy, timed at each step.

    A logits processor is called once per generated token, right after the
    forward pass that scores it: the gaps between calls are the decode steps."""
    from transformers import LogitsProcessor, LogitsProcessorList

    stamps: list[float] = []
    device = model.device

    class Clock(LogitsProcessor):
        def __call__(self, input_ids, scores):
            timing.sync(device)      # on a GPU, wait for the forward pass to finish
            stamps.append(time.perf_counter())
            return scores

    x = torch.tensor([ids], device=device)
    pad = model.tokenizer.pad_token_id if model.tokenizer is not None else None
    pad = pad if pad is not None else 0
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens,
                                min_new_tokens=new_tokens, do_sample=False, pad_token_id=pad,
                                logits_processor=LogitsProcessorList([Clock()]))
    # stamps[0] follows the prefill; stamps[k] - stamps[k-1] is decode step k
    # (with the sampling of the token before it, as labkit's steps have too).
    ttft = stamps[0] - t0
    # TPOT as labkit's Generation.tpot_s: the mean gap, (last - first) / (N - 1).
    tpot = (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else float("nan")
    return EngineRun(ttft, tpot, out[0, len(ids):].tolist())


def run_graph(decoder, ids: list[int], new_tokens: int) -> EngineRun:
    run = decoder.greedy(ids, new_tokens, warmup=False)
    return EngineRun(run.ttft_s, run.tpot_s, run.token_ids)


def run_llama_cpp(llm, ids: list[int], new_tokens: int) -> EngineRun:
    """llama.cpp through llama-cpp-python: eval the prompt, then one token at a time."""
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    token = llm.sample(temp=0.0)
    ttft = time.perf_counter() - t0
    tokens, steps = [token], []
    for _ in range(new_tokens - 1):
        t0 = time.perf_counter()
        llm.eval([token])
        token = llm.sample(temp=0.0)
        steps.append(time.perf_counter() - t0)
        tokens.append(token)
    return EngineRun(ttft, sum(steps) / len(steps) if steps else float("nan"), tokens)


def prompt_ids(model, length: int) -> list[int]:
    """A fixed English prompt cut to exactly `length` tokens."""
    from .encoding import encode

    text = " ".join(f"Note {i}: the capital of France is Paris, and water boils at 100 degrees."
                    for i in range(length // 8 + 2))
    ids = encode(model, text).ids.tolist()
    if len(ids) < length:
        raise ValueError(f"prompt too short for {length} tokens")
    return ids[:length]


# ----------------------------------------------------------------------------
# The report: medians, ratios, utilisation (pure arithmetic, tested)
# ----------------------------------------------------------------------------

def build_report(measured: dict) -> dict:
    """Turn raw measurements into medians, ratios and utilisation.

    measured = {
      "bandwidth": {"read": B/s, ...}, "flops": {...},
      "engines": {name: {"precision", "kind" ("labkit"/"transformers"/...),
                         "weight_nbytes", "kv_bytes_per_token",
                         "runs": {length: [{"ttft_s", "tpot_s"}, ...]}}},
      "pairs": [(name, baseline, label), ...],        # ratio name / baseline
      "nocache": {"length", "cache": [tpot...], "nocache": [tpot...]} (optional),
      "new_tokens": n,
    }
    """
    bandwidth = measured["bandwidth"]["read"]
    new_tokens = measured.get("new_tokens", 0)
    rows = []
    summary: dict[str, dict] = {}
    for name, e in measured["engines"].items():
        summary[name] = {}
        for length, runs in sorted(e["runs"].items(), key=lambda kv: int(kv[0])):
            ttft = median(r["ttft_s"] for r in runs)
            tpot = median(r["tpot_s"] for r in runs)
            context = int(length) + new_tokens // 2      # the average decode step's context
            nbytes = costs.forward_bytes(e["weight_nbytes"], e["kv_bytes_per_token"], context)
            row = {"engine": name, "precision": e["precision"], "length": int(length),
                   "ttft_ms": ttft * 1e3, "tpot_ms": tpot * 1e3, "tokens_per_s": 1 / tpot,
                   "bytes_per_token": nbytes, "achieved_GBps": nbytes / tpot / GB,
                   "utilisation": nbytes / tpot / bandwidth, "rounds": len(runs),
                   "ttft_ms_each": [r["ttft_s"] * 1e3 for r in runs],
                   "tpot_ms_each": [r["tpot_s"] * 1e3 for r in runs]}
            rows.append(row)
            summary[name][int(length)] = row
    # A ratio is taken within each round (the two engines ran one after the other,
    # so a slow spell of a shared machine hits both), then the median over the
    # rounds; the range shows how much the rounds disagreed. A ratio is not a
    # time, so its median is the usual one (the mean of the middle two for an
    # even count), not labkit.timing.median.
    ratios = []
    for name, base, label in measured.get("pairs", []):
        for length in summary.get(name, {}):
            if length in summary.get(base, {}):
                a, b = summary[name][length], summary[base][length]
                entry = {"label": label, "engine": name, "baseline": base, "length": length}
                for key in ("ttft", "tpot"):
                    each = [x / y for x, y in zip(a[f"{key}_ms_each"], b[f"{key}_ms_each"])]
                    entry[f"{key}_ratio"] = statistics.median(each)
                    entry[f"{key}_ratio_range"] = (min(each), max(each))
                ratios.append(entry)
    report = {"rows": rows, "ratios": ratios}
    nc = measured.get("nocache")
    if nc:
        with_cache, without = median(nc["cache"]), median(nc["nocache"])
        report["nocache"] = {"length": nc["length"], "engine": nc.get("engine", ""),
                             "cache_tpot_ms": with_cache * 1e3, "nocache_tpot_ms": without * 1e3,
                             "speedup": without / with_cache}
    return report


def format_report(info: dict, report: dict) -> str:
    lines = []
    bw, fl = info["bandwidth"], info["flops"]
    lines.append(f"device: {info['device_name']}; torch {info['torch']}, "
                 f"transformers {info['transformers']}; load average {info['load_before']} -> {info['load_after']}")
    lines.append(f"memory bandwidth: read {bw['read'] / GB:.1f} GB/s, copy {bw['copy'] / GB:.1f} GB/s;  "
                 f"matmul: " + ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in fl.items()))
    lines.append("")
    lines.append(f"{'engine':<22}{'prompt':>7}{'TTFT ms':>10}{'TPOT ms':>10}{'tok/s':>8}"
                 f"{'MB/token':>10}{'GB/s':>7}{'util':>7}")
    for r in report["rows"]:
        lines.append(f"{r['engine']:<22}{r['length']:>7}{r['ttft_ms']:>10.1f}{r['tpot_ms']:>10.2f}"
                     f"{r['tokens_per_s']:>8.1f}{r['bytes_per_token'] / 1e6:>10.0f}{r['achieved_GBps']:>7.1f}"
                     f"{r['utilisation']:>7.0%}")
    lines.append("")
    lines.append("ratios (each round's ratio, median over the rounds [lowest-highest]; < 1: the first is faster)")
    for r in report["ratios"]:
        (tl, th), (pl, ph) = r["ttft_ratio_range"], r["tpot_ratio_range"]
        lines.append(f"  {r['label']:<38} prompt {r['length']:>4}:  TTFT x{r['ttft_ratio']:.2f} [{tl:.2f}-{th:.2f}]"
                     f"   TPOT x{r['tpot_ratio']:.2f} [{pl:.2f}-{ph:.2f}]")
    nc = report.get("nocache")
    if nc:
        lines.append("")
        lines.append(f"no cache vs cache, {nc['engine']}, {nc['length']}-token prompt: TPOT "
                     f"{nc['nocache_tpot_ms']:.0f} ms vs {nc['cache_tpot_ms']:.1f} ms = x{nc['speedup']:.0f}")
    for q in info.get("quality", []):
        lines.append(f"quality {q['engine']}: {q['text']}")
    for note in info.get("notes", []):
        lines.append(f"note: {note}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------

def _load_engines(device: str, precisions, with_transformers: bool, log):
    """name -> (kind, precision, runner, model-like object for bytes)."""
    from . import load_model
    from .quantize import quantize

    engines = {}
    base = None
    for p in precisions:
        if p in ("fp32", "bf16", "fp16"):
            m = load_model(device=device, dtype=p, progress=False)
            engines[f"labkit {p}"] = ("labkit", p, m)
            if with_transformers:
                engines[f"transformers {p}"] = ("transformers", p, m)
            if p == "fp32":
                base = m
        else:
            source = base or load_model(device=device, dtype="fp32", progress=False)
            t0 = time.perf_counter()
            engines[f"labkit {p}"] = ("labkit", p, quantize(source, p))
            log(f"quantized to {p} in {time.perf_counter() - t0:.1f} s")
    return engines


def _llama_cpp(threads: int, n_ctx: int, log):
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    from .loading import default_gguf_file

    path = default_gguf_file()
    log(f"llama.cpp: {path.name}")
    return Llama(model_path=str(path), n_ctx=n_ctx, n_batch=512, n_threads=threads, verbose=False)


def run(quick: bool = False, device: str | None = None, precisions=None, lengths=None,
        new_tokens: int | None = None, rounds: int | None = None, with_transformers: bool = True,
        with_llama_cpp: bool = True, bandwidth_nbytes: int | None = None,
        quality_prompts: int | None = None, log=print) -> tuple[dict, dict]:
    """Measure everything; return (info, report). Arguments left None take
    the defaults of a full run (or of --quick)."""
    import transformers

    from .cuda_graphs import GraphDecoder
    from .loading import default_device

    cfg = dict(QUICK if quick else FULL)
    cfg.update({k: v for k, v in dict(lengths=lengths, new_tokens=new_tokens, rounds=rounds,
                                      quality_prompts=quality_prompts).items() if v})
    device = device or default_device()
    dev = torch.device(device)
    if precisions is None:
        # On a GPU the quantized layers de-quantize on every call (no fast kernel
        # is wired up there), so they are measured only when asked for.
        precisions = PRECISIONS if dev.type == "cpu" else ("fp32", "bf16")
    info = {"device": device, "threads": torch.get_num_threads(), "torch": torch.__version__,
            "transformers": transformers.__version__, "quick": quick, "config": cfg, "notes": [],
            "load_before": _load(), "python": platform.python_version()}
    info["device_name"] = timing.device_name(dev)

    log("measuring the device ...")
    info["bandwidth"], info["flops"] = measure_device(dev, bandwidth_nbytes)

    engines = _load_engines(device, precisions, with_transformers, log)
    runners = {}
    for name, (kind, p, m) in engines.items():
        runners[name] = run_transformers if kind == "transformers" else run_labkit
    graph_decoders = {}
    if dev.type == "cuda":
        for name, (kind, p, m) in list(engines.items()):
            if kind == "labkit":
                gname = f"labkit {p} graph"
                graph_decoders[gname] = GraphDecoder(m, max_len=max(cfg["lengths"]) + cfg["new_tokens"] + 1)
                engines[gname] = ("graph", p, m)
                runners[gname] = (lambda dec: lambda _m, ids, n: run_graph(dec, ids, n))(graph_decoders[gname])
    llm = _llama_cpp(torch.get_num_threads(), max(cfg["lengths"]) + cfg["new_tokens"] + 8, log) \
        if with_llama_cpp and dev.type == "cpu" else None
    if llm is not None:
        engines["llama.cpp gguf"] = ("llama.cpp", "gguf", None)
        runners["llama.cpp gguf"] = lambda _m, ids, n: run_llama_cpp(llm, ids, n)
    elif dev.type == "cpu":
        info["notes"].append("llama-cpp-python not installed: llama.cpp not measured")

    any_model = next(m for _, _, m in engines.values() if m is not None)
    prompts = {L: prompt_ids(any_model, L) for L in cfg["lengths"]}
    measured = {"bandwidth": info["bandwidth"], "flops": info["flops"], "engines": {},
                "new_tokens": cfg["new_tokens"]}
    for name, (kind, p, m) in engines.items():
        measured["engines"][name] = {
            "precision": p, "kind": kind, "runs": {L: [] for L in cfg["lengths"]},
            "weight_nbytes": m.weight_nbytes if m is not None else _gguf_nbytes(),
            "kv_bytes_per_token": costs.kv_bytes_per_token(m.config, costs.bytes_per_value(m.dtype))
                                  if m is not None else 0}

    # Warm up every engine once (first calls allocate and pick kernels); a
    # graph decoder at every length, so capturing its graphs is not timed.
    for name, (kind, p, m) in engines.items():
        for L in (cfg["lengths"] if kind == "graph" else cfg["lengths"][:1]):
            runners[name](m, prompts[L], 3 if kind != "graph" else cfg["new_tokens"])

    tokens_seen: dict[str, dict[int, list[int]]] = {name: {} for name in engines}
    for r in range(cfg["rounds"]):
        log(f"round {r + 1}/{cfg['rounds']} ...")
        for L in cfg["lengths"]:
            for name, (kind, p, m) in engines.items():      # engines take turns
                t = runners[name](m, prompts[L], cfg["new_tokens"])
                measured["engines"][name]["runs"][L].append({"ttft_s": t.ttft_s, "tpot_s": t.tpot_s})
                tokens_seen[name][L] = t.token_ids

    # Greedy tokens must agree between labkit and transformers in fp32.
    for L in cfg["lengths"]:
        a, b = tokens_seen.get("labkit fp32", {}).get(L), tokens_seen.get("transformers fp32", {}).get(L)
        if a is not None and b is not None and a != b:
            info["notes"].append(f"greedy tokens differ between labkit fp32 and transformers fp32 at prompt {L}")

    measured["pairs"] = _pairs(set(engines), graph_decoders)

    # No cache against cache at the longest prompt, in the first precision.
    L = max(cfg["lengths"])
    first = f"labkit {precisions[0]}"
    log(f"no cache vs cache at {L} tokens ...")
    m = engines[first][2]
    nc = {"length": L, "engine": first, "cache": [], "nocache": []}
    for _ in range(max(2, cfg["rounds"] // 2)):
        nc["nocache"].append(run_labkit(m, prompts[L], cfg["nocache_tokens"], use_cache=False).tpot_s)
        nc["cache"].append(run_labkit(m, prompts[L], cfg["nocache_tokens"] + 4).tpot_s)
    measured["nocache"] = nc

    info["quality"] = _quality(engines, cfg["quality_prompts"], log)

    info["load_after"] = _load()
    report = build_report(measured)
    return info, report


def _pairs(names: set[str], graph_decoders) -> list[tuple[str, str, str]]:
    """(engine, baseline, label) for each ratio the report gives."""
    pairs = []
    for p in ("fp32", "bf16", "fp16"):
        if f"labkit {p}" in names and f"transformers {p}" in names:
            pairs.append((f"labkit {p}", f"transformers {p}", f"labkit / transformers, {p}"))
    ref16 = "labkit bf16" if "labkit bf16" in names else None
    for p in ("int8", "int4"):
        if f"labkit {p}" in names and ref16:
            pairs.append((f"labkit {p}", ref16, f"labkit {p} / labkit bf16"))
    for g in graph_decoders:
        base = g.removesuffix(" graph")
        pairs.append((g, base, f"{g} / {base} eager"))
        hf = base.replace("labkit", "transformers")
        if hf in names:
            pairs.append((g, hf, f"{g} / {hf}"))
    if "llama.cpp gguf" in names:
        for p in ("int4", "int8"):
            if f"labkit {p}" in names:
                pairs.append((f"labkit {p}", "llama.cpp gguf", f"labkit {p} / llama.cpp"))
    return pairs


def _quality(engines: dict, n_prompts: int, log) -> list[dict]:
    """The quality cost of bf16 / int8 / int4, against fp32 (or the first float model)."""
    from .quantize import PROMPTS, measure_quality

    reference = next((m for kind, p, m in engines.values() if kind == "labkit" and p == "fp32"), None) \
        or next(m for kind, p, m in engines.values() if kind == "labkit" and p in ("bf16", "fp16"))
    quality = []
    for name, (kind, p, m) in engines.items():
        if kind == "labkit" and p in ("bf16", "int8", "int4") and m is not reference:
            log(f"quality of {name} ...")
            q = measure_quality(reference, m, PROMPTS[:n_prompts], max_new_tokens=16)
            quality.append({"engine": name, "reference": reference.name, **asdict(q), "text": str(q)})
    return quality


def _gguf_nbytes() -> int:
    from .loading import default_gguf_file

    return default_gguf_file().stat().st_size


def _load() -> str:
    try:
        return "/".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m labkit.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer prompt lengths, tokens and rounds")
    ap.add_argument("--json", metavar="PATH", help="also write every number to this JSON file")
    ap.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--precisions", help="comma-separated subset of fp32,bf16,int8,int4")
    ap.add_argument("--lengths", help="comma-separated prompt lengths, e.g. 5,128,512")
    ap.add_argument("--new-tokens", type=int, help="tokens generated per run")
    ap.add_argument("--rounds", type=int, help="rounds (each engine runs once per round and length)")
    ap.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--no-transformers", action="store_true", help="skip transformers' generate")
    ap.add_argument("--no-llama-cpp", action="store_true", help="skip llama.cpp even if installed")
    a = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if a.threads:
        torch.set_num_threads(a.threads)
    precisions = tuple(a.precisions.split(",")) if a.precisions else None
    lengths = tuple(int(x) for x in a.lengths.split(",")) if a.lengths else None
    log = lambda msg: print(msg, file=sys.stderr, flush=True)
    info, report = run(quick=a.quick, device=a.device, precisions=precisions, lengths=lengths,
                       new_tokens=a.new_tokens, rounds=a.rounds,
                       with_transformers=not a.no_transformers, with_llama_cpp=not a.no_llama_cpp, log=log)
    print(format_report(info, report))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"info": info, "report": report, "command": " ".join(sys.argv)}, f, indent=1,
                      default=str)
        log(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
