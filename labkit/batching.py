"""Serving many users: static batching (静态批处理) against continuous batching
(连续批处理), as a simulation, with the serving metrics of each request.

A server receives requests at random times, each with a prompt to prefill
and some number of tokens to generate. A decode step for a batch of B
sequences costs little more than for one (it reads the weights once for all
of them; notebook 07 measured it), so the server batches. The question is
*when* a request may join a batch.

- **Static batching**: when the engine is free, it takes the requests that
  are waiting (up to `max_batch`), prefills them together (padded to the
  longest prompt) and decodes until the *longest* one is done. A request
  that finishes early leaves its slot empty (still computed, as padding);
  a request that arrives meanwhile waits for the whole batch.
- **Continuous batching** (iteration-level scheduling: Yu et al., Orca,
  OSDI 2022; used by vLLM, TGI, TensorRT-LLM, SGLang): the batch is
  re-formed at every step. A finished request leaves at once, and a waiting
  one joins at the next step: its whole prefill runs in that step, alongside
  the others' decode (which therefore wait for it: see `itl_s`).

The metrics, per request, with the same definitions as labkit.generation
(TTFT from the request), plus the queue a single generate() call never has:

    queue_s     arrival -> admitted into the batch (its prefill starts)
    ttft_s      time to first token, from the ARRIVAL: queueing + the step
                that ran its prefill (so TTFT = queue_s + prefill step)
    e2e_s       end-to-end latency: arrival -> last token (also `latency_s`)
    tpot_s      time per output token, the mean: (e2e - TTFT) / (N - 1)
    itl_s       the N - 1 inter-token latencies (gaps between its tokens)

and for the whole run: throughput (吞吐量: output tokens per second of
makespan), request throughput, percentiles (nearest rank, labkit.timing.
percentile) and goodput (requests per second that met a latency target on
both TTFT and TPOT: the simple form of DistServe's goodput, Zhong et al.,
OSDI 2024, which is the highest rate at which a chosen share meets them).

Nothing runs a model here: a `CostModel` says how long a step takes
(a fixed part plus a part per decoding sequence and per prefilled token,
fitted from measurements with `CostModel.from_sweep` or given as numbers),
and the simulation adds up steps. It is deterministic: the same requests and
costs give the same result on every machine. charts.timeline_chart and
charts.summary_chart draw what `compare` returns.

Left out: memory. Each admitted request is assumed to fit; a real engine
has a KV-cache budget, and reserving max_len positions per request wastes
most of it (what PagedAttention, Kwon et al. SOSP 2023, removes). Also left
out: chunked prefill (Agrawal et al.: SARATHI 2023, Sarathi-Serve 2024), preemption,
priorities, tokenization and detokenization, and the time the scheduler
itself takes. A request's e2e latency is its arrival to its last token in
both policies (with streaming, a static batch's short answers need not wait
for the longest one: the kinder reading for static batching).
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field

from .timing import percentile

__all__ = ["Request", "make_requests", "CostModel", "Step", "RequestRecord", "BatchingResult",
           "simulate", "compare", "percentile", "POLICIES"]

POLICIES = ("static", "continuous")


@dataclass(frozen=True)
class Request:
    id: int
    arrival_s: float      # when the request reaches the server: every latency counts from here
    prompt_len: int       # tokens to prefill
    output_len: int       # tokens to generate (the first comes from the prefill step)


def make_requests(n: int = 24, rate_per_s: float = 2.0, prompt_len: tuple[int, int] = (16, 128),
                  output_len: tuple[int, int] = (4, 96), seed: int = 0) -> list[Request]:
    """n requests arriving as a Poisson process (rate_per_s on average), with
    prompt and output lengths drawn uniformly from the given (low, high) ranges.
    The same seed gives the same requests on every machine."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if rate_per_s <= 0:
        raise ValueError(f"rate_per_s must be > 0, got {rate_per_s}")
    if not (1 <= prompt_len[0] <= prompt_len[1] and 1 <= output_len[0] <= output_len[1]):
        raise ValueError("prompt_len and output_len must be (low, high) ranges with 1 <= low <= high, "
                         f"got {prompt_len} and {output_len}")
    rng = random.Random(seed)
    t, requests = 0.0, []
    for i in range(n):
        requests.append(Request(i, round(t, 6), rng.randint(*prompt_len), rng.randint(*output_len)))
        t += rng.expovariate(rate_per_s)
    return requests


