"""Timing on the machine that runs the notebook: the numbers of notebooks 06 and 07.

    from labkit import measure
    measure.device_label(model)        # 'cpu (Intel Xeon, 2 threads), torch.float32'
    s = measure.cache_speedup(model, ids, lengths=[16, 64, 256])
    s.with_cache_s, s.without_cache_s, s.speedup, s.same_token

Every measurement here
- runs on the model's device (`model.device`: CPU or GPU, never hard-coded);
- waits for the device before it reads the clock: a CUDA call returns as soon
  as the work is queued, so without `torch.cuda.synchronize()` a GPU would
  look impossibly fast;
- runs once untimed first (warm-up: memory allocation, kernel selection), then
  reports the median of a few repeats, which a busy, shared machine disturbs
  less than the mean;
- carries the label of what it was measured on, so that a printed number
  never travels without its machine.

Timings differ between machines and between runs: print and plot them, never
assert on their values. What does hold everywhere (the same tokens with and
without the cache, the shapes, which phase moves more bytes) is what tests and
notebooks check.

What is here:

    device_label, sync, time_fn               labels, the clock, medians
    LONG_TEXT, long_prompt_ids                 a prompt of any length
    cache_speedup                              next-token time with / without the KV cache
    time_generation                            a whole generation, with / without the cache
    ttft_sweep                                 prefill latency (TTFT) against prompt length
    batch_sweep                                prefill and decode cost as the batch grows
    measure_bandwidth, measure_matmul_flops    the two numbers of the roofline (best of a few runs)
    roofline_point                             a measured workload as a roofline point
    ttft_chart, batch_chart                    charts of the sweeps (viz has none for them)

Left out: CUDA events and profilers (perf_counter around a synchronize is
accurate to well under a millisecond, enough for steps of milliseconds), and
any tuning of the machine (threads, clocks): the point is to measure the
machine as the student has it.
"""

from __future__ import annotations

import platform
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from . import charts, costs
from .encoding import encode
from .generation import Generation, generate


# ----------------------------------------------------------------------------
# Labels and the clock
# ----------------------------------------------------------------------------

def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def device_name(device: str | torch.device) -> str:
    """The device in words: 'cpu (Intel Xeon, 2 threads)' or 'cuda:0 (NVIDIA H200)'."""
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    if device.type == "cpu":
        return f"cpu ({_cpu_name()}, {torch.get_num_threads()} threads)"
    return str(device)


def device_label(model_or_device, dtype: torch.dtype | None = None) -> str:
    """What a measurement ran on: device, processor, threads and dtype."""
    if hasattr(model_or_device, "device") and hasattr(model_or_device, "dtype"):
        device, dtype = model_or_device.device, dtype or model_or_device.dtype
    else:
        device = model_or_device
    return device_name(device) + (f", {dtype}" if dtype is not None else "")


def sync(device: str | torch.device) -> None:
    """Wait until the device has finished the work queued on it."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


@dataclass
class Timing:
    """Seconds of each timed repeat (the warm-up is not among them)."""

    samples: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    def __repr__(self) -> str:
        return f"Timing(median {self.median * 1e3:.2f} ms over {len(self.samples)} repeats)"


def default_warmup(device: str | torch.device) -> int:
    """Untimed runs before timing: one on a GPU (its first call of a new shape
    picks kernels and allocates), none on a CPU, where a first call costs about
    what the next ones do and a slow machine should not pay for it twice."""
    return 0 if torch.device(device).type == "cpu" else 1


def time_fn(fn: Callable[[], Any], device: str | torch.device, repeats: int = 3, warmup: int | None = None,
            setup: Callable[[], Any] | None = None) -> tuple[Timing, Any]:
    """Time `fn()` on `device`: `warmup` untimed calls, then `repeats` timed ones.

    warmup: None for `default_warmup(device)`.
    setup: called before every call, outside the timed region (e.g. to empty a cache).
    Returns the Timing and the result of the last call.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if warmup is None:
        warmup = default_warmup(device)
    result = None
    for _ in range(warmup):
        if setup:
            setup()
        result = fn()
    samples = []
    for _ in range(repeats):
        if setup:
            setup()
        sync(device)
        start = time.perf_counter()
        result = fn()
        sync(device)
        samples.append(time.perf_counter() - start)
    return Timing(samples), result


