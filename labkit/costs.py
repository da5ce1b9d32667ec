"""Counting work and bytes: FLOPs, bytes moved and arithmetic intensity of a forward pass.

These are the formulas behind the roofline argument of notebooks 04 and 07:

    FLOPs of a matmul (m x k) @ (k x n)  = 2 m k n   (one multiply + one add)
    prefill of T tokens  ~ 2 x params x T     FLOPs, reading the weights once
    one decode step      ~ 2 x params         FLOPs, reading the weights once
                                              and the whole KV cache

so a prefill of T tokens does about T times more arithmetic per byte read
than a decode step: 2T FLOPs per weight, i.e. 2T / bytes_per_weight FLOP
per byte. It is compute-bound only once that passes the machine's ridge
point (peak FLOP/s / memory bandwidth), i.e. from about

    T* = ridge x bytes_per_weight / 2  tokens (x batch: B prompts share the reads)

(`crossover_tokens`; `prefill_crossover_tokens` counts it exactly, attention
and KV bytes included). A short prompt is memory-bound like a decode step.
A decode step does 2 FLOPs per 4-byte fp32 weight, 0.5 FLOP per byte, well
below the ridge of current CPUs and GPUs (memory-bandwidth-bound).
The bytes side:

    bytes_per_value(dtype)        4 for fp32, 2 for bf16, 1 for int8
    kv_bytes_per_token(config)    what the KV cache grows by (labkit.kv_cache.bytes_per_token)
    forward_bytes                 every weight once + the K and V read and written

Counted: every matmul of the blocks (projections, attention scores and
weighted sum, MLP) and the LM head. Left out, because they are small next to
those: norms, softmax, RoPE, activations, residual additions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import kv_cache
from .model import ModelConfig


def matmul_params(c: ModelConfig) -> int:
    """Weights that multiply activations in one forward pass (embedding lookup excluded;
    the LM head included even when it is tied to the embedding)."""
    d, hs = c.d_model, c.head_dim
    attn = d * c.n_heads * hs + 2 * d * c.n_kv_heads * hs + c.n_heads * hs * d   # q, k, v, o
    n_mlp = 2 if c.family == "gpt2" else 3                                       # GELU: up, down; SwiGLU: gate, up, down
    mlp = n_mlp * d * c.d_ff
    return c.n_layers * (attn + mlp) + d * c.vocab_size


def forward_flops(c: ModelConfig, n_tokens: int, n_cached: int = 0, last_only: bool = False) -> int:
    """FLOPs of one forward pass over n_tokens new tokens after n_cached cached ones.

    last_only: count the LM head for the last position only (what generation needs).
    """
    d, hs = c.d_model, c.head_dim
    per_token_blocks = 2 * (matmul_params(c) - d * c.vocab_size)
    # Attention: query i attends to n_cached + i + 1 keys; scores (q.k) and the
    # weighted sum (p.v) are each 2 x head_size FLOPs per key per head.
    keys = n_tokens * n_cached + n_tokens * (n_tokens + 1) // 2
    attention = c.n_layers * c.n_heads * 2 * (2 * hs) * keys
    head_tokens = 1 if last_only else n_tokens
    return per_token_blocks * n_tokens + attention + 2 * d * c.vocab_size * head_tokens


def bytes_per_value(dtype: torch.dtype) -> int:
    """Bytes one number takes in `dtype`: 4 for fp32, 2 for bf16 / fp16, 1 for int8."""
    return dtype.itemsize


def kv_bytes_per_token(c: ModelConfig, bytes_per_value: int = 2, batch_size: int = 1) -> int:
    """2 (K and V) x layers x kv_heads x head_size x bytes per value (x batch):
    labkit.kv_cache.bytes_per_token for this configuration's shapes."""
    return kv_cache.bytes_per_token(c.n_layers, c.n_kv_heads, c.head_dim, bytes_per_value, batch_size)


def forward_bytes(weight_nbytes: int, kv_bytes_per_token: int, n_positions: int, batch_size: int = 1) -> int:
    """Bytes a forward pass must move at least: every weight once (shared by the
    batch), and for each sequence the K and V of its n_positions positions
    (the cached ones read, the new ones written)."""
    return weight_nbytes + kv_bytes_per_token * n_positions * batch_size


@dataclass
class Workload:
    name: str
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        """Arithmetic intensity: FLOPs per byte moved."""
        return self.flops / self.bytes


def _model_kv_bytes_per_token(model) -> int:
    """The KV cache is kept in the model's activation dtype (also for a quantized model)."""
    return kv_bytes_per_token(model.config, bytes_per_value(model.dtype))


