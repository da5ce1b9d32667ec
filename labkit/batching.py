"""Continuous batching (连续批处理) against static batching, as a simulation.

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
- **Continuous batching** (iteration-level scheduling, Orca 2022; vLLM,
  TGI, TensorRT-LLM): the batch is re-formed at every step. A finished
  request leaves at once, and a waiting one joins at the next step: its
  prefill runs in that step, alongside the others' decode.

Nothing runs a model here: a `CostModel` says how long a step takes
(a fixed part plus a part per sequence and per prefilled token, fitted
from measurements with `CostModel.from_sweep` or given as numbers), and
the simulation adds up steps. It is deterministic: the same requests and
costs give the same result on every machine. charts.timeline_chart and
charts.summary_chart draw what `compare` returns.

Left out: memory limits and KV-cache paging (PagedAttention), chunked
prefill, preemption, priorities, and the time the scheduler itself takes.
A request's latency is its arrival to its last token, in both policies
(with streaming, a static batch's short answers need not wait for the
longest one, which is the kinder reading for static batching).
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, field



@dataclass(frozen=True)
class Request:
    id: int
    arrival_s: float
    prompt_len: int       # tokens to prefill
    output_len: int       # tokens to generate (the first comes from the prefill step)


def make_requests(n: int = 24, rate_per_s: float = 2.0, prompt_len: tuple[int, int] = (16, 128),
                  output_len: tuple[int, int] = (4, 96), seed: int = 0) -> list[Request]:
    """n requests arriving as a Poisson process (rate_per_s on average), with
    prompt and output lengths drawn uniformly from the given (low, high) ranges.
    The same seed gives the same requests on every machine."""
    if n < 1 or rate_per_s <= 0:
        raise ValueError("need n >= 1 and rate_per_s > 0")
    if not (1 <= prompt_len[0] <= prompt_len[1] and 1 <= output_len[0] <= output_len[1]):
        raise ValueError("lengths must be (low, high) ranges with 1 <= low <= high")
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

    (the base part is paid once if the step does anything at all)."""

    decode_base_s: float = 0.020
    decode_per_seq_s: float = 0.002
    prefill_per_token_s: float = 0.0005

    def step_s(self, batch: int, prefill_tokens: int = 0) -> float:
        if batch == 0 and prefill_tokens == 0:
            return 0.0
        return self.decode_base_s + self.decode_per_seq_s * batch + self.prefill_per_token_s * prefill_tokens

    @classmethod
    def from_sweep(cls, sweep) -> "CostModel":
        """Fit the cost model to a labkit.measure.BatchSweep: a straight line
        through decode step time against batch size (least squares), and the
        median prefill time per token."""
        xs, ys = sweep.batch_sizes, sweep.decode_s
        if len(xs) < 2:
            raise ValueError("need decode times at two or more batch sizes to fit a line")
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        slope = max(slope, 0.0)                         # a noisy machine can tilt the line down
        base = max(my - slope * mx, min(ys) * 0.5)
        per_token = statistics.median(s / (b * sweep.prompt_len) for b, s in zip(xs, sweep.prefill_s))
        return cls(base, slope, per_token)


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
    request: Request
    start_s: float = float("nan")         # its prefill began
    first_token_s: float = float("nan")   # end of its prefill step
    finish_s: float = float("nan")        # end of the step that produced its last token

    @property
    def queue_s(self) -> float:
        return self.start_s - self.request.arrival_s

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.request.arrival_s

    @property
    def latency_s(self) -> float:
        return self.finish_s - self.request.arrival_s


@dataclass
class BatchingResult:
    policy: str                         # "static" or "continuous"
    max_batch: int
    cost: CostModel
    records: list[RequestRecord]
    steps: list[Step] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(r.request.output_len for r in self.records)

    @property
    def makespan_s(self) -> float:
        """From the first arrival to the last token."""
        return max(r.finish_s for r in self.records) - min(r.request.arrival_s for r in self.records)

    @property
    def throughput(self) -> float:
        """Generated tokens per second over the makespan."""
        return self.tokens / self.makespan_s

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

    def latencies(self) -> list[float]:
        return [r.latency_s for r in self.records]

    def percentile(self, q: float, values: list[float] | None = None) -> float:
        """The q-th percentile (0-100) of request latency, or of `values` (nearest rank):
        the smallest value with at least q% of the values at or below it, the
        ceil(q/100 x n)-th smallest (p50 of 1..10 is 5, p90 is 9; p0 is the minimum)."""
        v = sorted(self.latencies() if values is None else values)
        # 1-based rank; q x n first, so 7% of 100 is 7, not 7.000000000000001 (ceil: 8),
        # and ceil, not round(), which rounds halves to even.
        rank = math.ceil(q * len(v) / 100)
        return v[min(len(v), max(1, rank)) - 1]

    @property
    def mean_latency_s(self) -> float:
        return statistics.fmean(self.latencies())

    @property
    def mean_ttft_s(self) -> float:
        return statistics.fmean(r.ttft_s for r in self.records)

    def summary(self) -> dict:
        return {"policy": self.policy, "requests": len(self.records), "tokens": self.tokens,
                "makespan_s": self.makespan_s, "throughput_tok_s": self.throughput,
                "mean_latency_s": self.mean_latency_s, "p90_latency_s": self.percentile(90),
                "mean_ttft_s": self.mean_ttft_s, "slot_utilisation": self.slot_utilisation,
                "steps": len(self.steps)}


def simulate(requests: list[Request], policy: str = "continuous", max_batch: int = 8,
             cost: CostModel | None = None) -> BatchingResult:
    """Serve `requests` with static or continuous batching; every step is recorded."""
    if policy not in ("static", "continuous"):
        raise ValueError(f"policy must be 'static' or 'continuous', got {policy!r}")
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
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
    return {p: simulate(requests, p, max_batch, cost) for p in ("static", "continuous")}
