"""Stage 2, the forward pass, written out.

`Model.forward(ids)` turns token ids into next-token logits the way the
transformers model would, but step by step, so a student can follow it:

    x = embed(ids) (+ learned positions, GPT-2)
    for each block:
        x = x + attention(norm(x))     # RoPE inside, Llama-style
        x = x + mlp(norm(x))
    logits = lm_head(norm(x))

It reads the weights of the loaded transformers model (`model.hf`) in place:
no second copy is made. Two families are written out: Llama-style (Llama,
SmolLM, TinyLlama, Mistral, Qwen2 with its q/k/v bias: RMSNorm, RoPE,
grouped-query attention, SwiGLU) and GPT-2 (LayerNorm, learned absolute
positions, multi-head attention with one fused QKV projection, GELU).

The file reads in the order data flows: the config, the pieces of a block
(linear, the norms, RoPE), then the Model (embed, the blocks, unembed).
Attention itself lives in labkit/attention.py; `model.attention` chooses its
implementation ("sdpa", "by_hand" or "tiled"), and passing a `labkit.Trace`
to `forward` records the attention probabilities (by hand), the hidden
states and timings.

Left out: sliding-window attention (Mistral's window is far longer than any
prompt here), padding masks for batches of unequal length, and quantised
execution of GGUF weights (they are de-quantised on load).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.pytorch_utils import Conv1D

from .attention import attend, attention_by_hand, check_implementation
from .kv_cache import KVCache, bytes_per_token
from .memory import check_room
from .trace import Trace

LLAMA_STYLE = ("llama", "mistral", "qwen2")
SUPPORTED = LLAMA_STYLE + ("gpt2",)


@dataclass
class ModelConfig:
    """The shapes the notebooks talk about, read from a transformers config."""

    model_type: str
    n_layers: int
    d_model: int
    n_heads: int          # query heads ("head_num")
    n_kv_heads: int       # key/value heads ("kv_head_num"); = n_heads for MHA, 1 for MQA, between for GQA
    head_dim: int         # "size_per_head"
    d_ff: int             # hidden size of the feed-forward network
    vocab_size: int
    max_len: int          # the longest context the config allows (max_position_embeddings)
    norm_eps: float
    rope_theta: float | None = None   # None: learned absolute positions (GPT-2)
    group_size: int = 0   # query heads per KV head; filled in __post_init__

    def __post_init__(self):
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        self.group_size = self.n_heads // self.n_kv_heads

    @property
    def family(self) -> str:
        return "gpt2" if self.model_type == "gpt2" else "llama"

    @classmethod
    def from_hf(cls, c) -> "ModelConfig":
        """c: the transformers config of a supported architecture."""
        if c.model_type not in SUPPORTED:
            raise ValueError(f"architecture {c.model_type!r} is not supported by labkit; "
                             f"supported: {', '.join(SUPPORTED)}")
        if c.model_type == "gpt2":
            return cls("gpt2", c.n_layer, c.n_embd, c.n_head, c.n_head, c.n_embd // c.n_head,
                       c.n_inner or 4 * c.n_embd, c.vocab_size, c.n_positions,
                       c.layer_norm_epsilon)
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        rope = getattr(c, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))
        return cls(c.model_type, c.num_hidden_layers, c.hidden_size, c.num_attention_heads,
                   c.num_key_value_heads or c.num_attention_heads, head_dim, c.intermediate_size,
                   c.vocab_size, c.max_position_embeddings, c.rms_norm_eps, theta)


# ----------------------------------------------------------------------------
# The pieces of a block, as functions of tensors
# ----------------------------------------------------------------------------

def linear(x: torch.Tensor, layer) -> torch.Tensor:
    """x @ W.T + b for one projection layer of the loaded model.

    nn.Linear stores W as (out, in); GPT-2's Conv1D stores it as (in, out), so
    x @ W + b. A quantized layer (labkit.quantize) holds int8 or int4 weights
    and brings its own kernel, so it is simply called."""
    if isinstance(layer, nn.Linear):
        if x.numel() == x.shape[-1] and layer.weight.dtype in (torch.bfloat16, torch.float16):
            # One token (a decode step) with 16-bit weights: a matrix-vector
            # product. On the CPU of docs/benchmarks.md PyTorch's mv kernel was
            # ~20% faster here than the matmul F.linear picks for a single row
            # (SmolLM2 in bf16). That depends on the CPU and the PyTorch build
            # (on an AMD EPYC with torch 2.13 F.linear was the faster one):
            # re-measure before relying on it. In fp32 the two are the same, so
            # fp32 keeps F.linear.
            y = torch.mv(layer.weight, x.reshape(-1))
            y = y if layer.bias is None else y + layer.bias
            return y.view(*x.shape[:-1], -1)
        return F.linear(x, layer.weight, layer.bias)
    if isinstance(layer, Conv1D):
        out = torch.addmm(layer.bias, x.reshape(-1, x.shape[-1]), layer.weight)
        return out.view(*x.shape[:-1], -1)
    return layer(x)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm (Zhang and Sennrich 2019): x / sqrt(mean(x^2) + eps) * weight,
    LayerNorm without the mean subtraction and the bias (Llama-style). Computed
    in fp32, as transformers does, so bf16 results match it too."""
    return F.rms_norm(x.float(), x.shape[-1:], eps=eps).to(x.dtype) * weight


