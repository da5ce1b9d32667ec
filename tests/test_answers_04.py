"""The numbers in docs/answers/04_forward_pass.md, recomputed independently.

Each `**Answer N:**` line of the key is parsed and checked against a computation
that does not go through the notebook's code path: forward hooks on the
`transformers` model for the block updates, the model's own modules for the
logit lens, and the FLOP formula written out here. So the key cannot silently go
wrong when the model, labkit or the notebook changes.
"""

import re
from pathlib import Path

import pytest
import torch

import labkit

KEY = Path(__file__).resolve().parents[1] / "docs" / "answers" / "04_forward_pass.md"
PROMPT = "The capital of France is"


def answer(n: int) -> str:
    """The text after `**Answer n:**` in the key."""
    found = re.search(rf"^\*\*Answer {n}:\*\*(.*)$", KEY.read_text(encoding="utf-8"), re.M)
    assert found, f"no '**Answer {n}:**' line in {KEY}"
    return found.group(1).strip()


def numbers(text: str) -> list[float]:
    return [float(x.replace(",", "")) for x in re.findall(r"-?\d[\d,]*\.?\d*", text)]


def block_updates(model, ids, layer: int) -> tuple[float, float]:
    """Norms at the last token of the attention and FFN updates of one block,
    read with forward hooks on the transformers modules (o_proj output, MLP output)."""
    blk = model.hf.model.layers[layer]
    seen = {}
    hooks = [blk.self_attn.o_proj.register_forward_hook(lambda m, i, o: seen.__setitem__("attn", o)),
             blk.mlp.register_forward_hook(lambda m, i, o: seen.__setitem__("ffn", o))]
    try:
        with torch.inference_mode():
            model.hf(ids[None])
    finally:
        for h in hooks:
            h.remove()
    return float(seen["attn"][0, -1].norm()), float(seen["ffn"][0, -1].norm())


def test_answer_1_update_norms(model):
    ids = labkit.encode(model, PROMPT).ids
    stated = numbers(answer(1))             # block 0, attention, FFN, block 29, attention, FFN
    last = model.config.n_layers - 1
    assert stated[0] == 0 and stated[3] == last
    for (attn, ffn), (s_attn, s_ffn) in zip([block_updates(model, ids, 0), block_updates(model, ids, last)],
                                            [stated[1:3], stated[4:6]]):
        assert s_attn == pytest.approx(attn, abs=0.06) and s_ffn == pytest.approx(ffn, abs=0.06)
        assert ffn > attn                   # the key says the FFN update is the larger one


def test_answer_2_relu_block(model):
    ids = labkit.encode(model, PROMPT).ids
    stated = numbers(answer(2))             # largest difference, probability with ReLU, without
    layer = model.config.n_layers // 2
    mlp = model.hf.model.layers[layer].mlp
    with torch.inference_mode():
        out = model.hf(ids[None], output_hidden_states=True)
        silu_module = mlp.act_fn
        mlp.act_fn = torch.nn.ReLU()
        try:
            relu = model.hf(ids[None], output_hidden_states=True)
        finally:
            mlp.act_fn = silu_module
    # hidden_states[layer + 1] is the stream after the block; the earlier blocks are unchanged
    diff = (relu.hidden_states[layer + 1] - out.hidden_states[layer + 1]).abs().max().item()
    assert stated[0] == pytest.approx(diff, abs=0.06)
    p_relu, p_silu = relu.logits[0, -1].softmax(-1), out.logits[0, -1].softmax(-1)
    assert '" Paris"' in answer(2)
    assert model.tokenizer.decode([int(p_relu.argmax())]) == " Paris"
    assert stated[1] == pytest.approx(p_relu.max().item(), abs=0.0015)
    assert stated[2] == pytest.approx(p_silu.max().item(), abs=0.0015)


def test_answer_3_berlin(model):
    ids = labkit.encode(model, "The capital of Germany is").ids
    stated = numbers(answer(3))             # block, probability, probability of Paris
    with torch.inference_mode():
        out = model.hf(ids[None], output_hidden_states=True)
        hidden = torch.stack(out.hidden_states)[:, 0, -1]           # (layers + 1, d_model) at ' is'
        # the last entry already went through the final norm in transformers; the others did not
        lens = model.hf.lm_head(torch.cat([model.hf.model.norm(hidden[:-1]), hidden[-1:]]))
    berlin = int(out.logits[0, -1].argmax())
    assert model.tokenizer.decode([berlin]) == " Berlin"
    top_from = next(i for i in range(len(lens)) if all(int(r.argmax()) == berlin for r in lens[i:]))
    assert int(stated[0]) == top_from - 1   # hidden_states[i] is the stream after block i - 1
    assert stated[1] == pytest.approx(out.logits[0, -1].softmax(-1)[berlin].item(), abs=0.0015)
    paris = labkit.encode(model, PROMPT).ids
    with torch.inference_mode():
        p_paris = model.hf(paris[None]).logits[0, -1].softmax(-1).max().item()
    assert stated[2] == pytest.approx(p_paris, abs=0.0015)


def forward_flops_by_formula(n_layers, d, heads, kv_heads, hs, d_ff, vocab, tokens):
    """2 FLOPs per weight per token for every matrix (Q, K, V, O, gate, up, down, LM head)
    plus causal attention: q.k and p.v, 2 x head size FLOPs each per key per head."""
    weights = n_layers * (2 * d * heads * hs + 2 * d * kv_heads * hs + 3 * d * d_ff) + vocab * d
    attention = n_layers * heads * 2 * 2 * hs * tokens * (tokens + 1) // 2
    return 2 * weights * tokens + attention


def test_answer_4_flops_1000(model):
    c = model.config
    flops = forward_flops_by_formula(c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.d_ff,
                                     c.vocab_size, 1000)
    assert numbers(answer(4))[0] * 1e9 == pytest.approx(flops, rel=5e-4)


def test_answer_5_llama3_8b_flops():
    flops = forward_flops_by_formula(32, 4096, 32, 8, 128, 14336, 128256, 1000)
    assert numbers(answer(5))[0] * 1e12 == pytest.approx(flops, rel=5e-4)
    assert flops == 15_271_723_008_000      # the exact figure the key's worked answer gives


def test_answer_5_why_the_ratios_differ(model):
    """The worked answer's explanation: FLOP ratio about 50, parameter ratio about 60;
    attention 11 % of the small model's FLOPs at 1,000 tokens and under 2 % of the big one's;
    2 x parameters x tokens over- and under-estimates as stated."""
    c = model.config
    small = forward_flops_by_formula(c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.d_ff,
                                     c.vocab_size, 1000)
    big = forward_flops_by_formula(32, 4096, 32, 8, 128, 14336, 128256, 1000)
    big_params = 8_030_261_248                  # Llama 3 8B (embedding and LM head untied)
    assert round(big / small) == 50 and round(big_params / model.n_params) == 60
    att_small = c.n_layers * c.n_heads * 2 * 2 * c.head_dim * 1000 * 1001 // 2
    att_big = 32 * 32 * 2 * 2 * 128 * 1000 * 1001 // 2
    assert round(att_small / small, 2) == 0.11 and att_big / big < 0.02
    assert big < 2 * big_params * 1000 and small > 2 * model.n_params * 1000
    key = KEY.read_text(encoding="utf-8")
    assert "16.06 TFLOP" in key and f"{2 * big_params * 1000 / 1e12:.2f}" == "16.06"
    assert f"{2 * model.n_params * 1000 / 1e9:.1f} GFLOP" in key