# ----------------------------------------------------------------------------
# A prompt of any length
# ----------------------------------------------------------------------------

LONG_TEXT = (
    "Paris is the capital and largest city of France. It sits on the river Seine, in the north of the "
    "country, at the heart of the Ile-de-France region. The city has been a centre of finance, diplomacy, "
    "commerce, fashion, science and the arts for centuries. Its museums, among them the Louvre and the "
    "Musee d'Orsay, hold some of the best known paintings in the world, and the Eiffel Tower, built for "
    "the World's Fair of 1889, has become the symbol of the city. Paris is divided into twenty districts, "
    "called arrondissements, which spiral outwards from the centre like the shell of a snail. The Metro, "
    "opened in 1900, carries millions of passengers every day, and the main railway stations connect the "
    "capital to the rest of France and to its neighbours: London is a little more than two hours away by "
    "train, Brussels less than an hour and a half. Every summer the Tour de France ends on the "
    "Champs-Elysees, and every spring the Paris marathon crosses the city from the Arc de Triomphe to the "
    "Bois de Vincennes. The French language, the cafes on every corner, the bakeries that open before "
    "dawn and the bookstalls along the quays of the Seine all belong to the picture that visitors carry "
    "home. Outside the city, France stretches from the English Channel to the Mediterranean Sea and from "
    "the Atlantic Ocean to the Alps, with Lyon, Marseille, Toulouse, Nice, Nantes, Strasbourg, Montpellier, "
    "Bordeaux and Lille as its other large cities. The capital of France is"
)


