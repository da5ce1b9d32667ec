"""Weight-only int8 / int4 (labkit.quantize): the layers, the model, the quality cost.

Thresholds. KL(p_fp32 || p_quantized) of the next-token distribution, mean
over every position of the prompts. For scale: bf16 weights alone (an 8-bit
significand, 7 bits stored) give about 0.001-0.003 nats on SmolLM2-135M. int8 per-row rounds
each weight to 1/254 of its row's range: we measured ~0.01 nats and
require < 0.05; int4 in groups of 32 (1/15 of a group's range) measured
~0.2 nats and must stay < 0.6 (a 135M-parameter model is small, so it
feels 4 bits more than a large one does). Top-1 must agree on the
last position of the fixed prompts for int8.

The tiny random models (tests/tiny_models.py) are checked against an
independent reference: transformers running a copy of the fp32 model whose
weights were rounded in this file, by the schemes' formulas (`fake_quantized`).
"""

import copy
import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import labkit
import labkit.quantize as quantize_module
from tiny_models import tiny_hf_model
from labkit.quantize import (INT4_KERNEL_MAX_ROWS, PROMPTS, Int4Linear, Int8Linear, measure_quality,
                             kl_divergence, quantize)


def kl(ref_logits, logits):
    """KL(p_ref || p) per row, by torch (not labkit's kl_divergence)."""
    return F.kl_div(logits.float().log_softmax(-1), ref_logits.float().log_softmax(-1),
                    log_target=True, reduction="none").sum(-1)


def round_weights(w: torch.Tensor, scheme: str, group_size: int = 32) -> torch.Tensor:
    """w (out, in) as the scheme stores it, written out from the formulas.
    int8: symmetric per row, q = round(w / s), s = max|w| / 127.
    int4: asymmetric per group, q = round((w - min) / s) in [0, 15], s = (max - min) / 15."""
    if scheme == "int8":
        s = w.abs().amax(1, keepdim=True) / 127
        return (w / s).round().clamp(-127, 127) * s
    g = w.reshape(w.shape[0], -1, group_size)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    s = (hi - lo) / 15
    return (((g - lo) / s).round().clamp(0, 15) * s + lo).reshape(w.shape)


def fake_quantized(hf, scheme: str):
    """A copy of the fp32 transformers model whose projection weights and LM head are
    rounded as `scheme` would store them; the embedding table stays exact (untied)."""
    hf = copy.deepcopy(hf)
    with torch.no_grad():
        for module in list(hf.modules()):
            if isinstance(module, nn.Linear):
                module.weight = nn.Parameter(round_weights(module.weight, scheme))
            elif type(module).__name__ == "Conv1D":                  # GPT-2: weight is (in, out)
                module.weight = nn.Parameter(round_weights(module.weight.t(), scheme).t().contiguous())
    return hf.eval()


@functools.lru_cache(maxsize=None)
def quantized(model, scheme: str):
    """Quantized once per process (a mutation run forks from a process that has it)."""
    return quantize(model, scheme)


@pytest.fixture(scope="module")
def int8(model):
    return quantized(model, "int8")


# -- the layers ------------------------------------------------------------------

def test_int8_layer_rounding_and_kernel():
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(96, 64, generator=g), torch.randn(96, generator=g)
    layer = Int8Linear(w, b, torch.float32)
    scale = w.abs().amax(1, keepdim=True) / 127
    assert ((layer.dequantize() - w).abs() <= scale / 2 + 1e-6).all()   # round to nearest
    x = torch.randn(3, 5, 64, generator=g)
    ref = x @ layer.dequantize().t() + b
    assert torch.allclose(layer(x), ref, atol=1e-4)
    xb = x.bfloat16()
    layer16 = Int8Linear(w, b, torch.bfloat16)
    # bf16 keeps 8 significand bits (~2.4 digits): the error is a fraction of a percent of the outputs' size.
    assert (layer16(xb).float() - ref).abs().max() < 0.02 * ref.abs().max()


def test_int4_layer_rounding_and_kernel():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 128, generator=g)
    layer = Int4Linear(w, None, torch.float32, group_size=32)
    groups = w.view(96, 4, 32)
    scale = ((groups.amax(-1) - groups.amin(-1)) / 15).repeat_interleave(32, 1)
    assert ((layer.dequantize() - w).abs() <= scale / 2 + 1e-5).all()
    x = torch.randn(7, 128, generator=g)
    assert torch.allclose(layer(x), x @ layer.dequantize().t(), atol=1e-3)
    with pytest.raises(ValueError):
        Int4Linear(torch.randn(8, 40), None, torch.float32, group_size=32)


