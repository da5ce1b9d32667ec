"""A decode step that a CUDA graph can replay: static cache, static inputs.

On a GPU a decode step of a small model is hundreds of tiny kernels (one
SmolLM2-135M step dispatches 857 operations that compute, `count_ops`), and
launching them from Python can cost more than running them: the GPU waits
for the CPU. A CUDA graph records the launches of one step once and replays them
all with one call. Replaying needs every tensor at a fixed address and the
same shapes each time, so this step differs from `Model.forward` in three
ways (the blocks themselves are the same code, `Model.run_blocks`):

- the token and its position live in small preallocated tensors that are
  overwritten before each replay (a position given as a Python int would be
  frozen into the graph);
- the new K and V are written into the preallocated KVCache with
  `index_copy_` at that position tensor;
- attention (labkit.attention's SDPA path) reads a fixed number of cache
  slots, `n_keys`, rounded up from the used length to a multiple of
  `bucket`, and its causal mask hides the slots past the position. One
  graph is captured per bucket, so a step reads at most `bucket - 1`
  unused slots rather than the whole preallocated cache.

On the CPU there is no graph to capture: `GraphDecoder` runs the same step
eagerly, which is what the tests check against the eager path. What a graph
would remove can still be measured there: `count_ops` counts the PyTorch
operations one decode step dispatches, `op_overhead_s` times the fixed cost
of one tiny operation, and `launch_overhead` puts the two beside the step's
measured time (on a CPU the fixed cost is the dispatcher's and Python's, a few
microseconds per operation; on a GPU it is the kernel launch, and the work of
a small model's kernel can be shorter than its launch). Greedy only: sampling needs no change to the step,
but `greedy` is what the benchmark and tests need.

Left out: batches (B > 1) and beam search; torch.compile (an option,
`compile=True`, that fuses the small kernels before capture; not measured
yet).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .attention import attention_sdpa, causal_mask
from .model import Model
from .timing import median, sync, time_fn


def static_decode_step(model: Model, token: torch.Tensor, pos: torch.Tensor, cache, n_keys: int) -> torch.Tensor:
    """Logits (1, 1, vocab) of one token (1, 1) at position pos (1,), attending
    over cache slots 0..n_keys-1 of which 0..pos are valid. Writes K, V at pos.
    Does not change cache.length (the caller does)."""
    # Slots past pos may hold stale K, V: the causal mask of a query at position
    # pos hides them. pos is a tensor, so a captured graph replays at any position.
    visible = causal_mask(1, n_keys, pos, pos.device)        # (1, n_keys)

    def attend_layer(i, q, k, v):
        cache.k[i].index_copy_(2, pos, k)                    # (B, kv, max_len, hs) <- (B, kv, 1, hs)
        cache.v[i].index_copy_(2, pos, v)
        keys, values = cache.k[i, :, :, :n_keys], cache.v[i, :, :, :n_keys]   # (B, kv, n_keys, hs)
        return attention_sdpa(q, keys, values, start=pos, mask=visible)     # (B, heads, 1, hs)

    return model.run_blocks(token, pos, attend_layer)


@dataclass
class GreedyRun:
    token_ids: list[int]
    ttft_s: float
    step_seconds: list[float] = field(default_factory=list)

    @property
    def tpot_s(self) -> float:
        """Time per output token, the mean decode step (as Generation.tpot_s)."""
        return sum(self.step_seconds) / len(self.step_seconds) if self.step_seconds else float("nan")

    @property
    def tpot_median_s(self) -> float:
        """The median decode step: a noise-robust companion to tpot_s."""
        return median(self.step_seconds)


class GraphDecoder:
    """Prefill eagerly, then decode with one captured CUDA graph per bucket.

    decoder = GraphDecoder(model, max_len=1024)
    logits = decoder.prefill(ids)        # fills the cache
    logits = decoder.step(token)         # one token; replays a graph on CUDA
    """

    def __init__(self, model: Model, max_len: int, bucket: int = 256, use_graphs: bool | None = None,
                 compile: bool = False):
        self.model, self.bucket = model, bucket
        self.cache = model.new_cache(max_len)
        # Slots past the used length are read (and masked) by the fixed-size
        # attention: zeros there keep NaN garbage from reaching the sum.
        self.cache.k.zero_()
        self.cache.v.zero_()
        device = model.device
        self.use_graphs = device.type == "cuda" if use_graphs is None else use_graphs
        if self.use_graphs and device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.token = torch.zeros(1, 1, dtype=torch.long, device=device)   # static input buffers
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.fn = torch.compile(static_decode_step, dynamic=False) if compile else static_decode_step
        self.graphs: dict[int, tuple] = {}    # n_keys -> (graph, logits buffer)
        self.captures = 0

    def n_keys(self, pos: int) -> int:
        """Cache slots attention reads for a query at pos: pos + 1 rounded up to a bucket."""
        return min(self.cache.max_len, -(-(pos + 1) // self.bucket) * self.bucket)

    @torch.inference_mode()
    def prefill(self, ids) -> torch.Tensor:
        self.cache.reset()
        return self.model.forward(ids, cache=self.cache)[-1]            # (vocab,)

    @torch.inference_mode()
    def step(self, token) -> torch.Tensor:
        """Logits (vocab,) of one token placed after everything cached."""
        pos = self.cache.length
        self.cache.check_room(1)
        self.token.copy_(torch.as_tensor(token).view(1, 1))            # stays on the device: no sync
        self.pos.fill_(pos)
        n_keys = self.n_keys(pos)
        if self.use_graphs:
            graph, logits = self._graph(n_keys)
            graph.replay()
        else:
            logits = self.fn(self.model, self.token, self.pos, self.cache, n_keys)
        self.cache.length += 1
        return logits.view(-1)

    def _graph(self, n_keys: int):
        if n_keys not in self.graphs:
            # Warm up on a side stream (allocations, kernel choices, compilation),
            # then record. The warm-up runs the real step for the current token,
            # so what it writes into the cache is what the replay writes again.
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self.fn(self.model, self.token, self.pos, self.cache, n_keys)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            pool = next(iter(self.graphs.values()))[0].pool() if self.graphs else None
            with torch.cuda.graph(graph, pool=pool):
                logits = self.fn(self.model, self.token, self.pos, self.cache, n_keys)
            self.graphs[n_keys] = (graph, logits)
            self.captures += 1
        return self.graphs[n_keys]

    @torch.inference_mode()
    def greedy(self, ids, max_new_tokens: int, warmup: bool = True) -> GreedyRun:
        """Greedy tokens after the prompt ids, timing prefill and every decode step.

        warmup: first run once untimed, so graph capture is not in the timings."""
        ids = torch.as_tensor(ids, device=self.model.device).flatten()
        if warmup:
            self.greedy(ids, max_new_tokens, warmup=False)
        device = self.model.device
        sync(device)
        t0 = time.perf_counter()
        token = self.prefill(ids).argmax()
        sync(device)
        run = GreedyRun([], time.perf_counter() - t0)
        tokens = [token]
        for _ in range(max_new_tokens - 1):
            t0 = time.perf_counter()
            token = self.step(token).argmax()
            sync(device)
            run.step_seconds.append(time.perf_counter() - t0)
            tokens.append(token)
        run.token_ids = [int(t) for t in tokens]
        return run


# ----------------------------------------------------------------------------
# What a graph removes: the fixed cost of every operation, counted and timed
# ----------------------------------------------------------------------------

@dataclass
class OpCount:
    """The PyTorch operations one call dispatched, by name."""

    by_name: Counter
    views: int            # of them views and reshapes: no data moved, no kernel launched

    @property
    def total(self) -> int:
        return sum(self.by_name.values())

    @property
    def kernels(self) -> int:
        """Operations that compute (each launches at least one kernel on a GPU)."""
        return self.total - self.views


class _Counting(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.by_name, self.views = Counter(), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.by_name[func.overloadpacket.__name__] += 1
        self.views += bool(func.is_view)
        return func(*args, **(kwargs or {}))


def count_ops(fn) -> tuple[OpCount, object]:
    """Run fn() and count the ATen operations it dispatches. Returns (OpCount, fn's result).

    Counted at PyTorch's dispatcher, where each operation pays its fixed cost;
    under inference mode a composite operation (matmul, softmax) is one count,
    though on a GPU it may launch more than one kernel, so `kernels` is a lower
    bound on the launches."""
    with _Counting() as mode:
        result = fn()
    return OpCount(mode.by_name, mode.views), result


def op_overhead_s(device: str | torch.device = "cpu", n: int = 2000, repeats: int = 5) -> float:
    """Seconds of fixed cost per operation: n additions of one-element tensors,
    whose arithmetic is nothing, timed on `device` (fastest of `repeats`).

    On a CPU this is the cost of getting from Python through the dispatcher to
    a kernel; on a GPU, of launching a kernel (the loop waits for the GPU once,
    at the end, as a decode step does)."""
    if n < 1 or repeats < 1:
        raise ValueError(f"n and repeats must be >= 1, got n={n}, repeats={repeats}")
    a = torch.ones(1, device=device)
    b = torch.ones_like(a)

    def many():
        for _ in range(n):
            torch.add(a, b)

    t, _ = time_fn(many, device, repeats=repeats, warmup=1)
    return t.min / n


@dataclass
class LaunchOverhead:
    """One decode step's operations and their fixed cost, against its measured time."""

    ops: OpCount
    per_op_s: float           # op_overhead_s: one bare operation
    step_s: float             # the decode step, measured (fastest of the repeats)
    skeleton_step_s: float    # the same step of `skeleton(model)`: the same operations on tiny tensors

    @property
    def overhead_s(self) -> float:
        """Fixed cost of the step's computing operations: what a CUDA graph replays in one launch."""
        return self.ops.kernels * self.per_op_s

    @property
    def fraction(self) -> float:
        """overhead_s / step_s."""
        return self.overhead_s / self.step_s

    @property
    def per_op_in_model_s(self) -> float:
        """Fixed cost per operation as the model's own code pays it (Python, shapes,
        allocations, dispatch, launch): the skeleton's step / its operations."""
        return self.skeleton_step_s / self.ops.total

    @property
    def skeleton_fraction(self) -> float:
        """The skeleton's step / the model's step: the share of a step that is
        fixed cost (Python, dispatch, launches), not arithmetic or bytes."""
        return self.skeleton_step_s / self.step_s


def skeleton(model: Model) -> Model:
    """The same architecture (layers, heads, grouped-query attention, norms,
    RoPE) with every dimension tiny and random weights: one decode step
    dispatches the same operations as `model`'s, on tensors so small that
    their arithmetic costs nothing. Its step time is the fixed cost alone."""
    from transformers import AutoModelForCausalLM

    config = model.hf.config.__class__.from_dict(model.hf.config.to_dict())
    c = model.config
    if c.family == "gpt2":
        config.n_embd, config.n_inner, config.vocab_size = 2 * c.n_heads, 8, 64
    else:
        config.head_dim, config.hidden_size = 2, 2 * c.n_heads
        config.intermediate_size, config.vocab_size = 8, 64
    hf = AutoModelForCausalLM.from_config(config).to(model.device, model.dtype)
    return Model(hf, tokenizer=None, name=f"skeleton of {model.name}")


@torch.inference_mode()
def launch_overhead(model: Model, context: int = 32, repeats: int = 5) -> LaunchOverhead:
    """Count the operations of one eager decode step (Model.forward of one token
    after `context` cached ones); time the step, the same step of the model's
    skeleton, and the fixed cost of one bare operation."""
    if context < 1:
        raise ValueError(f"context must be >= 1, got {context!r}")
    ops, step_s = measure_decode_step(model, context, repeats)
    _, skeleton_s = measure_decode_step(skeleton(model), context, repeats)
    return LaunchOverhead(ops, op_overhead_s(model.device), step_s, skeleton_s)


def measure_decode_step(model: Model, context: int = 32, repeats: int = 5) -> tuple[OpCount, float]:
    """(operations dispatched, fastest time of `repeats`) of one eager decode
    step: Model.forward of one token after `context` cached positions."""
    device = model.device
    cache = model.new_cache(context + 1)
    model.forward(torch.zeros(context, dtype=torch.long, device=device), cache=cache)
    token = torch.zeros(1, dtype=torch.long, device=device)

    def step():
        cache.length = context                        # the same step every time
        return model.forward(token, cache=cache)

    ops, _ = count_ops(step)
    t, _ = time_fn(step, device, repeats=repeats, warmup=1)
    return ops, t.min
