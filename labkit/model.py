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

Attention has two paths that tests check agree: the teaching path
(`attention_by_hand`, scores / sqrt(d) -> causal mask -> softmax -> weighted
sum, which can record the probabilities), and the fast path
(`torch.nn.functional.scaled_dot_product_attention`), used when nothing is
recorded.

Left out: sliding-window attention (Mistral's window is far longer than any
prompt here), padding masks for batches of unequal length, and quantised
execution of GGUF weights (they are de-quantised on load).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.pytorch_utils import Conv1D

from .kv_cache import KVCache
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
    n_kv_heads: int       # key/value heads ("kv_head_num"); = n_heads for MHA, 1 for MQA
    head_dim: int         # "size_per_head"
    d_ff: int             # hidden size of the feed-forward network
    vocab_size: int
    max_len: int          # context length the model was trained for
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
            # product. On a CPU PyTorch's mv kernel is ~20% faster here than the
            # matmul F.linear picks for a single row (measured with SmolLM2 in
            # bf16); in fp32 the two are the same, so fp32 keeps F.linear.
            y = torch.mv(layer.weight, x.reshape(-1))
            y = y if layer.bias is None else y + layer.bias
            return y.view(*x.shape[:-1], -1)
        return F.linear(x, layer.weight, layer.bias)
    if isinstance(layer, Conv1D):
        out = torch.addmm(layer.bias, x.reshape(-1, x.shape[-1]), layer.weight)
        return out.view(*x.shape[:-1], -1)
    return layer(x)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight. Computed in fp32, as transformers does,
    so bf16 results match it too."""
    return F.rms_norm(x.float(), x.shape[-1:], eps=eps).to(x.dtype) * weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair of dimensions (i, i + d/2) of every head by its angle.
    x: (B, heads, T, hs); cos, sin: (T, hs)."""
    return x * cos + rotate_half(x) * sin


def causal_mask(n_queries: int, n_keys: int, start: int, device=None) -> torch.Tensor:
    """True where query i (at position start + i) may look at key j: j <= start + i."""
    q_pos = torch.arange(start, start + n_queries, device=device)[:, None]
    k_pos = torch.arange(n_keys, device=device)[None, :]
    return k_pos <= q_pos  # (T, S)


def attention_by_hand(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int):
    """Attention written out, with grouped-query sharing of K and V made visible.

    q: (B, n_heads, T, hs), k and v: (B, n_kv_heads, S, hs); start is the
    position of the first query (the number of tokens already cached).
    Returns the output (B, n_heads, T, hs) and the probabilities (B, n_heads, T, S).
    """
    B, n_heads, T, hs = q.shape
    n_kv, S = k.shape[1], k.shape[2]
    group = n_heads // n_kv
    # Grouped-query attention: query heads j*group .. j*group+group-1 all read
    # KV head j. Viewing the query heads as (kv_heads, group) and giving K and V
    # a group axis of size 1 lets broadcasting share them: K and V are not copied.
    q = q.view(B, n_kv, group, T, hs)                         # (B, kv, g, T, hs)
    k = k[:, :, None]                                         # (B, kv, 1, S, hs)
    v = v[:, :, None]                                         # (B, kv, 1, S, hs)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hs)          # (B, kv, g, T, S)
    scores = scores.masked_fill(~causal_mask(T, S, start, q.device), float("-inf"))
    probs = scores.softmax(dim=-1, dtype=torch.float32).to(q.dtype)  # each row sums to 1
    out = probs @ v                                           # (B, kv, g, T, hs)
    return out.reshape(B, n_heads, T, hs), probs.reshape(B, n_heads, T, S)


def attention_fast(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """The same result from PyTorch's fused kernel (no probabilities kept)."""
    T, S = q.shape[2], k.shape[2]
    group = q.shape[1] // k.shape[1]
    if T == 1:
        # Decode step: one query sees every cached key, so no mask is needed,
        # and folding the query heads of a group into the query axis lets one
        # plain attention call serve all groups without repeating K and V.
        B, n_heads, _, hs = q.shape
        q = q.view(B, k.shape[1], group, hs)                  # (B, kv, g, hs)
        out = F.scaled_dot_product_attention(q, k, v)         # (B, kv, g, hs)
        return out.reshape(B, n_heads, 1, hs)
    if start == 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=group > 1)
    mask = causal_mask(T, S, start, q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=group > 1)


# ----------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------

