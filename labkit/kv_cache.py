"""The KV cache: preallocated per-layer keys and values.

During prefill every layer computes K and V for the whole prompt and stores
them here; each decode step then computes K and V for one new token only and
attends over everything stored so far. Without the cache, every step would
recompute K and V for the whole sequence.

The storage is allocated once, at `max_len` positions, so the cache never
copies itself as it grows. Layers read back only the positions in use
(`[:length]`), never the empty tail. That suits one request (or a fixed batch)
at a time, as labkit runs; it is not what serving engines do: reserving
max_len positions for every request wastes the memory of every answer that
ends early, and that waste is what PagedAttention (vLLM, Kwon et al. 2023)
removes, with a shared pool of fixed-size blocks handed to each request on
demand (notebook 10).

Shapes:  k, v: (layers, batch, kv_heads, max_len, head_size)
"""

from __future__ import annotations

import torch


def bytes_per_token(n_layers: int, n_kv_heads: int, head_dim: int, bytes_per_value: int,
                    batch_size: int = 1) -> int:
    """What the cache grows by per token: 2 (K and V) x layers x batch x kv_heads
    x head_size x bytes per value. The one home of this formula (labkit.costs and
    the charts call it): a cache's size follows from its shapes, nothing else."""
    return 2 * n_layers * batch_size * n_kv_heads * head_dim * bytes_per_value


class KVCache:
    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, max_len: int, *,
                 batch_size: int = 1, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu"):
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        shape = (n_layers, batch_size, n_kv_heads, max_len, head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.length = 0  # positions filled, the same for every layer after a forward

    # -- the two operations a forward pass needs ---------------------------------

    def update(self, layer: int, pos: int, k: torch.Tensor, v: torch.Tensor):
        """Write k, v (batch, kv_heads, T, head_size) at positions pos..pos+T-1 of
        one layer; return that layer's keys and values for positions 0..pos+T-1."""
        end = pos + k.shape[-2]
        if end > self.max_len:
            raise ValueError(
                f"KV cache is full: writing positions {pos}..{end - 1} but max_len={self.max_len}. "
                f"Create a larger cache with model.new_cache(max_len=...)")
        self.k[layer, :, :, pos:end] = k
        self.v[layer, :, :, pos:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def check_room(self, n_new: int) -> None:
        """Fail before any layer runs if n_new more positions do not fit."""
        if self.length + n_new > self.max_len:
            raise ValueError(
                f"KV cache is full: it holds {self.length} of max_len={self.max_len} positions "
                f"and {n_new} more were asked for. Create a larger cache with "
                f"model.new_cache(max_len=...)")

    # -- bookkeeping -------------------------------------------------------------

    def reset(self) -> None:
        """Forget everything (the storage stays allocated)."""
        self.length = 0

    def truncate(self, length: int) -> None:
        """Keep only the first `length` positions (used when a draft is rejected)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"length must be in [0, {self.length}], got {length}")
        self.length = length

    def reorder(self, index: torch.Tensor) -> None:
        """Reorder the batch rows (beam search keeps the cache of the beams it keeps)."""
        self.k = self.k.index_select(1, index)
        self.v = self.v.index_select(1, index)

    @property
    def n_layers(self) -> int:
        return self.k.shape[0]

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    @property
    def bytes_per_token(self) -> int:
        """Bytes one more position takes: the module's bytes_per_token for this cache's shapes."""
        n_layers, batch, kv_heads, _, head_dim = self.k.shape
        return bytes_per_token(n_layers, kv_heads, head_dim, self.k.element_size(), batch)

    @property
    def nbytes(self) -> int:
        """Bytes holding cached keys and values (grows by bytes_per_token a token)."""
        return self.length * self.bytes_per_token

    @property
    def allocated_nbytes(self) -> int:
        """Bytes reserved for max_len positions."""
        return self.k.nbytes + self.v.nbytes

    def __repr__(self) -> str:
        n_layers, batch, kv_heads, _, head_dim = self.k.shape
        return (f"KVCache(layers={n_layers}, batch={batch}, kv_heads={kv_heads}, "
                f"head_size={head_dim}, length={self.length}/{self.max_len}, "
                f"{self.nbytes / 1e6:.2f} MB used of {self.allocated_nbytes / 1e6:.2f} MB)")
