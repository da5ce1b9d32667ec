"""FlashAttention's idea: attention in tiles, with an online softmax.

Ordinary attention builds the whole score matrix S = Q K^T / sqrt(d), of
shape (T queries, S keys), softmaxes each row and multiplies by V. For a long
sequence that matrix is the largest thing in memory, and on a GPU it travels
to slow memory (HBM) and back several times.

FlashAttention (Dao et al., 2022) never holds it. It walks over the keys one
block at a time and keeps, for each query row, three running quantities:

    m    the largest score seen so far           (for a stable exp)
    l    the sum of exp(score - m) so far        (the softmax denominator)
    acc  the sum of exp(score - m) * v so far    (the numerator, a d-vector)

When a new block raises the maximum from m to m_new, everything summed so
far was scaled by exp(-m) and must now be scaled by exp(-m_new): multiply
l and acc by exp(m - m_new). At the end, out = acc / l. That is the online
softmax (Milakov and Gimelshein, 2018): one pass, exact, block by block.

This file is the idea in plain PyTorch, for reading, not speed: the real
kernel keeps the tiles in on-chip SRAM and fuses the loop into one GPU
kernel, and that fusion is where the speed comes from. Here the point is
that the result equals ordinary attention while the largest score tensor
ever held is one (block_size x block_size) tile. `model.attention = "tiled"`
(or `with in_model(model):`) makes a whole model attend this way.

What is saved grows with the number of queries: a prefill (or a training
step) of T tokens has a T x T score matrix per head, a decode step one row
of T scores. FlashAttention is a prefill and training optimisation first;
for decode, Flash-Decoding (Dao, Haziza, Massa and Sizov, 2023) splits the
*keys* across thread blocks so that a single query row still fills a GPU,
and merges the partial results with the same rescaling rule.

Left out: the backward pass, dropout, and the work split across GPU thread
blocks (FlashAttention-2 parallelises over query blocks, as the outer loop
here could be; Flash-Decoding over key blocks, as the inner one could).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from .attention import causal_mask, group_query_heads


@dataclass
class FlashStats:
    """What a tiled run did: how many tiles, and the most scores held at once."""

    n_queries: int
    n_keys: int
    block_size: int
    tiles_computed: int = 0
    tiles_skipped: int = 0         # above the causal diagonal: never computed
    max_scores_held: int = 0       # elements of the largest score tile (per batch row and head)

    @property
    def full_scores(self) -> int:
        """Elements of the score matrix ordinary attention holds (per batch row and head)."""
        return self.n_queries * self.n_keys


def online_softmax(x: torch.Tensor, block_size: int) -> tuple[torch.Tensor, list[tuple[float, float]]]:
    """Softmax of a 1-D vector read block by block, keeping only a running max and sum.

    Returns the softmax and, after each block, (running max m, running sum l),
    so the rescaling can be watched. A second pass (exp(x - m) / l) writes the
    output; flash_attention avoids that pass by carrying the weighted sum of V
    along instead.
    """
    if x.dim() != 1 or block_size < 1:
        raise ValueError("x must be 1-D and block_size >= 1")
    m, l, history = float("-inf"), 0.0, []
    for start in range(0, len(x), block_size):
        block = x[start:start + block_size].double()
        m_new = max(m, float(block.max()))
        l = l * math.exp(m - m_new) + float(torch.exp(block - m_new).sum())   # rescale, then add
        m = m_new
        history.append((m, l))
    return (torch.exp(x.double() - m) / l).to(x.dtype), history


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int = 64, *, start: int = 0,
                    causal: bool = True, return_stats: bool = False):
    """softmax(Q K^T / sqrt(d)) V, computed tile by tile with an online softmax.

    q: (..., T, d); k, v: (..., S, d) with the same leading dimensions, or
    (B, n_kv_heads, S, d) against q (B, n_heads, T, d) for grouped-query
    attention. causal: query i sits at position start + i and sees keys
    0 .. start + i (labkit.attention's convention: start = 0 in a prefill,
    the number of cached tokens after a KV cache).

    The score tensor held at any moment is one (block_size x block_size) tile
    (per batch row and head), never the (T x S) matrix; tiles wholly above the
    causal diagonal are skipped. Arithmetic is in fp32, the output in q's dtype.
    return_stats: also return a FlashStats.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    T, S, d = q.shape[-2], k.shape[-2], q.shape[-1]
    if causal and start + T > S:
        raise ValueError(f"causal attention needs a key at every query's position: start + T = {start + T} "
                         f"> S = {S} keys")
    grouped = q.dim() == 4 and k.dim() == 4 and k.shape[1] != q.shape[1]
    if grouped:
        q, k, v = group_query_heads(q, k, v)                          # (B, kv, g, T, d), (B, kv, 1, S, d)
    scale = 1.0 / math.sqrt(d)
    stats = FlashStats(T, S, block_size)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    for q0 in range(0, T, block_size):
        q1 = min(q0 + block_size, T)
        qb = q[..., q0:q1, :].float() * scale                          # (..., bq, d)
        rows = qb.shape[:-1] + (1,)
        m = torch.full(rows, float("-inf"), device=q.device)           # running max
        l = torch.zeros(rows, device=q.device)                         # running denominator
        acc = torch.zeros(qb.shape, device=q.device)                   # running numerator (..., bq, d)
        # Causal: the last query of this block sits at start + q1 - 1; later keys are masked.
        end = min(S, start + q1) if causal else S
        for k0 in range(0, end, block_size):
            k1 = min(k0 + block_size, S)
            s = qb @ k[..., k0:k1, :].float().transpose(-1, -2)        # (..., bq, bk): the only scores held
            if causal and k1 - 1 > start + q0:                         # the tile crosses the diagonal
                # The tile's queries sit at start + q0 + i, its keys at k0 + j: counted from
                # k0, the first query is at start + q0 - k0.
                visible = causal_mask(q1 - q0, k1 - k0, start + q0 - k0, q.device)   # (bq, bk)
                s = s.masked_fill(~visible, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            p = torch.exp(s - m_new)                                   # (..., bq, bk)
            rescale = torch.exp(m - m_new)                             # old sums were relative to m
            l = l * rescale + p.sum(dim=-1, keepdim=True)
            acc = acc * rescale + p @ v[..., k0:k1, :].float()
            m = m_new
            stats.tiles_computed += 1
            stats.max_scores_held = max(stats.max_scores_held, (q1 - q0) * (k1 - k0))
        stats.tiles_skipped += math.ceil(S / block_size) - math.ceil(end / block_size)
        out[..., q0:q1, :] = (acc / l).to(q.dtype)
    if grouped:
        out = out.flatten(1, 2)                                        # (B, heads, T, d)
    return (out, stats) if return_stats else out


@contextmanager
def in_model(model, block_size: int = 64):
    """Inside the with block, `model` attends with flash_attention, so a whole
    model can be shown to give the same answer with tiled attention:

        with labkit.tiled_attention.in_model(model, block_size=16):
            gen = labkit.generate(model, "The capital of France is")

    It sets the model's validated settings (model.attention = "tiled",
    model.tiled_block_size) and restores them afterwards. Recording a trace
    still uses the by-hand path, which keeps the probabilities.
    """
    before = model.attention, model.tiled_block_size
    model.attention, model.tiled_block_size = "tiled", block_size
    try:
        yield model
    finally:
        model.attention, model.tiled_block_size = before
