"""Sweeps timed on the machine that runs the notebook: the numbers of notebooks 06 and 07.

    from labkit import measure, timing
    timing.device_label(model)         # 'cpu (Intel Xeon, 2 threads), torch.float32'
    s = measure.cache_speedup(model, ids, lengths=[16, 64, 256])
    s.with_cache_s, s.without_cache_s, s.speedup, s.same_token

Each sweep runs on the model's device (`model.device`: CPU or GPU, never
hard-coded), times with labkit.timing (which waits for the device, warms up
on a GPU and reports the median of a few repeats) and carries the label of
what it was measured on, so that a printed number never travels without its
machine.

Timings differ between machines and between runs: print and plot them; tests
never assert on their values, and a notebook asserts a claim that only a
timing can show with a wide margin, stated beside it (the fastest repeat,
kept beside the median, is the steadier figure on a busy machine). What does hold everywhere (the same tokens with and
without the cache, the shapes, which phase moves more bytes) is what tests and
notebooks check.

What is here:

    LONG_TEXT, long_prompt_ids                 a prompt of any length
    cache_speedup                              next-token time with / without the KV cache
    time_generation                            a whole generation, with / without the cache:
                                               TTFT (from the request), prefill time, TPOT, e2e
    prefill_sweep                              prefill time against prompt length
                                               (ttft_sweep: the old name, kept)
    batch_sweep                                prefill and decode cost as the batch grows
    roofline_point                             a measured workload as a roofline point

Names kept apart (labkit.generation defines them): the *prefill time* is one
forward pass over the prompt (what prefill_sweep and batch_sweep time, ids
already on the device); *TTFT* counts from the request, so it also holds the
tokenization and the set-up (and, in a server, the queue: labkit.batching).

The clock, the device labels and the roofs (read_bandwidth,
matmul_flops_per_s) are in labkit.timing; FLOPs and bytes in labkit.costs;
the charts of the sweeps (charts.prefill_chart, charts.batch_chart) in labkit.charts.

Left out: CUDA events and profilers, and any tuning of the machine (see labkit.timing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from . import costs
from .encoding import encode
from .generation import Generation, generate
from .timing import device_label, median, release_freed_memory, time_fn


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
        model.forward(ids[:n - 1], cache=cache, last_only=True)  # the n - 1 earlier tokens, untimed
        t_with, logits_with = time_fn(lambda: model.forward(ids[n - 1:n], cache=cache), model.device,
                                      repeats, warmup, setup=lambda: cache.truncate(n - 1))
        # last_only: what generation without a cache computes (full logits would be n x vocab, 50-100 MB).
        t_without, logits_without = time_fn(lambda: model.forward(ids[:n], last_only=True), model.device,
                                            repeats, warmup)
        with_s.append(t_with.median)
        without_s.append(t_without.median)
        same.append(int(logits_with[-1].argmax()) == int(logits_without[-1].argmax()))
    return CacheSpeedup(list(lengths), with_s, without_s, same, device_label(model), repeats)


@dataclass
class GenerationTiming:
    """A generation timed end to end; each figure is the median over the timed
    repeats of that figure of each run (labkit.generation's definitions);
    `gen` is the last run.

    total_s:   the whole generate() call, timed from outside (about e2e_s)
    e2e_s:     end-to-end, request -> last token
    ttft_s:    time to first token, from the request (tokenization included)
    prefill_s: the prefill step alone
    tpot_s:    time per output token, the mean (e2e - TTFT) / (N - 1)
    """

    use_cache: bool
    total_s: float
    ttft_s: float
    tpot_s: float
    gen: Generation
    device: str
    e2e_s: float = float("nan")
    prefill_s: float = float("nan")

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
    gens: list[Generation] = []                         # every run, the warm-up ones first

    def run():
        gens.append(generate(model, prompt, max_new_tokens, use_cache=use_cache, **generate_args))

    total, _ = time_fn(run, model.device, max(1, repeats), warmup)
    release_freed_memory()                              # the runs' temporaries (docs/memory.md)
    timed = gens[-len(total.samples):]
    return GenerationTiming(use_cache, total.median, median(g.ttft_s for g in timed),
                            median(g.tpot_s for g in timed), gens[-1], device_label(model),
                            median(g.e2e_s for g in timed), median(g.prefill_s for g in timed))


# ----------------------------------------------------------------------------
# Prefill time against prompt length
# ----------------------------------------------------------------------------

@dataclass
class PrefillSweep:
    """Prefill time and KV cache size per prompt length.

    The prefill time is one forward pass over the first n tokens (ids already
    on the device, the cache already allocated): usually the largest part of TTFT,
    but not all of it (no tokenization, no set-up, no queue).
    """

    lengths: list[int]
    seconds: list[float]           # medians
    cache_nbytes: list[int]        # KV cache bytes after the prefill
    flops: list[float]             # FLOPs of each prefill (labkit.costs)
    device: str
    repeats: int
    min_seconds: list[float] | None = None   # the fastest repeat of each (what the machine can reach)

    @property
    def ms_per_token(self) -> list[float]:
        return [s * 1e3 / n for n, s in zip(self.lengths, self.seconds)]

    @property
    def flops_per_s(self) -> list[float]:
        return [f / s for f, s in zip(self.flops, self.seconds)]


TTFTSweep = PrefillSweep     # the old name: it timed the prefill, which is not the whole TTFT


def prefill_sweep(model, ids, lengths: Sequence[int], repeats: int = 3, warmup: int | None = None) -> PrefillSweep:
    """Time the prefill of the first n tokens of `ids` for each n in lengths."""
    ids = _on_device(model, ids).flatten()
    if any(not 1 <= n <= len(ids) for n in lengths):
        raise ValueError(f"lengths must be in [1, {len(ids)}] (the prompt's tokens), got {list(lengths)}")
    seconds, fastest, nbytes, flops = [], [], [], []
    for n in lengths:
        cache = model.new_cache(max_len=n)
        t, _ = time_fn(lambda: model.forward(ids[:n], cache=cache, last_only=True), model.device, repeats, warmup,
                       setup=cache.reset)
        seconds.append(t.median)
        fastest.append(t.min)
        nbytes.append(cache.nbytes)
        flops.append(costs.prefill_workload(model, n).flops)
        del cache
        release_freed_memory()        # each length's activations, before the next (docs/memory.md)
    return PrefillSweep(list(lengths), seconds, nbytes, flops, device_label(model), repeats, fastest)


ttft_sweep = prefill_sweep   # the old name, kept for code written against it


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
    prefill_min_s: list[float] | None = None   # the fastest repeat of each: other programs only slow a
    decode_min_s: list[float] | None = None    # run down, so these are steadier than medians on a busy machine

    @property
    def prefill_ms_per_token(self) -> list[float]:
        return [s * 1e3 / (b * self.prompt_len) for b, s in zip(self.batch_sizes, self.prefill_s)]

    @property
    def decode_tokens_per_s(self) -> list[float]:
        """Decode throughput from the median step times."""
        return [b / s for b, s in zip(self.batch_sizes, self.decode_s)]

    @property
    def decode_tokens_per_s_best(self) -> list[float]:
        """Decode throughput from the fastest step times."""
        return [b / s for b, s in zip(self.batch_sizes, self.decode_min_s)]

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
    value_bytes = costs.bytes_per_value(model.dtype)
    prefill_s, decode_s, prefill_min, decode_min, total_bytes, kv_bytes = [], [], [], [], [], []
    for b in batch_sizes:
        ids = torch.randint(0, c.vocab_size, (b, prompt_len), generator=g).to(model.device)
        cache = model.new_cache(max_len=prompt_len, batch_size=b)
        t, _ = time_fn(lambda: model.forward(ids, cache=cache, last_only=True), model.device, repeats, warmup,
                       setup=cache.reset)
        prefill_s.append(t.median)
        prefill_min.append(t.min)
        del cache, ids
        release_freed_memory()        # the prefill's activations, before the decode cache (docs/memory.md)

        cache = model.new_cache(max_len=context + 1, batch_size=b)
        cache.k.zero_()
        cache.v.zero_()
        cache.length = context
        last = torch.randint(0, c.vocab_size, (b, 1), generator=g).to(model.device)
        t, _ = time_fn(lambda: model.forward(last, cache=cache), model.device, repeats, warmup,
                       setup=lambda: cache.truncate(context))
        decode_s.append(t.median)
        decode_min.append(t.min)
        del cache, last
        release_freed_memory()
        work = costs.decode_workload(model, context, batch_size=b)
        total_bytes.append(work.bytes)
        kv_bytes.append(costs.kv_bytes_per_token(c, value_bytes, batch_size=b) * (context + 1))
    return BatchSweep(list(batch_sizes), prompt_len, context, prefill_s, decode_s, total_bytes, kv_bytes,
                      device_label(model), repeats, prefill_min, decode_min)


# ----------------------------------------------------------------------------
# The roofline (its two roofs are measured by labkit.timing)
# ----------------------------------------------------------------------------

def roofline_point(workload: costs.Workload, seconds: float, name: str | None = None) -> dict:
    """A measured workload as a point for charts.roofline_chart: its intensity
    (FLOP/byte, from the formulas) and the FLOP/s it reached (FLOPs / measured seconds)."""
    return {"name": name or workload.name, "intensity": workload.intensity,
            "flops_per_s": workload.flops / seconds}