class Model:
    """A loaded model: `forward` (stage 2), `new_cache`, the tokenizer, the config.

    hf: the transformers model whose weights are read (for side-by-side checks).
    attention: "auto" (fast path unless recording), "manual" or "sdpa".
    """

    def __init__(self, hf, tokenizer=None, name: str | None = None):
        self.config = ModelConfig.from_hf(hf.config)
        self.hf = hf.eval()
        self.tokenizer = tokenizer
        self.name = name or getattr(hf.config, "name_or_path", "") or self.config.model_type
        self.attention = "auto"
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
        c = self.config
        return (f"Model({self.name!r}: {c.model_type}, {c.n_layers} layers, d_model {c.d_model}, "
                f"{c.n_heads} heads / {c.n_kv_heads} KV heads x {c.head_dim}, vocab {c.vocab_size}, "
                f"{self.n_params / 1e6:.0f}M params, {self.dtype}, {self.device})")

    def new_cache(self, max_len: int = 1024, batch_size: int = 1) -> KVCache:
        """An empty KV cache for up to max_len positions, on the model's device and dtype."""
        if not 1 <= max_len <= self.config.max_len:
            raise ValueError(f"max_len must be in [1, {self.config.max_len}] (the model's context), got {max_len}")
        c = self.config
        return KVCache(c.n_layers, c.n_kv_heads, c.head_dim, max_len, batch_size=batch_size,
                       dtype=self.dtype, device=self.device)

    # -- the forward pass -------------------------------------------------------

    @torch.inference_mode()
    def forward(self, ids, cache: KVCache | None = None, record: bool = False, last_only: bool = False):
        """Logits for every position of `ids`.

        ids: token ids, shape (T,) or (B, T), list or tensor.
        cache: a KVCache; the new positions' K and V are written after the ones
          it holds, and attention reads all of them. None: attend within ids only.
        record: also return a Trace (attention probabilities, hidden states, timings).
        last_only: return the logits of the last position only, (1, vocab) (prefill).

        Returns logits (T, vocab) or (B, T, vocab), and the Trace when record=True.
        """
        ids, batched = self._check_ids(ids)
        B, T = ids.shape
        start = 0
        if cache is not None:
            if cache.batch_size != B:
                raise ValueError(f"cache has batch_size={cache.batch_size} but ids have {B} rows")
            cache.check_room(T)
            start = cache.length
        if start + T > self.config.max_len:
            raise ValueError(f"sequence of {start + T} tokens is longer than the model's context "
                             f"({self.config.max_len} tokens)")
        trace = Trace() if record else None
        by_hand = record or self.attention == "manual"

        def attend(i, q, k, v):
            return self._attend(i, q, k, v, start, cache, trace, by_hand)

        positions = torch.arange(start, start + T, device=self.device)
        logits = self.run_blocks(ids, positions, attend, trace, last_only)   # (B, T or 1, vocab)
        if cache is not None:
            cache.length += T
        if not batched:
            logits = logits[0]
        if trace is None:
            return logits
        trace.finish(batched)
        return logits, trace

    def run_blocks(self, ids: torch.Tensor, positions: torch.Tensor, attend, trace: Trace | None = None,
                   last_only: bool = False):
        """Embeddings -> every block -> logits, for ids (B, T) at `positions` (T,).

        attend(layer, q, k, v) stores the new K, V wherever the caller keeps
        them and returns the attention output (B, T, heads * hs). `forward`
        passes one that uses a KVCache; labkit.cuda_graphs passes one whose position
        is a tensor, so a CUDA graph can replay the same step at every position.
        """
        t0 = time.perf_counter() if trace else 0.0    # timed only when recording (keeps torch.compile happy)
        x = self.embed(ids, positions)                                  # (B, T, d)
        rope = self._rope(positions, x.dtype) if self.config.family == "llama" else None
        if trace:
            trace.hidden.append(x)
        for i, block in enumerate(self.blocks):
            if self.config.family == "llama":
                x = self._llama_block(i, block, x, rope, attend)
            else:
                x = self._gpt2_block(i, block, x, attend)
            if trace:
                trace.hidden.append(x)
                trace.layer_seconds.append(time.perf_counter() - t0 - sum(trace.layer_seconds))
        if last_only:
            # Generation needs only the last position's scores: skipping the LM
            # head for the others saves 2 x d_model x vocab FLOPs per prompt token.
            x = x[:, -1:]
        logits = self.unembed(x)                                        # (B, T, vocab)
        if trace:
            trace.seconds = time.perf_counter() - t0
        return logits

    __call__ = forward

    def _check_ids(self, ids):
        if not isinstance(ids, torch.Tensor):
            ids = torch.tensor(ids, dtype=torch.long)
        if ids.dim() not in (1, 2) or ids.shape[-1] == 0:
            raise ValueError(f"ids must be a non-empty sequence of token ids, shape (T,) or (B, T); got shape {tuple(ids.shape)}")
        if ids.is_floating_point():
            raise ValueError("ids must be integer token ids, not floats")
        # Checking the range costs a device sync, so only on the CPU, where it is free.
        if ids.device.type == "cpu" and (ids.min() < 0 or ids.max() >= self.config.vocab_size):
            raise ValueError(f"token ids must be in [0, {self.config.vocab_size - 1}]")
        batched = ids.dim() == 2
        return (ids if batched else ids[None]).to(self.device), batched

    def embed(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Stage 1's last step: token embeddings (+ learned positions for GPT-2)."""
        if self.config.family == "gpt2":
            return self.hf.transformer.wte(ids) + self.hf.transformer.wpe(positions)
        return self.hf.model.embed_tokens(ids)

    def unembed(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head: hidden states -> logits over the vocabulary.
        Applied to an intermediate layer's hidden state this is the logit lens."""
        return linear(self._final_norm(x), self.hf.lm_head)

    def _final_norm(self, x):
        n = self.final_norm
        if self.config.family == "gpt2":
            return F.layer_norm(x, x.shape[-1:], n.weight, n.bias, self.config.norm_eps)
        return rms_norm(x, n.weight, self.config.norm_eps)

    def _rope(self, positions, dtype):
        """cos and sin of every position's rotation angles, shared by all layers."""
        angles = positions.float()[:, None] * self.inv_freq[None, :]  # (T, hs/2)
        angles = torch.cat((angles, angles), dim=-1)                   # (T, hs)
        return ((angles.cos() * self.rope_scale).to(dtype),
                (angles.sin() * self.rope_scale).to(dtype))

    def _attend(self, i, q, k, v, start, cache, trace, by_hand):
        """Store the new K, V; attend over everything cached; record if asked."""
        if cache is not None:
            k, v = cache.update(i, start, k, v)        # (B, kv, start+T, hs)
            attend_start = start
        else:
            attend_start = 0
        if by_hand:
            out, probs = attention_by_hand(q, k, v, attend_start)
            if trace:
                trace.attentions.append(probs)
        else:
            out = attention_fast(q, k, v, attend_start)
        B, _, T, _ = out.shape
        return out.transpose(1, 2).reshape(B, T, -1)  # (B, T, heads * hs)

    def _llama_block(self, i, block, x, rope, attend):
        c, a, mlp = self.config, block.self_attn, block.mlp
        B, T, _ = x.shape
        h = rms_norm(x, block.input_layernorm.weight, c.norm_eps)
        q = linear(h, a.q_proj).view(B, T, c.n_heads, c.head_dim).transpose(1, 2)
        k = linear(h, a.k_proj).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        v = linear(h, a.v_proj).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)           # (B, heads, T, hs)
        att = attend(i, q, k, v)                                    # (B, T, heads * hs)
        x = x + linear(att, a.o_proj)
        h = rms_norm(x, block.post_attention_layernorm.weight, c.norm_eps)
        # SwiGLU feed-forward: down(silu(gate(h)) * up(h))
        gate = linear(h, mlp.gate_proj)
        up = linear(h, mlp.up_proj)
        return x + linear(F.silu(gate) * up, mlp.down_proj)

    def _gpt2_block(self, i, block, x, attend):
        c, a, mlp = self.config, block.attn, block.mlp
        B, T, d = x.shape
        h = F.layer_norm(x, (d,), block.ln_1.weight, block.ln_1.bias, c.norm_eps)
        qkv = linear(h, a.c_attn).view(B, T, 3, c.n_heads, c.head_dim)   # one fused projection
        q, k, v = qkv.permute(2, 0, 3, 1, 4)                       # each (B, heads, T, hs)
        att = attend(i, q, k, v)
        x = x + linear(att, a.c_proj)
        h = F.layer_norm(x, (d,), block.ln_2.weight, block.ln_2.bias, c.norm_eps)
        up = linear(h, mlp.c_fc)
        return x + linear(F.gelu(up, approximate="tanh"), mlp.c_proj)
