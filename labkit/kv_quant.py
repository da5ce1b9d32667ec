"""KV-cache quantization: keys and values stored as int8, with one scale per token and head.

Weight quantization (labkit.quantize) shrinks what every decode step reads
once; the KV cache is the other thing a step reads, and it grows with the
context and with the batch. Storing it in int8 instead of fp32 / bf16 lets a
longer context (or more requests) fit in the same memory:

    fp32   4 bytes per value
    bf16   2
    int8   1 + one fp16 scale per (token, KV head): 1 + 2 / head_size

The scheme (symmetric absmax, as labkit.quantize's Int8Linear, but along the
head dimension): each new token's key (and value) vector of each KV head is
divided by scale = max |x| / 127 and rounded to an integer in [-127, 127].
The scale is per token, so a token is quantized once, when it is written,
and never again: the cache stays append-only, as serving engines need.
Reading de-quantizes (x ~ q * scale); the rounding error of each value is at
most scale / 2.

`Int8KVCache` has KVCache's interface (update, check_room, length, nbytes,
bytes_per_token, truncate, reorder, ...), so `Model.forward`,
`labkit.generation.prefill` and `decode_one_token` take it unchanged.
`compare_with_full_cache` measures what it costs: KL divergence and top-1
agreement of the next-token distributions against the model's own cache
along the same tokens, and whether the greedy text changes.

Left out: per-channel scales for keys (KIVI, KVQuant: keys have outlier
channels, which matters at 2-4 bits), int4 / fp8 caches, and kernels that
attend over int8 keys directly: here the cache is de-quantized on every read,
which saves memory, not time (on a GPU, fused kernels read the int8 bytes and
save the time too).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .generation import decode_one_token
from .kv_cache import KVCache
from .quantize import common_prefix, kl_divergence

QMAX = 127                       # symmetric int8: -127..127 (-128 unused, so the grid is symmetric)
SCALE_DTYPE = torch.float16      # what serving engines store scales in; 2 bytes each


def int8_bytes_per_token(n_layers: int, n_kv_heads: int, head_dim: int, batch_size: int = 1) -> int:
    """What an int8 cache grows by per token: 2 (K and V) x layers x batch x kv_heads
    x (head_size int8 values + one fp16 scale)."""
    return 2 * n_layers * batch_size * n_kv_heads * (head_dim + SCALE_DTYPE.itemsize)


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 along the last dimension: q (int8, x's shape) and scale
    (fp16, x's shape with a last dimension of 1), with x ~ q * scale and
    |x - q * scale| <= scale / 2 for every element."""
    amax = x.detach().float().abs().amax(dim=-1, keepdim=True)
    # The scale is rounded to fp16 first, and up where rounding made it smaller,
    # so amax / scale <= 127 and the values divided by the stored scale keep the
    # bound. An all-zero vector gets the smallest fp16 scale (no division by zero).
    scale = (amax / QMAX).to(SCALE_DTYPE)
    scale = torch.where(scale.float() * QMAX < amax, torch.nextafter(scale, torch.full_like(scale, torch.inf)), scale)
    scale = scale.clamp(min=2.0 ** -24)                               # fp16's smallest (subnormal) value
    q = (x.float() / scale.float()).round_().clamp_(-QMAX, QMAX)
    return q.to(torch.int8), scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """x ~ q * scale, in dtype."""
    return (q.float() * scale.float()).to(dtype)


class Int8KVCache(KVCache):
    """A KV cache that stores int8 keys and values with one fp16 scale per
    token and KV head, and de-quantizes them on read.

    Shapes:  k, v:              (layers, batch, kv_heads, max_len, head_size) int8
             k_scale, v_scale:  (layers, batch, kv_heads, max_len, 1)         fp16
    dtype: what update() returns (the model's activation dtype).
    """

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, max_len: int, *,
                 batch_size: int = 1, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu"):
        if not dtype.is_floating_point:
            raise ValueError(f"dtype (what reads return) must be a floating-point dtype, got {dtype}")
        super().__init__(n_layers, n_kv_heads, head_dim, max_len, batch_size=batch_size,
                         dtype=torch.int8, device=device)
        scale_shape = (n_layers, batch_size, n_kv_heads, max_len, 1)
        self.k_scale = torch.empty(scale_shape, dtype=SCALE_DTYPE, device=device)
        self.v_scale = torch.empty(scale_shape, dtype=SCALE_DTYPE, device=device)
        self.dtype = dtype

    def update(self, layer: int, pos: int, k: torch.Tensor, v: torch.Tensor):
        """Quantize k, v (batch, kv_heads, T, head_size) into positions pos..pos+T-1
        of one layer; return that layer's de-quantized keys and values for 0..pos+T-1."""
        end = pos + k.shape[-2]
        if end > self.max_len:
            raise ValueError(
                f"KV cache is full: writing positions {pos}..{end - 1} but max_len={self.max_len}. "
                f"Create a larger cache with new_int8_cache(model, max_len=...)")
        self.k[layer, :, :, pos:end], self.k_scale[layer, :, :, pos:end] = quantize_int8(k)
        self.v[layer, :, :, pos:end], self.v_scale[layer, :, :, pos:end] = quantize_int8(v)
        keys = dequantize_int8(self.k[layer, :, :, :end], self.k_scale[layer, :, :, :end], self.dtype)
        values = dequantize_int8(self.v[layer, :, :, :end], self.v_scale[layer, :, :, :end], self.dtype)
        return keys, values                                   # (B, kv, end, hs)

    def reorder(self, index: torch.Tensor) -> None:
        """Reorder the batch rows, scales with their values."""
        super().reorder(index)
        self.k_scale = self.k_scale.index_select(1, index)
        self.v_scale = self.v_scale.index_select(1, index)

    @property
    def bytes_per_token(self) -> int:
        """Bytes one more position takes: int8 values and their fp16 scales."""
        n_layers, batch, kv_heads, _, head_dim = self.k.shape
        return int8_bytes_per_token(n_layers, kv_heads, head_dim, batch)

    @property
    def allocated_nbytes(self) -> int:
        """Bytes reserved for max_len positions, scales included."""
        return self.k.nbytes + self.v.nbytes + self.k_scale.nbytes + self.v_scale.nbytes

    def __repr__(self) -> str:
        return "Int8" + super().__repr__()