def test_kl_divergence():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 10, generator=g), torch.randn(4, 10, generator=g)
    assert torch.allclose(kl_divergence(a, a), torch.zeros(4), atol=1e-6)
    assert torch.allclose(kl_divergence(a, b), kl(a, b), atol=1e-6)        # KL(p_a || p_b), by torch
    assert not torch.allclose(kl_divergence(a, b), kl(b, a), atol=1e-3)    # not the reverse one


# -- the model -------------------------------------------------------------------

def test_quantize_leaves_the_original_alone(model, int8):
    assert int8 is not model and int8.hf is not model.hf
    assert isinstance(model.hf.lm_head, torch.nn.Linear) and model.dtype == torch.float32
    assert model.hf.lm_head.weight is model.hf.model.embed_tokens.weight       # still tied
    assert isinstance(int8.hf.lm_head, Int8Linear)
    assert isinstance(int8.hf.model.layers[0].mlp.down_proj, Int8Linear)
    # The embedding table stays floating point (bf16 by default): lookups still work.
    ids = labkit.encode(model, "The capital of France is").ids
    assert torch.equal(int8.hf.model.embed_tokens(ids), model.hf.model.embed_tokens(ids).bfloat16())
    assert int8.dtype == torch.bfloat16 and int8.new_cache(16).k.dtype == torch.bfloat16
    # Bytes read per decode step: about a quarter of fp32 (the embedding lookup is not counted).
    assert 0.2 < int8.weight_nbytes / model.weight_nbytes < 0.3


def test_int8_close_to_fp32(model, int8):
    for text in PROMPTS[:4]:
        ids = labkit.encode(model, text).ids
        ref, out = model.forward(ids), int8.forward(ids)
        assert kl_divergence(ref, out).mean() < 0.05, text
        assert (ref.argmax(-1) == out.argmax(-1)).float().mean() > 0.9, text
        assert ref[-1].argmax() == out[-1].argmax(), text           # the next token itself
    q = measure_quality(model, int8, PROMPTS[:2], max_new_tokens=4)
    assert q.kl_mean < 0.05 and q.greedy_prefix > 0.5, q


def test_int8_paris(int8):
    assert labkit.generate(int8, "The capital of France is", 2).text.startswith(" Paris")


def test_int4_close_enough(model):
    int4 = quantized(model, "int4")
    assert isinstance(int4.hf.model.layers[0].self_attn.q_proj, Int4Linear)
    assert 0.12 < int4.weight_nbytes / model.weight_nbytes < 0.2
    q = measure_quality(model, int4, PROMPTS[:2], max_new_tokens=2)
    assert q.kl_mean < 0.6, q
    assert q.top1_agreement > 0.6, q


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_every_family_quantizes(kind, scheme):
    m = labkit.Model(tiny_hf_model(kind))
    q = quantize(m, scheme, dtype=torch.float32)
    ids = torch.randint(0, 211, (32,), generator=torch.Generator().manual_seed(1))
    out = q.forward(ids)
    with torch.inference_mode():
        ref = m.hf(ids[None]).logits[0]
    assert out.shape == ref.shape
    # The quantized model computes with the rounded weights, nothing else: transformers
    # running the fp32 model with its weights rounded by the formulas gives the same logits
    # (logit std ~1.6); labkit's forward and transformers' own forward on the quantized
    # layers both must. Measured: <= 1.5e-5 (the kernels' fp32 round-off).
    with torch.inference_mode():
        expected = fake_quantized(m.hf, scheme)(ids[None]).logits[0]
        hf_out = q.hf(ids[None]).logits[0]
    print(f"{kind} {scheme}: labkit {(out - expected).abs().max():.1e}, "
          f"transformers {(hf_out - expected).abs().max():.1e}")
    assert (out - expected).abs().max() < 1e-4
    assert (hf_out - expected).abs().max() < 1e-4
    # What the rounding costs, against the KL of a flat prediction (zero logits: what a
    # model whose layers output nothing would say). Measured KL / flat KL: int8 4.8e-4 to
    # 1.9e-3, int4 0.09 to 0.24 (random weights fill each group's range evenly, the worst
    # case for 4 bits; the default model loses far less, test_int4_close_enough).
    divergence = kl(ref, out).mean()
    flat = kl(ref, torch.zeros_like(ref)).mean()
    print(f"{kind} {scheme}: KL {divergence:.2e}, flat KL {flat:.2f}, ratio {divergence / flat:.1e}")
    assert divergence < (0.01 if scheme == "int8" else 0.5) * flat