@dataclass(frozen=True)
class CostModel:
    """Seconds of one engine step with `batch` sequences decoding and
    `prefill_tokens` prompt tokens prefilled:

        step = decode_base_s + decode_per_seq_s x batch + prefill_per_token_s x prefill_tokens

    (the base part is paid once if the step does anything at all). The
    defaults, 20 ms + 2 ms per sequence + 0.5 ms per prompt token, are round
    numbers chosen for examples, not a measurement: they make a result the
    same on every machine. Notebook 10 fits this machine's with from_sweep."""

    decode_base_s: float = 0.020
    decode_per_seq_s: float = 0.002
    prefill_per_token_s: float = 0.0005

    def step_s(self, batch: int, prefill_tokens: int = 0) -> float:
        if batch < 0 or prefill_tokens < 0:
            raise ValueError(f"batch and prefill_tokens must be >= 0, got {batch} and {prefill_tokens}")
        if batch == 0 and prefill_tokens == 0:
            return 0.0
        return self.decode_base_s + self.decode_per_seq_s * batch + self.prefill_per_token_s * prefill_tokens

    @classmethod
    def from_sweep(cls, sweep) -> "CostModel":
        """Fit the cost model to a labkit.measure.BatchSweep: straight lines
        (least squares) through decode step time against batch size, and
        through prefill time against prompt tokens (batch x prompt length).
        Only the slope of the prefill line is kept: a step's fixed part (the
        weight read) is decode_base_s, which simulate charges once a step, so
        taking time / tokens instead would charge the weight read twice."""
        xs, ys = sweep.batch_sizes, sweep.decode_s
        if len(xs) < 2:
            raise ValueError("need decode times at two or more batch sizes to fit a line")
        slope, intercept = _fit_line(xs, ys)
        slope = max(slope, 0.0)                         # a noisy machine can tilt the line down
        base = max(intercept, min(ys) * 0.5)
        tokens = [b * sweep.prompt_len for b in xs]
        per_token, _ = _fit_line(tokens, sweep.prefill_s)
        if per_token <= 0:                              # noise again: fall back to the plain ratio
            per_token = statistics.median(s / n for n, s in zip(tokens, sweep.prefill_s))
        return cls(base, slope, per_token)


def _fit_line(xs, ys) -> tuple[float, float]:
    """(slope, intercept) of the least-squares line through the points."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return slope, my - slope * mx


@dataclass
class Step:
    """One engine step of the simulation."""

    start_s: float
    seconds: float
    running: list[int]          # ids of requests that produced a token in this step
    prefilled: list[int]        # ids whose prefill ran in this step (their first token)
    slots: int                  # slots occupied, including finished ones kept as padding (static)


@dataclass
class RequestRecord:
    """What happened to one request; every time is on the simulation's clock (s)."""

    request: Request
    start_s: float = float("nan")         # admitted: its prefill step began
    first_token_s: float = float("nan")   # end of its prefill step: its first token exists
    finish_s: float = float("nan")        # end of the step that produced its last token
    token_s: list[float] = field(default_factory=list)   # when each of its tokens was produced

    @property
    def arrival_s(self) -> float:
        return self.request.arrival_s

    @property
    def queue_s(self) -> float:
        """Waiting in the queue: arrival -> admitted (its prefill starts)."""
        return self.start_s - self.request.arrival_s

    @property
    def prefill_step_s(self) -> float:
        """The step that ran its prefill (in continuous batching, shared with others' decode)."""
        return self.first_token_s - self.start_s

    @property
    def ttft_s(self) -> float:
        """Time to first token from the arrival, queueing included: queue_s + prefill_step_s."""
        return self.first_token_s - self.request.arrival_s

    @property
    def e2e_s(self) -> float:
        """End-to-end latency: arrival -> last token."""
        return self.finish_s - self.request.arrival_s

    @property
    def latency_s(self) -> float:
        """The same as e2e_s (the name charts and older notebooks use)."""
        return self.e2e_s

    @property
    def itl_s(self) -> list[float]:
        """Inter-token latencies: the N - 1 gaps between its consecutive tokens."""
        return [b - a for a, b in zip(self.token_s, self.token_s[1:])]

    @property
    def tpot_s(self) -> float:
        """Time per output token, the mean: (e2e - TTFT) / (N - 1); nan for a one-token answer."""
        n = self.request.output_len
        return (self.finish_s - self.first_token_s) / (n - 1) if n > 1 else float("nan")


