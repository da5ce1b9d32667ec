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
ever held is one (block_size x block_size) tile.

Left out: the backward pass, dropout, and the work split across GPU thread
blocks (FlashAttention-2 parallelises over query blocks, as the outer loop
here could be).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

import torch


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


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int = 64,
                    causal: bool = True, return_stats: bool = False):
    """softmax(Q K^T / sqrt(d)) V, computed tile by tile with an online softmax.

    q: (..., T, d); k, v: (..., S, d) with the same leading dimensions, or
    (B, n_kv_heads, S, d) against q (B, n_heads, T, d) for grouped-query
    attention. With causal=True query i sits at position S - T + i (the
    queries are the newest T of the S positions, as in prefill or in a
    decode step against a KV cache) and sees keys 0 .. S - T + i.

    The score tensor held at any moment is one (block_size x block_size) tile
    (per batch row and head), never the (T x S) matrix; tiles wholly above the
    causal diagonal are skipped. Arithmetic is in fp32, the output in q's dtype.
    return_stats: also return a FlashStats.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if q.dim() == 4 and k.dim() == 4 and k.shape[1] != q.shape[1]:
        # Grouped-query attention: query heads j*g .. j*g+g-1 read KV head j.
        # A group axis of size 1 on K and V lets broadcasting share them.
        B, H, T, d = q.shape
        out = flash_attention(q.view(B, k.shape[1], H // k.shape[1], T, d), k[:, :, None], v[:, :, None],
                              block_size, causal, return_stats)
        if return_stats:
            return out[0].reshape(B, H, T, d), out[1]
        return out.reshape(B, H, T, d)
    T, S, d = q.shape[-2], k.shape[-2], q.shape[-1]
    if causal and T > S:
        raise ValueError(f"causal attention needs at least as many keys as queries, got {T} > {S}")
    scale = 1.0 / math.sqrt(d)
    offset = S - T                      # position of query 0
    stats = FlashStats(T, S, block_size)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    for q0 in range(0, T, block_size):
        q1 = min(q0 + block_size, T)
        qb = q[..., q0:q1, :].float() * scale                          # (..., bq, d)
        rows = qb.shape[:-1] + (1,)
        m = torch.full(rows, float("-inf"), device=q.device)           # running max
        l = torch.zeros(rows, device=q.device)                         # running denominator
        acc = torch.zeros(qb.shape, device=q.device)                   # running numerator (..., bq, d)
        # Causal: the last query of this block sits at offset + q1 - 1; later keys are masked.
        end = min(S, offset + q1) if causal else S
        for k0 in range(0, end, block_size):
            k1 = min(k0 + block_size, S)
            s = qb @ k[..., k0:k1, :].float().transpose(-1, -2)        # (..., bq, bk): the only scores held
            if causal and k1 - 1 > offset + q0:                        # the tile crosses the diagonal
                q_pos = torch.arange(offset + q0, offset + q1, device=q.device)[:, None]
                k_pos = torch.arange(k0, k1, device=q.device)[None, :]
                s = s.masked_fill(k_pos > q_pos, float("-inf"))
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
    return (out, stats) if return_stats else out


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """Ordinary attention, the whole (T x S) score matrix at once, for comparison.

    Same conventions as flash_attention (queries are the newest T positions)."""
    if q.dim() == 4 and k.dim() == 4 and k.shape[1] != q.shape[1]:
        B, H, T, d = q.shape
        return naive_attention(q.view(B, k.shape[1], H // k.shape[1], T, d), k[:, :, None], v[:, :, None],
                               causal).reshape(B, H, T, d)
    T, S, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scores = q.float() @ k.float().transpose(-1, -2) / math.sqrt(d)   # (..., T, S): all of it
    if causal:
        q_pos = torch.arange(S - T, S, device=q.device)[:, None]
        scores = scores.masked_fill(torch.arange(S, device=q.device)[None, :] > q_pos, float("-inf"))
    return (scores.softmax(dim=-1) @ v.float()).to(q.dtype)


@contextmanager
def in_models(block_size: int = 64):
    """Inside the with block, every labkit model's fast attention path runs
    flash_attention instead of PyTorch's kernel, so a whole model can be shown
    to give the same answer with tiled attention:

        with labkit.tiled_attention.in_models(block_size=16):
            gen = labkit.generate(model, "The capital of France is")

    (The model calls attention with its queries as the newest positions of
    the keys, prefill and decode alike: flash_attention's causal convention.)
    Recording attention (record=True) still uses the by-hand path.
    """
    from . import model as model_module

    original = model_module.attention_fast

    def tiled(q, k, v, start):
        return flash_attention(q, k, v, block_size, causal=True)

    model_module.attention_fast = tiled
    try:
        yield
    finally:
        model_module.attention_fast = original


# ----------------------------------------------------------------------------
# Chart (data in, figure out, as in viz)
# ----------------------------------------------------------------------------

def tiles_chart(n_queries: int, n_keys: int, block_size: int, causal: bool = True,
                title: str = "FlashAttention's tiles") -> "go.Figure":
    """The (queries x keys) score matrix cut into block_size tiles: computed in
    full, computed with the causal mask inside (on the diagonal), or skipped.
    Only one tile's scores exist at any moment."""
    import plotly.graph_objects as go

    from . import charts

    offset = n_keys - n_queries
    kinds = {"computed": charts.BLUE, "on the diagonal (masked inside)": charts.ORANGE, "skipped (all masked)": charts.GREY}
    shapes, hover = {k: [] for k in kinds}, {k: [] for k in kinds}
    for q0 in range(0, n_queries, block_size):
        q1 = min(q0 + block_size, n_queries)
        for k0 in range(0, n_keys, block_size):
            k1 = min(k0 + block_size, n_keys)
            if causal and k0 > offset + q1 - 1:
                kind = "skipped (all masked)"
            elif causal and k1 - 1 > offset + q0:
                kind = "on the diagonal (masked inside)"
            else:
                kind = "computed"
            shapes[kind].append((k0, k1, q0, q1))
            hover[kind].append(f"queries {q0}-{q1 - 1}, keys {k0}-{k1 - 1}<br>{kind}")
    fig = go.Figure()
    for kind, colour in kinds.items():
        xs, ys = [], []
        for k0, k1, q0, q1 in shapes[kind]:
            xs += [k0, k1, k1, k0, k0, None]
            ys += [q0, q0, q1, q1, q0, None]
        fig.add_trace(go.Scatter(x=xs or [None], y=ys or [None], fill="toself", mode="lines", fillcolor=colour,
                                 line=dict(color="white", width=2), name=f"{kind}: {len(shapes[kind])}",
                                 hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=[(a + b) / 2 for a, b, _, _ in shapes[kind]],
                                 y=[(c + d) / 2 for _, _, c, d in shapes[kind]], mode="markers",
                                 marker=dict(size=1, opacity=0), hovertext=hover[kind], hoverinfo="text",
                                 showlegend=False))
    fig.update_xaxes(title="key position", range=[0, n_keys], constrain="domain")
    fig.update_yaxes(title="query position", range=[n_queries, 0], scaleanchor="x", scaleratio=1)
    held = min(block_size, n_queries) * min(block_size, n_keys)
    sub = (f"{n_queries} x {n_keys} scores = {n_queries * n_keys:,} per head; held at once: one "
           f"{min(block_size, n_queries)} x {min(block_size, n_keys)} tile = {held:,}")
    fig.update_layout(title=charts._title(title, sub), width=900, height=620, margin=dict(t=110),
                      legend=dict(x=1.02, y=1, xanchor="left", yanchor="top"))
    return charts.fit_title(fig)