def new_int8_cache(model, max_len: int = 1024, batch_size: int = 1) -> Int8KVCache:
    """An empty int8 KV cache for `model` (what model.new_cache gives, in int8):
    up to max_len positions; reads come back in the model's dtype."""
    config = model.config
    if not 1 <= max_len <= config.max_len:
        raise ValueError(f"max_len must be in [1, {config.max_len}] (the model's context), got {max_len}")
    return Int8KVCache(config.n_layers, config.n_kv_heads, config.head_dim, max_len, batch_size=batch_size,
                       dtype=model.dtype, device=model.device)


# ----------------------------------------------------------------------------
# What it costs: the same model with its own cache and with the int8 one
# ----------------------------------------------------------------------------

@dataclass
class CacheComparison:
    """An int8 cache against the model's own, along the same tokens."""
    ref_token_ids: list[int]      # greedy continuation with the model's own cache
    token_ids: list[int]          # greedy continuation with the int8 cache
    kl: torch.Tensor              # KL(own || int8) at every position (prompt + forced continuation), nats
    top1: torch.Tensor            # bool: the same most likely token at that position
    cache_len: int                # positions each cache held at the end
    ref_nbytes: int               # bytes each cache held at the end
    nbytes: int

    @property
    def kl_mean(self) -> float:
        return float(self.kl.mean())

    @property
    def kl_max(self) -> float:
        return float(self.kl.max())

    @property
    def top1_agreement(self) -> float:
        return float(self.top1.float().mean())

    @property
    def n_positions(self) -> int:
        return len(self.kl)

    @property
    def greedy_identical(self) -> bool:
        return self.token_ids == self.ref_token_ids

    @property
    def greedy_prefix(self) -> int:
        """Greedy tokens equal before the first difference."""
        return common_prefix(self.token_ids, self.ref_token_ids)


@torch.inference_mode()
def _run(model, ids: list[int], cache, n_new: int, forced: list[int] | None) -> tuple[list[int], torch.Tensor]:
    """Prefill ids into cache, then n_new - 1 decode steps. Each step feeds the
    token just chosen: the argmax (greedy), or forced[i] (teacher forcing).
    Returns the chosen tokens and the logits at every position (T + n_new - 1, vocab)."""
    logits = [model.forward(ids, cache=cache).float().cpu()]          # (T, vocab): all prompt positions
    tokens = []
    for i in range(n_new):
        token = forced[i] if forced is not None else int(logits[-1][-1].argmax())
        tokens.append(token)
        if i < n_new - 1:
            step = decode_one_token(model, torch.tensor([token], device=model.device), cache)
            logits.append(step.float().cpu().reshape(1, -1))          # (1, vocab)
    return tokens, torch.cat(logits)


def compare_with_full_cache(model, prompt_ids: list[int], max_new_tokens: int = 16) -> CacheComparison:
    """The model with its own cache (model.new_cache: its dtype) and with an
    Int8KVCache: greedy continuations of prompt_ids from each (EOS ignored),
    then the next-token distributions of both along the same tokens (the
    prompt and the own cache's continuation, teacher forcing) compared at
    every position with labkit.quantize.kl_divergence.

    With a cache, the prompt's own positions already attend over de-quantized
    keys and values (prefill writes them, then reads them back), so they count too.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    ids = list(prompt_ids)
    if not ids:
        raise ValueError("prompt_ids must hold at least one token id")
    max_len = len(ids) + max_new_tokens
    own = model.new_cache(max_len=max_len)
    ref_tokens, ref_logits = _run(model, ids, own, max_new_tokens, None)
    int8 = new_int8_cache(model, max_len=max_len)
    _, logits = _run(model, ids, int8, max_new_tokens, ref_tokens)   # along the reference's tokens
    int8_free = new_int8_cache(model, max_len=max_len)
    tokens, _ = _run(model, ids, int8_free, max_new_tokens, None)    # its own greedy choices
    return CacheComparison(ref_tokens, tokens, kl_divergence(ref_logits, logits),
                           ref_logits.argmax(-1) == logits.argmax(-1), int8.length, own.nbytes, int8.nbytes)