def long_prompt_ids(model, n_tokens: int | None = None, text: str = LONG_TEXT) -> torch.Tensor:
    """Token ids of `text` (the text repeated if it is too short), cut to n_tokens; on the CPU."""
    ids = encode(model, text).ids
    if n_tokens is None:
        return ids
    if n_tokens < 1:
        raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
    repeats = -(-n_tokens // len(ids))
    return ids.repeat(repeats)[:n_tokens]


def _on_device(model, ids) -> torch.Tensor:
    return torch.as_tensor(ids, dtype=torch.long).to(model.device)


# ----------------------------------------------------------------------------
# With and without the KV cache
# ----------------------------------------------------------------------------

@dataclass
class CacheSpeedup:
    """The time to produce the next token when the sequence holds `length` tokens.

    with cache:    one decode step: the newest token against length - 1 cached positions;
    without cache: one forward pass over all `length` tokens (what generation
                   without a cache does at every step).
    """

    lengths: list[int]
    with_cache_s: list[float]      # medians
    without_cache_s: list[float]   # medians
    same_token: list[bool]         # both ways predict the same next token
    device: str
    repeats: int

    @property
    def speedup(self) -> list[float]:
        return [w / c for c, w in zip(self.with_cache_s, self.without_cache_s)]

    def rows(self) -> list[tuple[int, float, float, float]]:
        """(length, with cache ms, without cache ms, speed-up) per length."""
        return [(n, c * 1e3, w * 1e3, s)
                for n, c, w, s in zip(self.lengths, self.with_cache_s, self.without_cache_s, self.speedup)]


def cache_speedup(model, ids, lengths: Sequence[int], repeats: int = 3,
                  warmup: int | None = None) -> CacheSpeedup:
    """Time one next-token step with and without the KV cache at each length
    (`warmup` untimed runs, default `default_warmup`, then the median of `repeats`)."""
    ids = _on_device(model, ids).flatten()
    if any(not 2 <= n <= len(ids) for n in lengths):
        raise ValueError(f"lengths must be in [2, {len(ids)}] (the prompt's tokens), got {list(lengths)}")
    with_s, without_s, same = [], [], []
    for n in lengths:
        cache = model.new_cache(max_len=n)
        model.forward(ids[:n - 1], cache=cache)                  # the n - 1 earlier tokens, untimed
        t_with, logits_with = time_fn(lambda: model.forward(ids[n - 1:n], cache=cache), model.device,
                                      repeats, warmup, setup=lambda: cache.truncate(n - 1))
        t_without, logits_without = time_fn(lambda: model.forward(ids[:n]), model.device, repeats, warmup)
        with_s.append(t_with.median)
        without_s.append(t_without.median)
        same.append(int(logits_with[-1].argmax()) == int(logits_without[-1].argmax()))
    return CacheSpeedup(list(lengths), with_s, without_s, same, device_label(model), repeats)


@dataclass
class GenerationTiming:
    """A generation timed end to end (medians over repeats); `gen` is the last run."""

    use_cache: bool
    total_s: float
    ttft_s: float
    tpot_s: float
    gen: Generation
    device: str

    @property
    def token_ids(self) -> list[int]:
        return self.gen.token_ids

    @property
    def text(self) -> str:
        return self.gen.text

    @property
    def step_seconds(self) -> list[float]:
        return [s.seconds for s in self.gen.steps]


def time_generation(model, prompt, max_new_tokens: int, use_cache: bool = True, repeats: int = 1,
                    warmup: int | None = None, **generate_args) -> GenerationTiming:
    """Greedy generation (by default) of exactly max_new_tokens tokens, timed.

    Generation ignores EOS here (`stop_at_eos=False` unless given), so runs
    with and without the cache always produce the same number of tokens.
    """
    generate_args.setdefault("stop_at_eos", False)
    for _ in range(default_warmup(model.device) if warmup is None else warmup):
        generate(model, prompt, max_new_tokens, use_cache=use_cache, **generate_args)
    totals, ttfts, tpots = [], [], []
    gen = None
    for _ in range(max(1, repeats)):
        sync(model.device)
        start = time.perf_counter()
        gen = generate(model, prompt, max_new_tokens, use_cache=use_cache, **generate_args)
        sync(model.device)
        totals.append(time.perf_counter() - start)
        ttfts.append(gen.ttft_s)
        tpots.append(gen.tpot_s)
    return GenerationTiming(use_cache, statistics.median(totals), statistics.median(ttfts),
                            statistics.median(tpots), gen, device_label(model))


# ----------------------------------------------------------------------------
# Prefill against prompt length (TTFT)
# ----------------------------------------------------------------------------

@dataclass
class TTFTSweep:
    """Prefill latency (time to first token) and KV cache size per prompt length."""

    lengths: list[int]
    seconds: list[float]           # medians
    cache_nbytes: list[int]        # KV cache bytes after the prefill
    flops: list[float]             # FLOPs of each prefill (labkit.costs)
    device: str
    repeats: int

    @property
    def ms_per_token(self) -> list[float]:
        return [s * 1e3 / n for n, s in zip(self.lengths, self.seconds)]

    @property
    def flops_per_s(self) -> list[float]:
        return [f / s for f, s in zip(self.flops, self.seconds)]


def ttft_sweep(model, ids, lengths: Sequence[int], repeats: int = 3, warmup: int | None = None) -> TTFTSweep:
    """Time the prefill of the first n tokens of `ids` for each n in lengths."""
    ids = _on_device(model, ids).flatten()
    if any(not 1 <= n <= len(ids) for n in lengths):
        raise ValueError(f"lengths must be in [1, {len(ids)}] (the prompt's tokens), got {list(lengths)}")
    seconds, nbytes, flops = [], [], []
    for n in lengths:
        cache = model.new_cache(max_len=n)
        t, _ = time_fn(lambda: model.forward(ids[:n], cache=cache), model.device, repeats, warmup,
                       setup=cache.reset)
        seconds.append(t.median)
        nbytes.append(cache.nbytes)
        flops.append(costs.prefill_workload(model, n).flops)
    return TTFTSweep(list(lengths), seconds, nbytes, flops, device_label(model), repeats)


# ----------------------------------------------------------------------------
# Batch size
# ----------------------------------------------------------------------------

@dataclass
class BatchSweep:
    """Prefill and decode cost as the batch grows.

    prefill: B prompts of prompt_len tokens in one forward pass.
    decode:  one step for B sequences, each with `context` cached positions.
    """

    batch_sizes: list[int]
    prompt_len: int
    context: int
    prefill_s: list[float]          # medians, one whole batched prefill
    decode_s: list[float]           # medians, one batched decode step
    decode_bytes: list[float]       # bytes a decode step must read (weights + every sequence's cache)
    decode_kv_bytes: list[float]    # of which KV cache
    device: str
    repeats: int

    @property
    def prefill_ms_per_token(self) -> list[float]:
        return [s * 1e3 / (b * self.prompt_len) for b, s in zip(self.batch_sizes, self.prefill_s)]

    @property
    def decode_tokens_per_s(self) -> list[float]:
        return [b / s for b, s in zip(self.batch_sizes, self.decode_s)]

    @property
    def kv_fraction(self) -> list[float]:
        """Share of a decode step's bytes that are KV cache reads."""
        return [kv / total for kv, total in zip(self.decode_kv_bytes, self.decode_bytes)]


def batch_sweep(model, batch_sizes: Sequence[int], prompt_len: int = 64, context: int = 512,
                repeats: int = 3, warmup: int | None = None, seed: int = 0) -> BatchSweep:
    """Time a batched prefill and a batched decode step for each batch size.

    Token ids are random (fixed seed): timing does not depend on which tokens
    they are. The decode cache is filled with zeros up to `context` positions
    instead of by a prefill: a decode step's cost depends on how many
    positions it reads, not on their values, and prefilling B x context tokens
    would take longer than the whole sweep.
    """
    c = model.config
    if not 1 <= context < c.max_len:
        raise ValueError(f"context must be in [1, {c.max_len - 1}], got {context}")
    g = torch.Generator().manual_seed(seed)
    value_bytes = torch.finfo(model.dtype).bits // 8
    prefill_s, decode_s, total_bytes, kv_bytes = [], [], [], []
    for b in batch_sizes:
        ids = torch.randint(0, c.vocab_size, (b, prompt_len), generator=g).to(model.device)
        cache = model.new_cache(max_len=prompt_len, batch_size=b)
        t, _ = time_fn(lambda: model.forward(ids, cache=cache), model.device, repeats, warmup,
                       setup=cache.reset)
        prefill_s.append(t.median)
        del cache

        cache = model.new_cache(max_len=context + 1, batch_size=b)
        cache.k.zero_()
        cache.v.zero_()
        cache.length = context
        last = torch.randint(0, c.vocab_size, (b, 1), generator=g).to(model.device)
        t, _ = time_fn(lambda: model.forward(last, cache=cache), model.device, repeats, warmup,
                       setup=lambda: cache.truncate(context))
        decode_s.append(t.median)
        del cache
        work = costs.decode_workload(model, context, batch_size=b)
        total_bytes.append(work.bytes)
        kv_bytes.append(costs.kv_bytes_per_token(c, value_bytes) * (context + 1) * b)
    return BatchSweep(list(batch_sizes), prompt_len, context, prefill_s, decode_s, total_bytes, kv_bytes,
                      device_label(model), repeats)


# ----------------------------------------------------------------------------
# The roofline's two numbers
# ----------------------------------------------------------------------------

def measure_bandwidth(device: str | torch.device, nbytes: int | None = None, repeats: int = 5) -> float:
    """Memory read bandwidth (bytes/s): the time to sum a large fp32 tensor, best of `repeats`.

    A sum reads every byte once and does one addition per 4 bytes, so it is
    bound by memory, as a decode step is. The default size, 256 MB on a CPU and
    2 GB on a GPU, is far larger than any cache and small enough for a notebook.
    A roof is what the machine *can* reach, and other programs only ever slow
    a run down, so this takes the fastest run (labkit.bench uses this too, with 1 GiB).
    """
    device = torch.device(device)
    if nbytes is None:
        nbytes = 2 * 2**30 if device.type == "cuda" else 256 * 2**20
    x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    t, _ = time_fn(lambda: x.sum(), device, repeats, warmup=1)
    return x.numel() * 4 / t.min


def measure_matmul_flops(device: str | torch.device, dtype: torch.dtype = torch.float32,
                         n: int | None = None, repeats: int = 5) -> float:
    """Matmul throughput (FLOP/s) of an (n x n) @ (n x n) product, 2 n^3 FLOPs, best of `repeats`.

    The practical peak PyTorch reaches on this device in this dtype, usually
    below the data-sheet number. Default n: 1024 on a CPU (a fraction of a
    second), 8192 on a GPU (smaller products leave a large GPU partly idle).
    """
    device = torch.device(device)
    if n is None:
        n = 8192 if device.type == "cuda" else 1024
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, generator=g, device=device).to(dtype)
    b = torch.randn(n, n, generator=g, device=device).to(dtype)
    t, _ = time_fn(lambda: a @ b, device, repeats, warmup=1)
    return 2 * n**3 / t.min


