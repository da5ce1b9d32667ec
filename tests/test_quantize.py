"""Weight-only int8 / int4 (labkit.quantize): the layers, the model, the quality cost.

Thresholds. KL(p_fp32 || p_quantized) of the next-token distribution, mean
over every position of the prompts. For scale: bf16 weights alone (an 8-bit
mantissa) give about 0.001-0.003 nats on SmolLM2-135M. int8 per-row rounds
each weight to 1/254 of its row's range: we measured ~0.01 nats and
require < 0.05; int4 in groups of 32 (1/15 of a group's range) measured
~0.2 nats and must stay < 0.6 (a 135M-parameter model is small, so it
feels 4 bits more than a large one does). Top-1 must agree on the
last position of the fixed prompts for int8.
"""

import pytest
import torch

import labkit
from tiny_models import tiny_hf_model
from labkit.quantize import PROMPTS, Int4Linear, Int8Linear, compare, kl_divergence, quantize


@pytest.fixture(scope="module")
def int8(model):
    return quantize(model, "int8")


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
    # bf16 keeps 8 bits of mantissa: the error is a fraction of a percent of the outputs' size.
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
    a = torch.randn(4, 10)
    assert torch.allclose(kl_divergence(a, a), torch.zeros(4), atol=1e-6)
    assert (kl_divergence(a, torch.randn(4, 10)) > 0).all()


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
    q = compare(model, int8, PROMPTS[:2], max_new_tokens=4)
    assert q.kl_mean < 0.05 and q.greedy_prefix > 0.5, q


def test_int8_paris(int8):
    assert labkit.generate(int8, "The capital of France is", 2).text.startswith(" Paris")


def test_int4_close_enough(model):
    int4 = quantize(model, "int4")
    assert isinstance(int4.hf.model.layers[0].self_attn.q_proj, Int4Linear)
    assert 0.12 < int4.weight_nbytes / model.weight_nbytes < 0.2
    q = compare(model, int4, PROMPTS[:2], max_new_tokens=2)
    assert q.kl_mean < 0.6, q
    assert q.top1_agreement > 0.6, q


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_every_family_quantizes(kind, scheme):
    m = labkit.Model(tiny_hf_model(kind))
    q = quantize(m, scheme, dtype=torch.float32)
    ids = torch.randint(0, 211, (9,), generator=torch.Generator().manual_seed(1))
    ref, out = m.forward(ids), q.forward(ids)
    assert out.shape == ref.shape
    assert kl_divergence(ref, out).mean() < (0.01 if scheme == "int8" else 0.1)
    # transformers' own forward runs on the quantized layers too.
    with torch.inference_mode():
        hf_out = q.hf(ids[None]).logits[0]
    assert (hf_out - out).abs().max() < 1e-3


def test_bad_scheme(model):
    with pytest.raises(ValueError):
        quantize(model, "int3")