def prefill_workload(model, n_tokens: int, batch_size: int = 1) -> Workload:
    c = model.config
    flops = forward_flops(c, n_tokens, last_only=True) * batch_size
    nbytes = forward_bytes(model.weight_nbytes, _model_kv_bytes_per_token(model), n_tokens, batch_size)
    return Workload(f"prefill {n_tokens} tokens" + (f" x {batch_size}" if batch_size > 1 else ""),
                    flops, nbytes)


def decode_workload(model, n_cached: int, batch_size: int = 1) -> Workload:
    c = model.config
    flops = forward_flops(c, 1, n_cached) * batch_size
    nbytes = forward_bytes(model.weight_nbytes, _model_kv_bytes_per_token(model), n_cached + 1, batch_size)
    return Workload("decode step" + (f" x {batch_size}" if batch_size > 1 else ""), flops, nbytes)


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """The intensity (FLOP/byte) above which a machine is compute-bound: peak FLOP/s / bytes/s."""
    if peak_flops <= 0 or bandwidth <= 0:
        raise ValueError(f"peak_flops and bandwidth must be > 0, got {peak_flops} and {bandwidth}")
    return peak_flops / bandwidth


# ----------------------------------------------------------------------------
# When does a prefill become compute-bound?
# ----------------------------------------------------------------------------

def crossover_tokens(ridge: float, bytes_per_weight: float) -> float:
    """Prompt tokens (x batch) at which a prefill reaches the ridge point,
    counting the weights only: each token does 2 FLOPs per weight, and each
    weight (bytes_per_weight bytes) is read once for all of them, so the
    intensity is 2T / bytes_per_weight and reaches `ridge` at
    T = ridge x bytes_per_weight / 2. Attention FLOPs and KV bytes are left
    out (a few percent for short prompts; prefill_crossover_tokens counts them)."""
    if ridge <= 0 or bytes_per_weight <= 0:
        raise ValueError(f"ridge and bytes_per_weight must be > 0, got {ridge} and {bytes_per_weight}")
    return ridge * bytes_per_weight / 2


def prefill_intensity(c: ModelConfig, n_tokens: int, weight_nbytes: int, kv_bytes_per_token: int,
                      batch_size: int = 1) -> float:
    """Arithmetic intensity (FLOP/byte) of prefilling batch_size prompts of n_tokens,
    counted as prefill_workload counts it (LM head for the last position only)."""
    flops = forward_flops(c, n_tokens, last_only=True) * batch_size
    return flops / forward_bytes(weight_nbytes, kv_bytes_per_token, n_tokens, batch_size)


def prefill_crossover_tokens(c: ModelConfig, ridge: float, weight_nbytes: int, kv_bytes_per_token: int,
                             batch_size: int = 1) -> int | None:
    """The shortest prompt (tokens per sequence, with batch_size prompts in the
    pass) whose prefill intensity reaches `ridge`: below it a prefill is
    memory-bound, from it on compute-bound. None if no prompt within the
    model's context (c.max_len) reaches it."""
    if ridge <= 0:
        raise ValueError(f"ridge must be > 0, got {ridge}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    # The intensity grows with the prompt (more tokens share each weight read): bisect.
    lo, hi = 1, c.max_len
    if prefill_intensity(c, hi, weight_nbytes, kv_bytes_per_token, batch_size) < ridge:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if prefill_intensity(c, mid, weight_nbytes, kv_bytes_per_token, batch_size) >= ridge:
            hi = mid
        else:
            lo = mid + 1
    return lo


@dataclass(frozen=True)
class Datasheet:
    """A device's two roofs as its maker publishes them (not measured here)."""

    name: str
    peak_flops: float          # FLOP/s, dense (no structured sparsity), in `dtype`
    bandwidth: float           # memory bytes/s
    dtype: str
    source: str

    @property
    def ridge(self) -> float:
        return ridge_point(self.peak_flops, self.bandwidth)


# NVIDIA H100 Tensor Core GPU datasheet, SXM5 80 GB: BF16 Tensor Core 1,979 TFLOPS *with*
# 2:4 sparsity, so 989.4 dense; HBM3 3.35 TB/s.
H100_SXM = Datasheet("NVIDIA H100 SXM", 989.4e12, 3.35e12, "bf16",
                     "NVIDIA H100 Tensor Core GPU datasheet (dense bf16 = half the sparsity figure)")
# NVIDIA H200 Tensor Core GPU datasheet, SXM 141 GB: the same compute as the H100 SXM
# (BF16 1,979 TFLOPS with sparsity), HBM3e 4.8 TB/s.
H200_SXM = Datasheet("NVIDIA H200 SXM", 989.4e12, 4.8e12, "bf16",
                     "NVIDIA H200 Tensor Core GPU datasheet (dense bf16 = half the sparsity figure)")