def roofline_point(workload: costs.Workload, seconds: float, name: str | None = None) -> dict:
    """A measured workload as a point for charts.roofline_chart: its intensity
    (FLOP/byte, from the formulas) and the FLOP/s it reached (FLOPs / measured seconds)."""
    return {"name": name or workload.name, "intensity": workload.intensity,
            "flops_per_s": workload.flops / seconds}


# ----------------------------------------------------------------------------
# Charts of the sweeps (data in, figure out, as in viz)
# ----------------------------------------------------------------------------

def ttft_chart(sweep: TTFTSweep, title: str = "Prefill time (TTFT) against prompt length") -> go.Figure:
    """Left: TTFT (ms) against prompt length. Right: the same time per prompt token."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=("time to first token", "time per prompt token"))
    fig.add_trace(go.Scatter(x=sweep.lengths, y=[s * 1e3 for s in sweep.seconds], mode="lines+markers",
                             name="TTFT", line=dict(color=charts.ORANGE),
                             hovertemplate="%{x} tokens<br>TTFT %{y:.1f} ms<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=sweep.lengths, y=sweep.ms_per_token, mode="lines+markers",
                             name="per prompt token", line=dict(color=charts.BLUE),
                             hovertemplate="%{x} tokens<br>%{y:.2f} ms per token<extra></extra>"), row=1, col=2)
    fig.update_xaxes(title="prompt length (tokens)", rangemode="tozero")
    fig.update_yaxes(title="TTFT (ms)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title="ms per prompt token", rangemode="tozero", row=1, col=2)
    fig.update_layout(title=charts._title(title, f"measured on {sweep.device}, median of {sweep.repeats}"),
                      width=1000, height=460, showlegend=False)
    return charts.fit_title(fig)


def batch_chart(sweep: BatchSweep, title: str = "Batch size: prefill vs decode") -> go.Figure:
    """Three panels against the batch size: prefill time per token (flat once
    the device is busy), decode throughput in tokens/s (rising with the batch),
    and the KV cache's share of the bytes each decode step reads."""
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.09,
                        subplot_titles=(f"prefill, {sweep.prompt_len} tokens each",
                                        f"decode, {sweep.context} cached each",
                                        "KV cache share of reads"))
    x = [str(b) for b in sweep.batch_sizes]   # categories: evenly spaced, labelled with the batch size
    fig.add_trace(go.Scatter(x=x, y=sweep.prefill_ms_per_token, mode="lines+markers", name="prefill",
                             line=dict(color=charts.ORANGE),
                             hovertemplate="batch %{x}<br>%{y:.2f} ms per token<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=x, y=sweep.decode_tokens_per_s, mode="lines+markers", name="decode",
                             line=dict(color=charts.BLUE),
                             hovertemplate="batch %{x}<br>%{y:.1f} tokens/s<extra></extra>"), row=1, col=2)
    fig.add_trace(go.Bar(x=x, y=[100 * f for f in sweep.kv_fraction], name="KV share", marker_color=charts.GREEN,
                         text=[f"{100 * f:.0f}%" for f in sweep.kv_fraction], textposition="outside",
                         cliponaxis=False,
                         hovertemplate="batch %{x}<br>KV cache %{y:.0f}% of the bytes<extra></extra>"),
                  row=1, col=3)
    fig.update_xaxes(title="batch size", type="category")
    fig.update_yaxes(title="prefill time per token (ms)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title="decode throughput (tokens/s)", rangemode="tozero", row=1, col=2)
    fig.update_yaxes(title="KV cache / all bytes read (%)", range=[0, 110], row=1, col=3)
    fig.update_layout(title=charts._title(title, f"measured on {sweep.device}, median of {sweep.repeats}"),
                      width=1050, height=460, showlegend=False)
    return charts.fit_title(fig)