def test_int4_more_rows_than_the_kernel_takes():
    """Past INT4_KERNEL_MAX_ROWS rows Int4Linear expands its weights and runs one matmul;
    that path must give what the kernel gives row by row, and the fp32 matmul with the
    de-quantized weights."""
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(320, 256, generator=g), torch.randn(320, generator=g)
    x = torch.randn(INT4_KERNEL_MAX_ROWS + 72, 256, generator=g)
    expected = x @ round_weights(w, "int4").t() + b                    # outputs of size ~50
    # Measured: fp32 max 4.2e-5 (expanded vs kernel), 1.5e-5 (vs the reference); bf16 0.50 and
    # 0.47, one bf16 step at 64-128.
    for dtype, tol in ((torch.float32, 5e-4), (torch.bfloat16, 2.0)):
        layer = Int4Linear(w, b, dtype, group_size=32)
        xd = x.to(dtype)
        many = layer(xd).float()
        by_row = torch.cat([layer(xd[i:i + 1]) for i in range(len(x))]).float()
        print(f"{dtype}: expanded vs kernel {(many - by_row).abs().max():.2e}, "
              f"vs fp32 reference {(many - expected).abs().max():.2e}, "
              f"kernel vs fp32 reference {(by_row - expected).abs().max():.2e}, size {expected.abs().max():.0f}")
        assert (many - by_row).abs().max() <= tol, dtype
        assert (many - expected).abs().max() <= tol, dtype


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_int4_long_prefill(kind):
    """A 220-token prefill (every int4 layer on its many-rows path) against the same
    tokens in two cached chunks of 110 (the kernel path) and against transformers."""
    m = labkit.Model(tiny_hf_model(kind))
    q = quantize(m, "int4", dtype=torch.float32)
    ids = torch.randint(0, 211, (220,), generator=torch.Generator().manual_seed(3))
    full = q.forward(ids)
    cache = q.new_cache(256)
    chunks = torch.cat([q.forward(ids[:110], cache=cache), q.forward(ids[110:], cache=cache)])
    with torch.inference_mode():
        expected = fake_quantized(m.hf, "int4")(ids[None]).logits[0]
    print(f"{kind}: 220 rows vs 2 x 110 {(full - chunks).abs().max():.1e}, "
          f"vs transformers {(full - expected).abs().max():.1e}, logit std {expected.std():.2f}")
    # Measured: 5.5e-6 and 1.9e-5 on logits of std ~1.6.
    assert (full - chunks).abs().max() < 1e-4
    assert (full - expected).abs().max() < 1e-4


def test_bad_scheme(model):
    with pytest.raises(ValueError):
        quantize(model, "int3")


# -- what the bundled model holds, and counting it -----------------------------------

def test_distinct_values_per_block():
    w = torch.arange(64.0).repeat(3, 1)                   # (3, 64): every value distinct
    assert torch.equal(quantize_module.distinct_values_per_block(w, 32), torch.full((3, 2), 32))
    w[:, :32] = (torch.arange(32) % 5).float()             # 5 levels in the first block
    assert torch.equal(quantize_module.distinct_values_per_block(w, 32)[:, 0], torch.full((3,), 5))
    assert torch.equal(quantize_module.distinct_values_per_block(torch.zeros(2, 8), 4), torch.ones(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="block_size"):
        quantize_module.distinct_values_per_block(torch.zeros(2, 40), 32)
    with pytest.raises(ValueError, match="block_size"):
        quantize_module.distinct_values_per_block(torch.zeros(2, 40), 0)


def test_default_model_is_q4_1_and_int4_reproduces_it(model):
    """The bundled model's projections are de-quantised Q4_1 blocks of 32 (<= 16
    values each), and labkit's int4 (groups of 32, min and scale, fp32 scales)
    stores each of them exactly: re-quantizing them loses nothing."""
    table = model.hf.get_input_embeddings().weight
    for name, p in model.hf.named_parameters():
        if p.dim() != 2 or p is table:
            continue
        w = p.detach()
        assert int(quantize_module.distinct_values_per_block(w, 32).max()) <= 16, name
        assert torch.equal(Int4Linear(w, None, torch.float32).dequantize(), w), name
    # The embedding table / LM head is Q8_0: not 4-bit, so int4 changes it.
    head = Int4Linear(table.detach()[:4096], None, torch.float32)
    assert (head.dequantize() - table[:4096]).abs().max() > 1e-3


def test_n_params_counts_quantized_weights_once(model, int8):
    assert int8.n_params == model.n_params                # tied head: the table's parameters, once
    assert "135M params" in repr(int8)
    assert quantized(model, "int4").n_params == model.n_params
    tiny = labkit.Model(tiny_hf_model("llama"))           # untied LM head: counted as its own matrix
    assert quantize(tiny, "int8", dtype=torch.float32).n_params == tiny.n_params
