"""A decode step that a CUDA graph can replay: static cache, static inputs.

On a GPU a decode step of a small model is a few hundred tiny kernels, and
launching them from Python costs more than running them: the GPU waits for
the CPU. A CUDA graph records the launches of one step once and replays them
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
eagerly (launch overhead is small there), which is what the tests check
against the eager path. Greedy only: sampling needs no change to the step,
but `greedy` is what the benchmark and tests need.

Left out: batches (B > 1) and beam search; torch.compile (an option,
`compile=True`, that fuses the small kernels before capture; not measured
yet).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .attention import attention_sdpa, causal_mask
from .model import Model
from .timing import median, sync


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
