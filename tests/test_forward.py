"""Stage 2: labkit's forward pass against transformers, and against itself.

Reference: the transformers model that labkit reads (model.hf). Tolerances:
1e-3 on the default model's logits in fp32, 1e-4 for cached vs uncached.
"""

import pytest
import torch

import labkit
from labkit.transformer import attention_by_hand
from tiny_models import tiny_hf_model

PROMPTS = [
    "The capital of France is",
    "法国的首都是",
    "What color is the sky? Answer in one word.",
]


def hf_logits(model, ids):
    with torch.inference_mode():
        return model.hf(torch.as_tensor(ids)[None]).logits[0].float()


@pytest.mark.parametrize("text", PROMPTS)
def test_default_model_matches_transformers(model, text):
    ids = labkit.encode(model, text).ids
    ours = model.forward(ids).float()
    assert ours.shape == (len(ids), model.config.vocab_size)
    assert (ours - hf_logits(model, ids)).abs().max() <= 1e-3


def test_long_prompt_matches_transformers(model):
    text = " ".join(f"Item {i} is a number of the list." for i in range(80))
    ids = labkit.encode(model, text).ids[:520]
    assert len(ids) >= 512
    ours = model.forward(ids).float()
    assert (ours - hf_logits(model, ids)).abs().max() <= 1e-3


def test_paris(model):
    ids = labkit.encode(model, "The capital of France is").ids
    top = model.forward(ids)[-1].argmax().item()
    assert model.tokenizer.decode([top]) == " Paris"


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gpt2", "llama_mha"])
def test_tiny_random_models_match_transformers(kind):
    hf = tiny_hf_model(kind)
    m = labkit.Model(hf)
    ids = torch.randint(0, 211, (37,), generator=torch.Generator().manual_seed(1))
    ref = hf_logits(m, ids)
    for attention in ("sdpa", "manual"):
        m.attention = attention
        assert (m.forward(ids) - ref).abs().max() <= 1e-4, attention


def test_qwen2_biases_are_used():
    hf = tiny_hf_model("qwen2")
    assert hf.model.layers[0].self_attn.q_proj.bias is not None
    m = labkit.Model(hf)
    ids = torch.arange(10)
    before = m.forward(ids).clone()
    with torch.no_grad():
        hf.model.layers[0].self_attn.k_proj.bias += 1.0
    assert not torch.allclose(m.forward(ids), before)  # labkit reads the live weights


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_cached_decoding_equals_full_forward(kind):
    m = labkit.Model(tiny_hf_model(kind))
    ids = torch.randint(0, 211, (20,), generator=torch.Generator().manual_seed(2))
    full = m.forward(ids)
    cache = m.new_cache(max_len=32)
    parts = [m.forward(ids[:8], cache=cache)]          # prefill 8
    for t in range(8, 14):                              # decode 6, one at a time
        parts.append(m.forward(ids[t:t + 1], cache=cache))
    parts.append(m.forward(ids[14:], cache=cache))      # a chunk after the cache (T > 1, start > 0)
    assert cache.length == 20
    assert (torch.cat(parts) - full).abs().max() <= 1e-4


def test_cached_decoding_on_default_model(model):
    ids = labkit.encode(model, "The capital of France is Paris, and the capital of Italy is").ids
    full = model.forward(ids)
    cache = model.new_cache(max_len=64)
    steps = [model.forward(ids[:4], cache=cache)]
    steps += [model.forward(ids[t:t + 1], cache=cache) for t in range(4, len(ids))]
    assert (torch.cat(steps) - full).abs().max() <= 1e-4
    c = model.config
    assert cache.nbytes == len(ids) * 2 * c.n_layers * c.n_kv_heads * c.head_dim * 4


def test_recorded_and_fast_paths_agree(model):
    ids = labkit.encode(model, "The capital of France is").ids
    fast = model.forward(ids)
    logits, trace = model.forward(ids, record=True)
    assert (logits - fast).abs().max() <= 1e-4
    c = model.config
    assert len(trace.attentions) == c.n_layers and len(trace.hidden) == c.n_layers + 1
    pattern = trace["blocks.3.attn.pattern"]
    assert pattern.shape == (c.n_heads, len(ids), len(ids))
    assert torch.allclose(pattern.sum(-1), torch.ones(c.n_heads, len(ids)), atol=1e-5)
    assert (pattern.triu(1) == 0).all()                 # causal: no query sees a later key
    assert torch.equal(trace["blocks.29.out"], trace.hidden[30])


def test_gqa_by_hand_equals_repeated_kv():
    """Sharing a KV head among a group of query heads = attending with K/V repeated."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 9, 5, 16, generator=g)
    k, v = torch.randn(1, 3, 5, 16, generator=g), torch.randn(1, 3, 5, 16, generator=g)
    out, probs = attention_by_hand(q, k, v, start=0)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), is_causal=True)
    assert torch.allclose(out, ref, atol=1e-5)


def test_logit_lens_last_layer_is_the_model_prediction(model):
    ids = labkit.encode(model, "The capital of France is").ids
    logits, trace = model.forward(ids, record=True)
    top_ids, top_probs = labkit.logit_lens(model, trace, k=3)
    assert top_ids.shape == (model.config.n_layers + 1, len(ids), 3)
    assert torch.equal(top_ids[-1, :, 0], logits.argmax(-1))
    assert (top_probs[:, :, 0] >= top_probs[:, :, 1]).all()


def test_bf16_close_to_transformers_bf16(model):
    m = labkit.load_model(dtype="bf16")
    ids = labkit.encode(m, "The capital of France is").ids
    ours, ref = m.forward(ids).float(), hf_logits(m, ids)
    assert m.dtype == torch.bfloat16
    # bf16 keeps ~3 significant digits; the top token must agree.
    assert (ours - ref).abs().max() < 0.5
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def test_batched_forward_equals_rows(model):
    a = labkit.encode(model, "The capital of France is").ids
    b = labkit.encode(model, "Roses are red and").ids
    assert len(a) == len(b)
    both = model.forward(torch.stack([a, b]))
    assert both.shape == (2, len(a), model.config.vocab_size)
    assert (both[1] - model.forward(b)).abs().max() <= 1e-4


def test_last_only_equals_the_last_row(model):
    ids = labkit.encode(model, "The capital of France is").ids
    last = model.forward(ids, last_only=True)
    assert last.shape == (1, model.config.vocab_size)
    assert (last[0] - model.forward(ids)[-1]).abs().max() <= 1e-5
