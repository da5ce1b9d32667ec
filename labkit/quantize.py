"""Weight-only quantization: int8 and int4 weights, floating-point activations.

A decode step reads every weight once to produce one token, so on a CPU its
time is set by how many bytes the weights take (docs/benchmarks.md measures
it). Storing the weights in fewer bits and expanding them inside the matmul
kernel reads fewer bytes per token:

    fp32   4    bytes per weight     24-bit significand: ~7.2 significant decimal digits
    bf16   2                         8-bit significand (7 stored + 1 implicit): ~2.4 digits,
                                     and fp32's exponent range
    fp16   2                         11-bit significand: ~3.3 digits, range up to 65504
    int8   1    + one scale per output row            (per-channel, symmetric)
    int4   0.5  + a scale and a zero per 32 weights   (per-group, asymmetric)

    int8:  w ~ q * scale,               q in [-127, 127]
    int4:  w ~ (q - 8) * scale + zero,  q in [0, 15], one (scale, zero) per group

`quantize(model, "int8")` returns a new `QuantizedModel` (a `labkit.Model`;
the model passed in is not touched, so the two can be compared side by
side) whose projection layers and LM head hold quantized weights.
`Model.forward` runs unchanged: its
`linear()` helper calls these layers, which run PyTorch's own weight-only
kernels on the CPU (`torch._weight_int8pack_mm`,
`torch.ops.aten._weight_int4pack_mm_for_cpu`). Those kernels are fast with
bf16 activations (with fp32 ones they are several times slower than plain
fp32), so a quantized model computes in bf16 by default.

Why not torchao: its int8 weight-only layer, run eagerly, converts the whole
int8 weight to the activation dtype on every call (it is designed to be
fused by torch.compile), which moves more bytes than bf16 does; the two
kernels above are the ones torchao itself calls for int4 on the CPU.

`measure_quality(reference, quantized)` measures what the bytes saved cost: the KL
divergence of the next-token distribution and greedy agreement on a fixed
prompt set.

Left out: activation quantization (int8 x int8 matmuls, which help
compute-bound prefill more than decode), GPTQ/AWQ-style calibration, and
fast GPU kernels (on a GPU these layers de-quantize on every call: correct,
not faster). The token embedding table stays in floating point: a lookup
reads one row per token, so quantizing it saves no time.

`distinct_values_per_block(w)` counts the distinct values in each block of
32 weights: it shows that the bundled default model's "fp32" weights are
de-quantised 4-bit GGUF blocks (Q4_1: at most 16 values per block).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .model import Model
from .timing import release_freed_memory

SCHEMES = ("int8", "int4")

# A fixed prompt set for measuring the quality cost (English, Chinese, code, facts).
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "法国的首都是",
    "The three primary colours are red,",
    "Water boils at 100 degrees Celsius at sea level. At the top of a high mountain, it boils",
    "Question: What is 12 times 12?\nAnswer:",
    "I like to read books about history because",
]


# The weight-only kernels are matrix-vector kernels: their time grows with
# every row of x, which suits decode (1 row) and not a long prefill. For more
# rows than these it is faster to expand the weights to the activation dtype
# once and run an ordinary matmul (measured on a 2-core Xeon: a 1536 x 576
# int8 matrix expands in about the time of 12 kernel rows; an int4 one, whose
# unpacking takes several passes, in about the time of 140).
INT8_KERNEL_MAX_ROWS = 16

# Quantizing a matrix works through this many rows at a time, so the float
# temporaries of a large matrix (the 49152 x 576 LM head: 113 MB each in fp32)
# stay a few MB: memory holds the model and its quantized copy, little more.
CHUNK_ROWS = 2048
INT4_KERNEL_MAX_ROWS = 128


def _aligned(x: torch.Tensor) -> torch.Tensor:
    """x, contiguous and starting on a 64-byte boundary (the kernels use aligned
    vector loads; a fresh tensor always is, a slice of one may not be)."""
    x = x.contiguous()
    return x if x.data_ptr() % 64 == 0 else x.clone()


class Int8Linear(nn.Module):
    """A linear layer whose weight is int8, one scale per output row.

    Symmetric: scale = max |w| of the row / 127, q = round(w / scale).
    The rounding error of each weight is at most scale / 2.
    """

    bits = 8

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype):
        super().__init__()
        w = weight.detach().float().contiguous()                      # (out, in); the kernel needs rows
        # max |w| of each row, a chunk of rows at a time (w.abs() of the LM head would be 113 MB)
        scale = torch.cat([w[r:r + CHUNK_ROWS].abs().amax(dim=1) for r in range(0, len(w), CHUNK_ROWS)])
        scale = scale.clamp(min=1e-12) / 127                          # (out,)
        q = torch.empty(w.shape, dtype=torch.int8, device=w.device)
        for r in range(0, len(w), CHUNK_ROWS):     # a chunk of rows at a time: small float temporaries
            q[r:r + CHUNK_ROWS] = (w[r:r + CHUNK_ROWS] / scale[r:r + CHUNK_ROWS, None]).round_().clamp_(-127, 127)
        self.register_buffer("qweight", q)
        self.register_buffer("scale", scale.to(dtype))
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(dtype), requires_grad=False)
        self.in_features, self.out_features = w.shape[1], w.shape[0]

    def dequantize(self) -> torch.Tensor:
        return self.qweight.float() * self.scale.float()[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        # The CPU kernel reads 16 values at a time from aligned rows.
        if x.device.type == "cpu" and len(x2) <= INT8_KERNEL_MAX_ROWS and self.in_features % 16 == 0:
            y = torch._weight_int8pack_mm(_aligned(x2), self.qweight, self.scale)
        else:   # prefill (or no kernel here): expand the weights once, then one big matmul
            y = F.linear(x2, self.qweight.to(x.dtype)) * self.scale
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)


_LAYOUT_OK: dict[tuple[int, int], bool] = {}   # (rows, in) -> does _unpack_cpu read the kernel's layout


def _unpack_cpu_layout(qweight: torch.Tensor, n_in: int) -> torch.Tensor:
    """q (rows, in) uint8 from the CPU kernel's layout: each block of 64 rows is
    stored as (in, 32) bytes, row r in the low 4 bits and row r + 32 in the high 4."""
    packed = qweight.view(-1, n_in, 32)
    q = torch.cat([packed & 15, packed >> 4], dim=-1)                 # (blocks, in, 64)
    return q.transpose(1, 2).reshape(-1, n_in)


class Int4Linear(nn.Module):
    """A linear layer whose weight is int4 in groups of `group_size` inputs,
    each group with its own scale and zero (asymmetric: a group's minimum and
    maximum are both exact grid points).

    On the CPU the weights are stored the way PyTorch's int4 kernel reads
    them (two per byte, in blocks of 64 output rows), with scales_and_zeros
    of shape (in / group_size, out, 2). Elsewhere they are stored two per
    byte in plain row order and de-quantized on every call.
    """

    bits = 4

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype,
                 group_size: int = 32):
        super().__init__()
        w = weight.detach().float()                                   # (out, in)
        n_out, n_in = w.shape
        if n_in % group_size:
            raise ValueError(f"in_features ({n_in}) must be a multiple of group_size ({group_size})")
        self.in_features, self.out_features, self.group_size = n_in, n_out, group_size
        # The CPU kernel packs rows in blocks of 64: pad with zero rows, and drop
        # their outputs (only odd shapes such as the tests' tiny vocabularies need it).
        self.n_rows = -(-n_out // 64) * 64
        if self.n_rows != n_out:
            w = F.pad(w, (0, 0, 0, self.n_rows - n_out))
        groups = w.view(self.n_rows, n_in // group_size, group_size)
        lo, hi = groups.amin(-1), groups.amax(-1)                     # (out, n_groups)
        scale = ((hi - lo) / 15).clamp(min=1e-12)
        q = torch.empty(self.n_rows, n_in, dtype=torch.uint8, device=w.device)   # 0..15
        for r in range(0, self.n_rows, CHUNK_ROWS):   # a chunk of rows at a time: small float temporaries
            rows = slice(r, r + CHUNK_ROWS)
            q[rows] = ((groups[rows] - lo[rows, :, None]) / scale[rows, :, None]).round_().clamp_(0, 15).view(-1, n_in)
        # The kernel computes w = (q - 8) * scale + zero, so zero is the value at q = 8.
        zero = lo + 8 * scale
        self.register_buffer("scales_and_zeros", torch.stack([scale.t(), zero.t()], dim=-1).to(dtype).contiguous())
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(dtype), requires_grad=False)
        self.on_cpu = w.device.type == "cpu"
        if self.on_cpu:
            # The kernel packs each block of 64 rows on its own, so a chunk of rows at a
            # time gives the same bytes, with an int32 copy of one chunk, not of the matrix.
            # A long prefill expands the packed weights (INT4_KERNEL_MAX_ROWS); that relies on
            # the kernel's layout, so check it (once per shape, chunk by chunk) and keep to the
            # kernel if it differs.
            key = (self.n_rows, n_in)
            check = key not in _LAYOUT_OK
            layout_ok, chunks = True, []
            for r in range(0, self.n_rows, CHUNK_ROWS):
                packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q[r:r + CHUNK_ROWS].to(torch.int32), 1)
                if check:
                    layout_ok = layout_ok and torch.equal(_unpack_cpu_layout(packed, n_in), q[r:r + CHUNK_ROWS])
                chunks.append(packed)
            self.register_buffer("qweight", torch.cat(chunks))
            del chunks, packed
            if check:
                _LAYOUT_OK[key] = layout_ok
            self.unpackable = _LAYOUT_OK[key]
        else:
            self.register_buffer("qweight", (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8))
            self.unpackable = True

    def _unpack_cpu(self) -> torch.Tensor:
        """q (out, in) uint8 from the CPU kernel's layout (_unpack_cpu_layout)."""
        return _unpack_cpu_layout(self.qweight, self.in_features)

    def _unpack(self) -> torch.Tensor:
        if self.on_cpu:
            return self._unpack_cpu()
        q = torch.stack([self.qweight >> 4, self.qweight & 15], dim=-1)
        return q.view(self.n_rows, self.in_features)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weights the kernel multiplies by, (out, in)."""
        n_groups = self.in_features // self.group_size
        q = self._unpack().to(dtype).view(self.n_rows, n_groups, self.group_size)
        sz = self.scales_and_zeros.to(dtype).transpose(0, 1).contiguous()      # (rows, n_groups, 2)
        scale, zero = sz[..., 0], sz[..., 1]
        w = torch.addcmul((zero - 8 * scale)[..., None], q, scale[..., None])
        return w.view(self.n_rows, self.in_features)[:self.out_features]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        if self.on_cpu and (len(x2) <= INT4_KERNEL_MAX_ROWS or not self.unpackable):
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(_aligned(x2), self.qweight, self.group_size,
                                                           self.scales_and_zeros)
            y = y[:, :self.out_features]
        else:   # prefill (or no kernel here): expand the weights once, then one big matmul
            y = F.linear(x2, self.dequantize(x.dtype))
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


class QuantizedModel(Model):
    """A Model whose projection layers hold quantized weights as buffers.

    n_params counts each quantized weight once, as the parameter it replaced
    (Model.n_params sums nn.Parameters only, and would miss them). A tied LM
    head, which quantize() gives its own quantized copy of the embedding
    table, is the same parameters as the table: it is not counted twice.

    tied_head: the LM head was the embedding table in the model quantized.
    """

    def __init__(self, hf, tokenizer=None, name: str | None = None, tied_head: bool = False):
        super().__init__(hf, tokenizer, name)
        self.tied_head = tied_head

    @property
    def n_params(self) -> int:
        head = self.hf.get_output_embeddings()
        quantized = sum(m.in_features * m.out_features for m in self.hf.modules()
                        if isinstance(m, (Int8Linear, Int4Linear)) and not (self.tied_head and m is head))
        return super().n_params + quantized


def distinct_values_per_block(weight: torch.Tensor, block_size: int = 32) -> torch.Tensor:
    """How many distinct values each block of block_size consecutive weights
    along a row holds: weight (out, in) -> (out, in / block_size) counts.

    A block quantized to b bits holds at most 2**b distinct values, whatever
    dtype it was de-quantised to (GGUF's Q4_1: 16); trained weights in
    floating point hold about block_size."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if weight.dim() != 2 or weight.shape[1] % block_size:
        raise ValueError(f"weight must be 2-D with a row length divisible by block_size ({block_size}), "
                         f"got shape {tuple(weight.shape)}")
    blocks = weight.detach().reshape(-1, block_size)                           # (blocks, block_size)
    counts = []
    for chunk in blocks.split(CHUNK_ROWS * 16):    # a few MB of sorted values and indices at a time
        chunk = chunk.sort(dim=-1).values
        # In a sorted block every new value starts where it differs from its left neighbour.
        counts.append(1 + (chunk[:, 1:] != chunk[:, :-1]).sum(-1))
    counts = torch.cat(counts).view(weight.shape[0], -1)
    release_freed_memory(collect=False)   # the sorted copies, back to the OS (docs/memory.md)
    return counts


def mapped_in_dtype(model: Model, dtype: torch.dtype):
    """The same weights in `dtype`, memory-mapped from labkit's file of that dtype
    (labkit.loading writes it once beside the converted fp32 file: the same
    round-to-nearest-even values as a conversion, docs/memory.md), when `model`
    is the bundled default or a GGUF file that load_model loaded in fp32 on the
    CPU; else None (the caller converts: a private copy). Mapped, the copy costs
    the kernel no private memory (269 MB for the default model in bf16).
    Used by precision.cast, and by quantize for the embedding table it keeps."""
    from . import loading, memory

    key = next((k for k, m in loading._loaded.items() if m is model), None)
    if (key is None or key[2] != torch.float32 or model.device.type != "cpu" or dtype == torch.float32
            or not (key[0] == "None" or key[0].endswith(".gguf"))):
        return None
    from pathlib import Path

    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        gguf = loading.default_gguf_file() if key[0] == "None" else Path(key[0])
        hf, _ = loading._from_folder(loading._in_dtype(loading._converted_gguf(gguf), dtype), dtype)
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    if memory.weight_memory(hf).private:      # not mapped after all: no better than converting
        return None
    return hf.eval()


def _projections(hf) -> dict[str, nn.Module]:
    """Every layer that multiplies by a weight matrix, by name: nn.Linear, and
    GPT-2's Conv1D (the same thing with the weight stored transposed)."""
    return {name: m for name, m in hf.named_modules()
            if isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D"}


@torch.inference_mode()
def quantize(model: Model, scheme: str = "int8", *, group_size: int = 32,
             dtype: torch.dtype | None = None, head: str | None = None) -> QuantizedModel:
    """A new Model with weight-only int8 or int4 projection layers and LM head.

    model: the model to start from; it is copied, never changed.
    scheme: "int8" (per output row) or "int4" (groups of group_size inputs).
    dtype: activations, norms, embeddings and the KV cache. Default: bf16 on
      the CPU (the quantized kernels are fast with it), else the model's dtype.
    head: scheme for the LM head (default: the same). The LM head is the
      largest matrix of a small model and the most sensitive one, so
      head="int8" with scheme="int4" is a common compromise.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    head = head or scheme
    if head not in SCHEMES:
        raise ValueError(f"head must be one of {SCHEMES}, got {head!r}")
    if dtype is None:
        dtype = torch.bfloat16 if model.device.type == "cpu" else model.dtype
    release_freed_memory()    # what was freed before, back to the OS before the copy is built
    layers = _projections(model.hf)
    lm_head = model.hf.get_output_embeddings()
    # Copy the model, except the weight matrices about to be replaced (deepcopy
    # takes what the memo gives for them: nothing). The embedding table is
    # copied even when the LM head shares it: lookups still need it.
    table = model.hf.get_input_embeddings().weight
    memo = {id(m.weight): None for m in layers.values() if m.weight is not table}
    # The table goes straight to dtype (not copied in full precision first).
    # Mapped from labkit's file of that dtype when there is one (the same values, no private copy).
    mapped = mapped_in_dtype(model, dtype)
    table_in_dtype = mapped.get_input_embeddings().weight.detach() if mapped is not None else table.detach().to(dtype)
    del mapped
    memo[id(table)] = nn.Parameter(table_in_dtype, requires_grad=table.requires_grad)
    hf = copy.deepcopy(model.hf, memo).to(dtype)
    # Tied embeddings: the LM head gets its own quantized copy below, and the
    # embedding table keeps the floating-point one for lookups. Untie them in
    # the config, so transformers never re-ties the head to the table.
    hf.config.tie_word_embeddings = False
    if hasattr(hf.config, "get_text_config"):
        hf.config.get_text_config().tie_word_embeddings = False
    for name, layer in layers.items():
        weight = layer.weight if isinstance(layer, nn.Linear) else layer.weight.t()  # Conv1D: (in, out)
        if (head if layer is lm_head else scheme) == "int8":
            new = Int8Linear(weight, layer.bias, dtype)
        else:
            new = Int4Linear(weight, layer.bias, dtype, group_size)
        parent, _, attr = name.rpartition(".")
        setattr(hf.get_submodule(parent), attr, new)
        if weight.numel() * weight.element_size() > 2**20:
            # Give the layer's float temporaries back now: glibc would keep them in
            # its heap, and a model's worth of them adds up (measured: +390 MB for int8).
            del weight, new
            release_freed_memory(collect=False)
    label = scheme if head == scheme else f"{scheme}, head {head}"
    return QuantizedModel(hf, model.tokenizer, name=f"{model.name} ({label})",
                          tied_head=lm_head is not None and lm_head.weight is table)


# ----------------------------------------------------------------------------
# What it costs: quality against the reference model
# ----------------------------------------------------------------------------

@dataclass
class Quality:
    kl_mean: float           # mean KL(reference || quantized) of next-token distributions, nats
    kl_max: float            # the largest one, over every position of every prompt
    top1_agreement: float    # fraction of positions where the most likely token is the same
    greedy_identical: float  # fraction of prompts whose greedy continuation is identical
    greedy_prefix: float     # mean fraction of greedy tokens equal before the first difference
    n_positions: int
    n_prompts: int

    def __str__(self) -> str:
        return (f"KL mean {self.kl_mean:.4f} nats (max {self.kl_max:.3f}), top-1 agreement "
                f"{self.top1_agreement:.1%} of {self.n_positions} positions, greedy continuations "
                f"identical for {self.greedy_identical:.0%} of {self.n_prompts} prompts "
                f"(common prefix {self.greedy_prefix:.0%})")


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many tokens a and b share before their first difference."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def kl_divergence(ref_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(p_ref || p) for each row of logits (..., vocab), in nats."""
    ref_logp = ref_logits.float().log_softmax(-1)
    logp = logits.float().log_softmax(-1)
    return (ref_logp.exp() * (ref_logp - logp)).sum(-1)


@torch.inference_mode()
def measure_quality(reference: Model, quantized: Model, prompts: list[str] | None = None,
                    max_new_tokens: int = 16) -> Quality:
    """How far the quantized model's predictions are from the reference's."""
    from .encoding import encode
    from .generation import generate

    prompts = prompts or PROMPTS
    kls, top1, identical, prefix = [], [], [], []
    for text in prompts:
        ids = encode(reference, text).ids
        ref, out = reference.forward(ids), quantized.forward(ids)    # (T, vocab)
        kls.append(kl_divergence(ref, out))
        top1.append(ref.argmax(-1) == out.argmax(-1))
        a = generate(reference, ids.tolist(), max_new_tokens, stop_at_eos=False).token_ids
        b = generate(quantized, ids.tolist(), max_new_tokens, stop_at_eos=False).token_ids
        same = common_prefix(a, b)
        identical.append(same == len(a))
        prefix.append(same / len(a))
    kl, agree = torch.cat(kls), torch.cat(top1).float()
    return Quality(float(kl.mean()), float(kl.max()), float(agree.mean()),
                   sum(identical) / len(prompts), sum(prefix) / len(prompts), len(kl), len(prompts))