@dataclass
class BatchingResult:
    policy: str                         # "static" or "continuous"
    max_batch: int
    cost: CostModel
    records: list[RequestRecord]
    steps: list[Step] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        """Output tokens generated (prompt tokens are not counted)."""
        return sum(r.request.output_len for r in self.records)

    @property
    def makespan_s(self) -> float:
        """From the first arrival to the last token."""
        return max(r.finish_s for r in self.records) - min(r.request.arrival_s for r in self.records)

    @property
    def throughput(self) -> float:
        """Throughput (吞吐量): output tokens per second over the makespan."""
        return self.tokens / self.makespan_s

    @property
    def request_throughput(self) -> float:
        """Finished requests per second over the makespan."""
        return len(self.records) / self.makespan_s

    def goodput(self, ttft_slo_s: float, tpot_slo_s: float) -> float:
        """Requests per second (over the makespan) that met both latency targets:
        TTFT <= ttft_slo_s and TPOT <= tpot_slo_s (a one-token answer has no TPOT
        to miss). Throughput counts every request; goodput only the ones a user
        would call served well."""
        if ttft_slo_s <= 0 or tpot_slo_s <= 0:
            raise ValueError(f"ttft_slo_s and tpot_slo_s must be > 0, got {ttft_slo_s} and {tpot_slo_s}")
        return sum(1 for r in self.records if self.meets_slo(r, ttft_slo_s, tpot_slo_s)) / self.makespan_s

    @staticmethod
    def meets_slo(r: RequestRecord, ttft_slo_s: float, tpot_slo_s: float) -> bool:
        return r.ttft_s <= ttft_slo_s and not r.tpot_s > tpot_slo_s     # nan TPOT: nothing to miss

    @property
    def busy_s(self) -> float:
        return sum(s.seconds for s in self.steps)

    @property
    def slot_utilisation(self) -> float:
        """Of the batch slots the engine computed (max_batch per step), the share
        that produced a token some request needed."""
        return sum(len(s.running) for s in self.steps) / (self.max_batch * len(self.steps))

    @property
    def padding_utilisation(self) -> float:
        """Of the slots actually occupied, the share doing useful work (static
        batching keeps finished sequences in the batch as padding)."""
        return sum(len(s.running) for s in self.steps) / sum(s.slots for s in self.steps)

    # Per-request metrics, in the order of the records.
    def latencies(self) -> list[float]:
        """End-to-end latencies (arrival -> last token)."""
        return [r.e2e_s for r in self.records]

    def ttfts(self) -> list[float]:
        """Times to first token, from arrival (queueing included)."""
        return [r.ttft_s for r in self.records]

    def tpots(self) -> list[float]:
        """Mean time per output token of every request with two or more tokens."""
        return [r.tpot_s for r in self.records if r.request.output_len > 1]

    def itls(self) -> list[float]:
        """Every inter-token latency of every request, pooled."""
        return [gap for r in self.records for gap in r.itl_s]

    def percentile(self, q: float, values: list[float] | None = None) -> float:
        """The q-th percentile (0-100) of e2e latency, or of `values` (nearest rank):
        the smallest value with at least q% of the values at or below it, the
        ceil(q/100 x n)-th smallest (p50 of 1..10 is 5, p90 is 9; p0 is the minimum)."""
        return percentile(self.latencies() if values is None else values, q)

    @property
    def mean_latency_s(self) -> float:
        """Mean end-to-end latency."""
        return statistics.fmean(self.latencies())

    @property
    def mean_ttft_s(self) -> float:
        """Mean TTFT, from arrival (queueing included)."""
        return statistics.fmean(self.ttfts())

    @property
    def mean_tpot_s(self) -> float:
        """Mean over requests of each request's TPOT."""
        return statistics.fmean(self.tpots())

    def summary(self) -> dict:
        ttft, tpot, itl = self.ttfts(), self.tpots(), self.itls()
        return {"policy": self.policy, "requests": len(self.records), "tokens": self.tokens,
                "makespan_s": self.makespan_s, "throughput_tok_s": self.throughput,
                "request_throughput_s": self.request_throughput,
                "mean_latency_s": self.mean_latency_s, "p50_latency_s": self.percentile(50),
                "p90_latency_s": self.percentile(90), "p99_latency_s": self.percentile(99),
                "mean_ttft_s": self.mean_ttft_s, "p50_ttft_s": percentile(ttft, 50),
                "p90_ttft_s": percentile(ttft, 90), "p99_ttft_s": percentile(ttft, 99),
                "mean_tpot_s": self.mean_tpot_s, "p90_tpot_s": percentile(tpot, 90),
                "p50_itl_s": percentile(itl, 50), "p99_itl_s": percentile(itl, 99),
                "slot_utilisation": self.slot_utilisation, "steps": len(self.steps)}


