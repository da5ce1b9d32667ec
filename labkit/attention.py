"""Attention, in one place: the causal mask, grouped-query heads, and the choice
of implementation.

Every attention call in labkit has the same arguments and conventions:

    q: (B, n_heads, T, hs)      the queries of T new positions
    k, v: (B, n_kv_heads, S, hs) every key and value they may read (cached + new)
    start: the position of the first query; query i sits at start + i and
           sees keys 0 .. start + i (keys sit at positions 0 .. S - 1)

In a prefill start = 0 and S = T; in a decode step with a KV cache start is
the number of cached tokens and S = start + 1. The captured CUDA-graph step
(labkit.cuda_graphs) passes start as a one-element tensor, so one graph can
replay at every position.

Three implementations give the same output (tests/test_forward.py checks
each against transformers); `model.attention` picks one:

    "sdpa"     PyTorch's fused kernel (scaled_dot_product_attention): fast, the default
    "by_hand"  scores / sqrt(hs) -> causal mask -> softmax -> weighted sum, written
               out as in notebook 03; it also returns the probabilities, so recording
               a Trace always uses it
    "tiled"    FlashAttention's tiles and online softmax (Dao et al. 2022;
               labkit.tiled_attention)

Left out: sliding-window attention, padding masks for batches of unequal
length, dropout (inference only), and ALiBi or other score biases.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

IMPLEMENTATIONS = ("sdpa", "by_hand", "tiled")


def check_implementation(name: str) -> str:
    """name, if it is one of IMPLEMENTATIONS; a ValueError naming them if not."""
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"attention must be one of {', '.join(map(repr, IMPLEMENTATIONS))}; got {name!r}")
    return name


def causal_mask(n_queries: int, n_keys: int, start, device=None) -> torch.Tensor:
    """True where query i (at position start + i) may look at key j: j <= start + i.

    start: an int, or a one-element tensor (a position that changes between
    replays of a CUDA graph). Returns (n_queries, n_keys) booleans."""
    q_pos = (start + torch.arange(n_queries, device=device))[:, None]   # (T, 1)
    k_pos = torch.arange(n_keys, device=device)[None, :]               # (1, S)
    return k_pos <= q_pos                                              # (T, S)


def group_query_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """Grouped-query attention without copying K and V.

    GQA (Ainslie et al. 2023) is fixed when the model is trained: it has only
    n_kv_heads key/value projections, so its cache holds n_kv_heads heads.
    Query heads j*g .. j*g+g-1 (g = n_heads // n_kv_heads) all read KV head j.
    Viewing the query heads as (kv_heads, g) and giving K and V a group axis of
    size 1 lets broadcasting share them. Multi-head attention is the case g = 1.
    q: (B, n_heads, T, hs) -> (B, kv, g, T, hs); k, v: (B, kv, S, hs) -> (B, kv, 1, S, hs).
    `.flatten(1, 2)` turns a grouped output back into (B, n_heads, T, hs)."""
    B, n_heads, T, hs = q.shape
    n_kv = k.shape[1]
    if n_heads % n_kv:
        raise ValueError(f"query heads ({n_heads}) must be a multiple of KV heads ({n_kv})")
    return q.view(B, n_kv, n_heads // n_kv, T, hs), k[:, :, None], v[:, :, None]


# ----------------------------------------------------------------------------
# The implementations
# ----------------------------------------------------------------------------

def attention_by_hand(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start=0):
    """Attention written out, with grouped-query sharing of K and V made visible.

    Returns the output (B, n_heads, T, hs) and the probabilities (B, n_heads, T, S)."""
    T, S, hs = q.shape[2], k.shape[2], q.shape[3]
    q, k, v = group_query_heads(q, k, v)                      # (B, kv, g, T, hs), (B, kv, 1, S, hs)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hs)          # (B, kv, g, T, S)
    scores = scores.masked_fill(~causal_mask(T, S, start, q.device), float("-inf"))
    probs = scores.softmax(dim=-1, dtype=torch.float32).to(q.dtype)  # each row sums to 1
    out = probs @ v                                           # (B, kv, g, T, hs)
    return out.flatten(1, 2), probs.flatten(1, 2)             # (B, heads, T, hs), (B, heads, T, S)


def attention_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start=0,
                   mask: torch.Tensor | None = None) -> torch.Tensor:
    """The same output from PyTorch's fused kernel (no probabilities kept).

    mask: causal_mask(T, S, start), when the caller has built it already (the
    captured CUDA-graph step builds it once per step rather than once per layer)."""
    B, n_heads, T, hs = q.shape
    n_kv, S = k.shape[1], k.shape[2]
    if mask is None and not isinstance(start, int):
        mask = causal_mask(T, S, start, q.device)             # a position held in a tensor
    if T == 1:
        # One query (a decode step). Folding the query heads of a group into the
        # query axis lets one plain kernel call serve every group without
        # repeating K and V; the g "queries" sit at the same position, so they
        # share one mask row. With a KV cache the query sees every key
        # (S = start + 1) and needs no mask at all.
        if mask is None and S != start + 1:
            mask = causal_mask(1, S, start, q.device)         # (1, S)
        q = q.view(B, n_kv, n_heads // n_kv, hs)               # (B, kv, g, hs)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)   # (B, kv, g, hs)
        return out.view(B, n_heads, 1, hs)
    gqa = n_kv != n_heads     # the kernel shares each KV head among its group itself
    if mask is None and start == 0:
        # is_causal is the mask of start = 0 (query i sees keys 0..i), without building it.
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    if mask is None:
        mask = causal_mask(T, S, start, q.device)             # (T, S)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start=0, implementation: str = "sdpa",
           block_size: int = 64) -> torch.Tensor:
    """The attention output (B, n_heads, T, hs) from the chosen implementation.

    block_size: the tile size of "tiled"."""
    check_implementation(implementation)
    if implementation == "by_hand":
        return attention_by_hand(q, k, v, start)[0]
    if implementation == "tiled":
        # Imported here: tiled_attention builds on this file's mask and grouping.
        from .tiled_attention import flash_attention
        return flash_attention(q, k, v, block_size, start=start)
    return attention_sdpa(q, k, v, start)
