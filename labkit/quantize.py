"""Weight-only quantization: int8 and int4 weights, floating-point activations.

A decode step reads every weight once to produce one token, so on a CPU its
time is set by how many bytes the weights take (docs/benchmarks.md measures
it). Storing the weights in fewer bits and expanding them inside the matmul
kernel reads fewer bytes per token:

    fp32   4    bytes per weight
    bf16   2
    int8   1    + one scale per output row            (per-channel, symmetric)
    int4   0.5  + a scale and a zero per 32 weights   (per-group, asymmetric)

    int8:  w ~ q * scale,               q in [-127, 127]
    int4:  w ~ (q - 8) * scale + zero,  q in [0, 15], one (scale, zero) per group

`quantize(model, "int8")` returns a new `labkit.Model` (the model passed in is
not touched, so the two can be compared side by side) whose projection layers
and LM head hold quantized weights. `Model.forward` runs unchanged: its
`linear()` helper calls these layers, which run PyTorch's own weight-only
kernels on the CPU (`torch._weight_int8pack_mm`,
`torch.ops.aten._weight_int4pack_mm_for_cpu`). Those kernels are fast with
bf16 activations (with fp32 ones they are several times slower than plain
fp32), so a quantized model computes in bf16 by default.

Why not torchao: its int8 weight-only layer, run eagerly, converts the whole
int8 weight to the activation dtype on every call (it is designed to be
fused by torch.compile), which moves more bytes than bf16 does; the two
kernels above are the ones torchao itself calls for int4 on the CPU.

`compare(reference, quantized)` measures what the bytes saved cost: the KL
divergence of the next-token distribution and greedy agreement on a fixed
prompt set.

Left out: activation quantization (int8 x int8 matmuls, which help
compute-bound prefill more than decode), GPTQ/AWQ-style calibration, and
fast GPU kernels (on a GPU these layers de-quantize on every call: correct,
not faster). The token embedding table stays in floating point: a lookup
reads one row per token, so quantizing it saves no time.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .transformer import Model

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


class Int8Linear(nn.Module):
    """A linear layer whose weight is int8, one scale per output row.

    Symmetric: scale = max |w| of the row / 127, q = round(w / scale).
    The rounding error of each weight is at most scale / 2.
    """

    bits = 8

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype):
        super().__init__()
        w = weight.detach().float()                                   # (out, in)
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127            # (out,)
        self.register_buffer("qweight", torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale.to(dtype))
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(dtype), requires_grad=False)
        self.in_features, self.out_features = w.shape[1], w.shape[0]

    def dequantize(self) -> torch.Tensor:
        return self.qweight.float() * self.scale.float()[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        if x.device.type == "cpu":
            y = torch._weight_int8pack_mm(x2, self.qweight, self.scale)
        else:   # no fast kernel used here: correct, not faster
            y = F.linear(x2, self.qweight.to(x.dtype)) * self.scale
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)


class Int4Linear(nn.Module):
    """A linear layer whose weight is int4 in groups of `group_size` inputs,
    each group with its own scale and zero (asymmetric: a group's minimum and
    maximum are both exact grid points).

    Stored in the layout PyTorch's CPU int4 kernel reads: two weights per byte,
    and scales_and_zeros of shape (in / group_size, out, 2).
    """

    bits = 4

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype,
                 group_size: int = 32):
        super().__init__()
        w = weight.detach().float()                                   # (out, in)
        n_out, n_in = w.shape
        if n_in % group_size:
            raise ValueError(f"in_features ({n_in}) must be a multiple of group_size ({group_size})")
        groups = w.view(n_out, n_in // group_size, group_size)
        lo, hi = groups.amin(-1), groups.amax(-1)                     # (out, n_groups)
        scale = ((hi - lo) / 15).clamp(min=1e-12)
        q = torch.round((groups - lo[..., None]) / scale[..., None]).clamp(0, 15)
        q = q.to(torch.int32).view(n_out, n_in)
        # The kernel computes w = (q - 8) * scale + zero, so zero is the value at q = 8.
        zero = lo + 8 * scale
        self.register_buffer("scales_and_zeros", torch.stack([scale.t(), zero.t()], dim=-1).to(dtype).contiguous())
        self.device_type = w.device.type
        if self.device_type == "cpu":
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        else:   # two 4-bit values per byte, de-quantized on every call (no fast kernel used)
            packed = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
        self.register_buffer("qweight", packed)
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(dtype), requires_grad=False)
        self.in_features, self.out_features, self.group_size = n_in, n_out, group_size

    def dequantize(self) -> torch.Tensor:
        """The weights the kernel multiplies by, as fp32 (out, in): for tests and for other devices."""
        if self.device_type == "cpu":
            eye = torch.eye(self.in_features, dtype=self.scales_and_zeros.dtype)
            w_t = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.qweight, self.group_size,
                                                             self.scales_and_zeros)
            return w_t.t().float()
        hi, lo = (self.qweight >> 4).to(torch.int32), (self.qweight & 15).to(torch.int32)
        q = torch.stack([hi, lo], dim=-1).view(self.out_features, self.in_features).float()
        sz = self.scales_and_zeros.float()                            # (n_groups, out, 2)
        scale = sz[..., 0].t().repeat_interleave(self.group_size, dim=1)
        zero = sz[..., 1].t().repeat_interleave(self.group_size, dim=1)
        return (q - 8) * scale + zero

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        if self.device_type == "cpu":
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.qweight, self.group_size,
                                                           self.scales_and_zeros)
        else:
            y = F.linear(x2, self.dequantize().to(x.dtype))
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)


def _projections(hf) -> list[tuple[nn.Module, str]]:
    """(parent, attribute name) of every layer that multiplies by a weight matrix."""
    return [(parent, name) for parent in hf.modules() for name, child in parent.named_children()
            if isinstance(child, nn.Linear) or type(child).__name__ == "Conv1D"]


@torch.inference_mode()
def quantize(model: Model, scheme: str = "int8", *, group_size: int = 32,
             dtype: torch.dtype | None = None, head: str | None = None) -> Model:
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
    hf = copy.deepcopy(model.hf).to(dtype)
    # Tied embeddings: the LM head gets its own quantized copy below, and the
    # embedding table keeps the floating-point one for lookups. Untie them in
    # the config, so transformers never re-ties the head to the table.
    hf.config.tie_word_embeddings = False
    if hasattr(hf.config, "get_text_config"):
        hf.config.get_text_config().tie_word_embeddings = False
    lm_head = hf.get_output_embeddings()
    for parent, name in _projections(hf):
        layer = getattr(parent, name)
        weight = layer.weight if isinstance(layer, nn.Linear) else layer.weight.t()  # Conv1D: (in, out)
        kind = head if layer is lm_head else scheme
        if kind == "int8":
            new = Int8Linear(weight, layer.bias, dtype)
        else:
            new = Int4Linear(weight, layer.bias, dtype, group_size)
        setattr(parent, name, new)
    label = scheme if head == scheme else f"{scheme}, head {head}"
    return Model(hf, model.tokenizer, name=f"{model.name} ({label})")


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


def kl_divergence(ref_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(p_ref || p) for each row of logits (..., vocab), in nats."""
    ref_logp = ref_logits.float().log_softmax(-1)
    logp = logits.float().log_softmax(-1)
    return (ref_logp.exp() * (ref_logp - logp)).sum(-1)


@torch.inference_mode()
def compare(reference: Model, quantized: Model, prompts: list[str] | None = None,
            max_new_tokens: int = 16) -> Quality:
    """How far the quantized model's predictions are from the reference's."""
    from .encode import encode
    from .generate import generate

    prompts = prompts or PROMPTS
    kls, top1, identical, prefix = [], [], [], []
    for text in prompts:
        ids = encode(reference, text).ids
        ref, out = reference.forward(ids), quantized.forward(ids)    # (T, vocab)
        kls.append(kl_divergence(ref, out))
        top1.append(ref.argmax(-1) == out.argmax(-1))
        a = generate(reference, ids.tolist(), max_new_tokens, stop_at_eos=False).token_ids
        b = generate(quantized, ids.tolist(), max_new_tokens, stop_at_eos=False).token_ids
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
        identical.append(same == len(a))
        prefix.append(same / len(a))
    kl, agree = torch.cat(kls), torch.cat(top1).float()
    return Quality(float(kl.mean()), float(kl.max()), float(agree.mean()),
                   sum(identical) / len(prompts), sum(prefix) / len(prompts), len(kl), len(prompts))