def simulate(requests: list[Request], policy: str = "continuous", max_batch: int = 8,
             cost: CostModel | None = None) -> BatchingResult:
    """Serve `requests` with static or continuous batching; every step is recorded."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be 'static' or 'continuous', got {policy!r}")
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    if not requests:
        raise ValueError("requests is empty; give at least one Request")
    cost = cost or CostModel()
    queue = sorted(requests, key=lambda r: (r.arrival_s, r.id))
    records = {r.id: RequestRecord(r) for r in queue}
    result = BatchingResult(policy, max_batch, cost, [records[r.id] for r in queue])
    left = {r.id: r.output_len for r in queue}          # tokens still to generate
    now, nxt = 0.0, 0                                   # nxt: first request not yet admitted
    running: list[int] = []                             # admitted, not finished
    batch: list[int] = []                               # static: the slots of the current batch

    def run_step(producing: list[int], prefill: list[int], slots: int) -> None:
        nonlocal now
        prefill_tokens = sum(records[i].request.prompt_len for i in prefill)
        if policy == "static" and prefill:
            # A static batch is one rectangular tensor: prompts padded to the longest.
            prefill_tokens = len(prefill) * max(records[i].request.prompt_len for i in prefill)
        # Every occupied slot that is not prefilling decodes (static: finished ones too, as padding).
        seconds = cost.step_s(slots - len(prefill), prefill_tokens)
        step = Step(now, seconds, list(producing), list(prefill), slots)
        result.steps.append(step)
        now += seconds
        for i in prefill:
            records[i].first_token_s = now
        for i in producing:
            left[i] -= 1
            records[i].token_s.append(now)
            if left[i] == 0:
                records[i].finish_s = now

    while nxt < len(queue) or running:
        if not running and queue[nxt].arrival_s > now:
            now = queue[nxt].arrival_s                  # idle until the next request arrives
        if policy == "continuous" or not running:
            # Admit what has arrived, up to the free slots (static: only into an empty engine).
            admitted = []
            while nxt < len(queue) and queue[nxt].arrival_s <= now and len(running) + len(admitted) < max_batch:
                admitted.append(queue[nxt].id)
                records[queue[nxt].id].start_s = now
                nxt += 1
            running += admitted
            if policy == "static" and admitted:
                batch = list(admitted)
        else:
            admitted = []
        # Continuous: the newcomers' prefill and the others' decode share one step.
        # Static: every slot of the batch is computed until its longest request is done.
        run_step(list(running), admitted, len(running) if policy == "continuous" else len(batch))
        running = [i for i in running if left[i] > 0]
    return result


def compare(requests: list[Request], max_batch: int = 8, cost: CostModel | None = None) -> dict[str, BatchingResult]:
    """Both policies on the same requests and costs."""
    return {p: simulate(requests, p, max_batch, cost) for p in POLICIES}