def layer_norm(x: torch.Tensor, norm: nn.LayerNorm, eps: float) -> torch.Tensor:
    """(x - mean(x)) / sqrt(var(x) + eps) * weight + bias (GPT-2)."""
    return F.layer_norm(x, x.shape[-1:], norm.weight, norm.bias, eps)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, scale: float, dtype: torch.dtype):
    """cos and sin of every position's rotation angles, each (T, hs), shared by all layers.

    inv_freq (hs/2,): the frequency of each pair of dimensions; scale: the
    model's attention scaling (1.0, except under context-extension schemes
    that rescale it, such as YaRN; plain RoPE and linear scaling keep 1.0)."""
    angles = positions.float()[:, None] * inv_freq[None, :]   # (T, hs/2)
    angles = torch.cat((angles, angles), dim=-1)               # (T, hs): pair (i, i + hs/2) shares angle i
    return (angles.cos() * scale).to(dtype), (angles.sin() * scale).to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair of dimensions (i, i + d/2) of every head by its angle.
    x: (B, heads, T, hs); cos, sin: (T, hs).

    Pairing i with i + d/2 is Hugging Face's convention (rotate_half), which
    the weights loaded here expect. RoFormer (Su et al. 2021) and Meta's
    Llama code pair adjacent dimensions (2i, 2i + 1); the two are the same
    rotation up to a fixed permutation of the q and k weight rows (Hugging
    Face's conversion of Meta's weights applies it), so a checkpoint's
    weights fit one convention only."""
    return x * cos + rotate_half(x) * sin


# ----------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------

class Model:
    """A loaded model: `forward` (stage 2), `new_cache`, the tokenizer, the config.

    hf: the transformers model whose weights are read (for side-by-side checks).
    attention: which attention implementation forward uses (labkit.attention):
      "sdpa" (PyTorch's fused kernel, the default), "by_hand" or "tiled".
    tiled_block_size: the tile size of "tiled".
    """

    def __init__(self, hf, tokenizer=None, name: str | None = None):
        self.config = ModelConfig.from_hf(hf.config)
        self.hf = hf.eval()
        self.tokenizer = tokenizer
        self.name = name or getattr(hf.config, "name_or_path", "") or self.config.model_type
        self.attention = "sdpa"
        self.tiled_block_size = 64
        self.load_seconds = 0.0
        if self.config.family == "gpt2":
            base = hf.transformer
            self.blocks, self.final_norm = base.h, base.ln_f
        else:
            base = hf.model
            self.blocks, self.final_norm = base.layers, base.norm
            # The rotary frequencies (and any context-extension scaling) come
            # from the loaded model, so every RoPE variant it supports works.
            rotary = base.rotary_emb
            self.inv_freq = rotary.inv_freq.float()           # (hs/2,)
            self.rope_scale = float(getattr(rotary, "attention_scaling", 1.0))

    @property
    def attention(self) -> str:
        """The attention implementation: one of labkit.attention.IMPLEMENTATIONS."""
        return self._attention

    @attention.setter
    def attention(self, name: str) -> None:
        self._attention = check_implementation(name)

    # -- facts ----------------------------------------------------------------

    # The token embedding table sets device and dtype: a quantized model
    # (labkit.quantize) keeps it in floating point, while its projection
    # layers and LM head hold int8 or int4 weights.

    @property
    def device(self) -> torch.device:
        return self.hf.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of activations and of the KV cache."""
        return self.hf.get_input_embeddings().weight.dtype

    @property
    def n_params(self) -> int:
        # Tied embeddings are one tensor: count each parameter once.
        return sum(p.numel() for p in self.hf.parameters())

    @property
    def weight_nbytes(self) -> int:
        """Bytes of weights a decode step reads, each tensor once.

        Every block's weights and the LM head are read in full. Of an
        embedding table only one row per token is read, so it counts only
        when it is also the LM head (tied embeddings, as in SmolLM2).
        Quantized layers keep their weights as buffers: they count too."""
        head = getattr(self.hf.lm_head, "weight", None)
        skip = {id(m.weight) for m in self.hf.modules()
                if isinstance(m, nn.Embedding) and m.weight is not head}
        tensors = {id(t): t for t in (*self.hf.parameters(), *self.hf.buffers()) if id(t) not in skip}
        return sum(t.numel() * t.element_size() for t in tensors.values())

    def __repr__(self) -> str:
        config = self.config
        return (f"Model({self.name!r}: {config.model_type}, {config.n_layers} layers, "
                f"d_model {config.d_model}, {config.n_heads} heads / {config.n_kv_heads} KV heads "
                f"x {config.head_dim}, vocab {config.vocab_size}, {self.n_params / 1e6:.0f}M params, "
                f"{self.dtype}, {self.device})")

    def new_cache(self, max_len: int = 1024, batch_size: int = 1, kv_dtype: str | None = None) -> KVCache:
        """An empty KV cache for up to max_len positions, on the model's device
        and dtype; kv_dtype="int8" stores it in int8 (labkit.kv_quant)."""
        config = self.config
        if kv_dtype not in (None, "int8"):
            raise ValueError(f"kv_dtype must be None (the model's dtype) or 'int8', got {kv_dtype!r}")
        if not 1 <= max_len <= config.max_len:
            raise ValueError(f"max_len must be in [1, {config.max_len}] (the model's context), got {max_len}")
        nbytes = bytes_per_token(config.n_layers, config.n_kv_heads, config.head_dim, self.dtype.itemsize,
                                 batch_size) * max_len
        if self.device.type == "cpu" and nbytes > 32 * 2**20:      # small caches: not worth reading /proc
            check_room(nbytes, f"a KV cache of {max_len} tokens x {batch_size} sequences")
        if kv_dtype == "int8":
            from .kv_quant import new_int8_cache     # here, not at the top: kv_quant builds on kv_cache

            return new_int8_cache(self, max_len, batch_size)
        return KVCache(config.n_layers, config.n_kv_heads, config.head_dim, max_len, batch_size=batch_size,
                       dtype=self.dtype, device=self.device)

    # -- the forward pass -------------------------------------------------------

    @torch.inference_mode()
    def forward(self, ids, cache: KVCache | None = None, *, trace: Trace | None = None,
                last_only: bool = False) -> torch.Tensor:
        """Logits for every position of `ids`.

        ids: token ids, shape (T,) or (B, T), list or tensor.
        cache: a KVCache; the new positions' K and V are written after the ones
          it holds, and attention reads all of them. None: attend within ids only.
        trace: a labkit.Trace to record into (attention probabilities, hidden
          states, timings; what it held is replaced). Recording attends by
          hand, whatever `self.attention` says: only that path keeps the
          probabilities.
        last_only: the logits of the last position only (prefill needs no more).

        Returns logits (T, vocab) or (B, T, vocab); T is 1 with last_only.
        """
        ids, batched = self._check_ids(ids)
        B, T = ids.shape
        start = 0                                      # the position of ids' first token
        if cache is not None:
            if cache.batch_size != B:
                raise ValueError(f"cache has batch_size={cache.batch_size} but ids have {B} rows")
            cache.check_room(T)
            start = cache.length
        if start + T > self.config.max_len:
            raise ValueError(f"sequence of {start + T} tokens is longer than the model's context "
                             f"({self.config.max_len} tokens)")
        if trace is not None:
            trace.clear()

        def attend_layer(i, q, k, v):
            """Store the new K, V in the cache; attend over everything it holds."""
            if cache is not None:
                k, v = cache.update(i, start, k, v)    # (B, kv, start + T, hs)
            if trace is None:
                return attend(q, k, v, start, self.attention, self.tiled_block_size)
            out, probs = attention_by_hand(q, k, v, start)
            trace.attentions.append(probs)             # (B, heads, T, start + T)
            return out                                 # (B, heads, T, hs)

        positions = torch.arange(start, start + T, device=self.device)
        logits = self.run_blocks(ids, positions, attend_layer, trace, last_only)   # (B, T or 1, vocab)
        if cache is not None:
            cache.length += T
        if trace is not None:
            trace.finish(batched)
        return logits if batched else logits[0]

    __call__ = forward

    def _check_ids(self, ids):
        if not isinstance(ids, torch.Tensor):
            ids = torch.tensor(ids, dtype=torch.long)
        if ids.dim() not in (1, 2) or ids.shape[-1] == 0:
            raise ValueError(f"ids must be a non-empty sequence of token ids, shape (T,) or (B, T); "
                             f"got shape {tuple(ids.shape)}")
        if ids.is_floating_point():
            raise ValueError("ids must be integer token ids, not floats")
        # Checking the range costs a device sync, so only on the CPU, where it is free.
        if ids.device.type == "cpu" and (ids.min() < 0 or ids.max() >= self.config.vocab_size):
            raise ValueError(f"token ids must be in [0, {self.config.vocab_size - 1}]")
        batched = ids.dim() == 2
        return (ids if batched else ids[None]).to(self.device), batched

    def run_blocks(self, ids: torch.Tensor, positions: torch.Tensor, attend_layer, trace: Trace | None = None,
                   last_only: bool = False) -> torch.Tensor:
        """Embeddings -> every block -> logits (B, T, vocab), for ids (B, T) at `positions` (T,).

        attend_layer(layer, q, k, v) stores the new K, V wherever the caller
        keeps them and returns the attention output (B, heads, T, hs).
        `forward` passes one that uses a KVCache; labkit.cuda_graphs passes one
        whose position is a tensor, so a CUDA graph can replay the same step at
        every position.
        """
        # Timed only when recording (a clock read would break torch.compile's graph).
        t0 = time.perf_counter() if trace is not None else 0.0
        x = self.embed(ids, positions)                                  # (B, T, d)
        if trace is not None:
            trace.hidden.append(x)
        llama = self.config.family == "llama"
        rope = rope_cos_sin(positions, self.inv_freq, self.rope_scale, x.dtype) if llama else None
        for i, block in enumerate(self.blocks):
            if llama:
                x = self._llama_block(i, block, x, rope, attend_layer)  # (B, T, d)
            else:
                x = self._gpt2_block(i, block, x, attend_layer)
            if trace is not None:
                trace.hidden.append(x)
                trace.layer_seconds.append(time.perf_counter() - t0 - sum(trace.layer_seconds))
        if last_only:
            # Generation needs only the last position's scores: skipping the LM
            # head for the others saves 2 x d_model x vocab FLOPs per prompt token.
            x = x[:, -1:]
        logits = self.unembed(x)                                        # (B, T, vocab)
        if trace is not None:
            trace.seconds = time.perf_counter() - t0
        return logits

    def embed(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Stage 1's last step: token embeddings (+ learned positions for GPT-2)."""
        if self.config.family == "gpt2":
            return self.hf.transformer.wte(ids) + self.hf.transformer.wpe(positions)
        return self.hf.model.embed_tokens(ids)

    def _llama_block(self, i, block, x, rope, attend_layer):
        """x + attention(rms_norm(x)), then x + SwiGLU(rms_norm(x))."""
        config, attn, mlp = self.config, block.self_attn, block.mlp
        B, T, _ = x.shape
        h = rms_norm(x, block.input_layernorm.weight, config.norm_eps)
        q = linear(h, attn.q_proj).view(B, T, config.n_heads, config.head_dim).transpose(1, 2)     # (B, heads, T, hs)
        k = linear(h, attn.k_proj).view(B, T, config.n_kv_heads, config.head_dim).transpose(1, 2)  # (B, kv, T, hs)
        v = linear(h, attn.v_proj).view(B, T, config.n_kv_heads, config.head_dim).transpose(1, 2)  # (B, kv, T, hs)
        cos, sin = rope
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)     # rotated by position
        heads = attend_layer(i, q, k, v)                            # (B, heads, T, hs)
        heads = heads.transpose(1, 2).reshape(B, T, -1)             # (B, T, heads * hs): side by side
        x = x + linear(heads, attn.o_proj)
        h = rms_norm(x, block.post_attention_layernorm.weight, config.norm_eps)
        # SwiGLU feed-forward (Shazeer 2020): down(silu(gate(h)) * up(h)),
        # silu(z) = z * sigmoid(z); the gate decides, per feature, how much of up passes.
        gate = linear(h, mlp.gate_proj)                             # (B, T, d_ff)
        up = linear(h, mlp.up_proj)                                 # (B, T, d_ff)
        return x + linear(F.silu(gate) * up, mlp.down_proj)

    def _gpt2_block(self, i, block, x, attend_layer):
        """x + attention(layer_norm(x)), then x + GELU MLP(layer_norm(x))."""
        config, attn, mlp = self.config, block.attn, block.mlp
        B, T, _ = x.shape
        h = layer_norm(x, block.ln_1, config.norm_eps)
        qkv = linear(h, attn.c_attn).view(B, T, 3, config.n_heads, config.head_dim)   # one fused projection
        q, k, v = qkv.permute(2, 0, 3, 1, 4)                        # each (B, heads, T, hs)
        heads = attend_layer(i, q, k, v)                            # (B, heads, T, hs)
        heads = heads.transpose(1, 2).reshape(B, T, -1)             # (B, T, heads * hs)
        x = x + linear(heads, attn.c_proj)
        h = layer_norm(x, block.ln_2, config.norm_eps)
        up = linear(h, mlp.c_fc)                                    # (B, T, d_ff)
        return x + linear(F.gelu(up, approximate="tanh"), mlp.c_proj)

    def unembed(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head: hidden states (..., d) -> logits (..., vocab).
        Applied to an intermediate layer's hidden state this is the logit lens."""
        if self.config.family == "gpt2":
            x = layer_norm(x, self.final_norm, self.config.norm_eps)
        else:
            x = rms_norm(x, self.final_norm.weight, self.config.norm_eps)
        return linear(x, self.hf.lm_head)
