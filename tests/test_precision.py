"""labkit.precision: bytes, speed and quality of the same model at lower precision."""

import numpy as np
import pytest
import scipy.stats
import torch

import labkit
from labkit import charts, precision, quantize


# SmolLM2-135M's parameters, counted by hand from its config (30 layers, d_model 576,
# 9 query / 3 KV heads of 64, d_ff 1536, vocab 49152, tied embeddings):
# embedding 49152 x 576 + 30 x (q, o 576 x 576; k, v 576 x 192; 3 x 576 x 1536; 2 norms of 576) + final norm
N_PARAMS = 49152 * 576 + 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536 + 2 * 576) + 576
assert N_PARAMS == 134_515_008


@pytest.fixture(scope="module")
def bf16(load_default):
    return load_default("bf16")


def test_measure_precisions_and_chart(model, bf16):
    prompts = ["The capital of France is", "Water boils at"]
    results = precision.measure_precisions(model, {"bf16": bf16, "fp32 again": model}, prompts, max_new_tokens=3)
    ref, low, same = results
    assert [r.name for r in results] == ["fp32", "bf16", "fp32 again"]
    assert ref.quality is None and ref.kl_mean == 0 and ref.row()["top1_agree"] == 1
    # The same model again: no difference at all.
    assert same.quality.kl_mean == 0 and same.quality.greedy_identical == 1 and same.token_ids == ref.token_ids
    q = low.quality
    # Measured for bf16 on these 12 positions: KL mean 0.0022 nats, max 0.0077; allowed ~9x.
    assert 0 < q.kl_mean < 0.02 and q.kl_max < 0.07 and q.n_prompts == 2
    assert q.n_positions == sum(len(labkit.encode(model, p).ids) + 2 for p in prompts)   # prompt + 2 forced
    # Measured: bf16's greedy continuations equal fp32's for the first 16 tokens of both
    # prompts, and its top-1 agrees at all 12 positions. The generation's decode steps run
    # the one-token bf16 path (torch.mv in transformer.linear), which the teacher-forced
    # KL above never touches: a broken decode path fails here.
    assert low.token_ids == ref.token_ids and q.greedy_identical == 1 and q.greedy_prefix == 1
    assert q.top1_agreement >= 11 / 12
    # Weight bytes against the hand count: 4 bytes per parameter in fp32, 2 in bf16, plus
    # the same few fp32 buffers in both (RoPE inverse frequencies, 256 bytes measured).
    buffers = ref.weight_nbytes - 4 * N_PARAMS
    assert 0 <= buffers < 1024 and low.weight_nbytes == 2 * N_PARAMS + buffers
    assert ref.text.startswith(" Paris") and len(ref.token_ids) == 3
    assert ref.tpot_s > 0 and low.ttft_s > 0 and "cpu" in ref.device
    fig = charts.precision_chart(results)
    assert len(fig.data) == 3 and list(fig.data[0].x) == ["fp32", "bf16", "fp32 again"]
    assert list(fig.data[0].y) == [r.weight_nbytes / 1e6 for r in results]
    assert list(fig.data[2].y) == [0, q.kl_mean, 0]


def test_agrees_with_quantize_measure_quality_on_the_prompt_positions(model, bf16):
    """The KL at the prompt's positions is what labkit.quantize.measure_quality measures."""
    prompt = "The capital of France is"
    ours = precision.measure_precisions(model, {"bf16": bf16}, [prompt], max_new_tokens=1)[1].quality
    theirs = quantize.measure_quality(model, bf16, [prompt], max_new_tokens=1)
    assert ours.n_positions == theirs.n_positions          # one new token: nothing forced beyond the prompt
    assert ours.kl_mean == pytest.approx(theirs.kl_mean, rel=1e-6)   # measured: equal to the last bit
    assert ours.top1_agreement == theirs.top1_agreement


def test_no_prompts(model):
    with pytest.raises(ValueError):
        precision.measure_precisions(model, {}, [])


def test_kl_divergence_is_kl_of_reference_from_model():
    """KL(p_ref || p), against two independent implementations, in both directions
    on asymmetric logits: swapped arguments or a scaled KL fail."""
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(6, 50, generator=g, dtype=torch.float64) * 3
    other = torch.randn(6, 50, generator=g, dtype=torch.float64) * 1.5 + torch.linspace(0, 4, 50, dtype=torch.float64)
    for a, b in ((ref, other), (other, ref)):
        ours = quantize.kl_divergence(a, b).double()
        # torch: kl_div(input=log q, target=log p, log_target=True) sums to KL(p || q)
        torch_kl = torch.nn.functional.kl_div(b.log_softmax(-1), a.log_softmax(-1), log_target=True,
                                              reduction="none").sum(-1)
        scipy_kl = scipy.stats.entropy(a.softmax(-1).numpy(), b.softmax(-1).numpy(), axis=-1)   # KL(p || q)
        # kl_divergence works in float32: on these KLs of 3-7 nats it differs from both
        # float64 references by at most 1.1e-6 (measured); allowed: 1e-5.
        np.testing.assert_allclose(ours.numpy(), torch_kl.numpy(), rtol=0, atol=1e-5)
        np.testing.assert_allclose(ours.numpy(), scipy_kl, rtol=0, atol=1e-5)
    # The two directions differ enough here that swapping the arguments cannot pass.
    forward, backward = quantize.kl_divergence(ref, other), quantize.kl_divergence(other, ref)
    assert ((forward - backward).abs() > 0.1).all()


def test_tpot_is_the_mean_of_each_generation_then_the_median(model, monkeypatch):
    """PrecisionResult.tpot_s: each generation's Generation.tpot_s (the mean,
    (e2e - TTFT) / (N - 1)), then the median across prompts; not the median step."""
    gens = []
    real_generate = precision.generate

    def recording_generate(*args, **kwargs):
        gen = real_generate(*args, **kwargs)
        gens.append(gen)
        return gen

    monkeypatch.setattr(precision, "generate", recording_generate)
    prompts = ["The capital of France is", "Water boils at", "One, two,"]
    (ref,) = precision.measure_precisions(model, {}, prompts, max_new_tokens=3)
    timed = [g for g in gens if len(g.token_ids) == 3]               # not the one-token warm-up
    means = sorted((g.steps[-1].at_s - g.steps[0].at_s) / 2 for g in timed)
    assert len(timed) == 3 and ref.tpot_s == pytest.approx(means[1], rel=1e-9)
    assert ref.ttft_s == timed[0].ttft_s


def test_models_by_name_are_built_one_at_a_time(model, load_default, monkeypatch):
    built = []
    real_lower = precision.lower
    monkeypatch.setattr(precision, "lower", lambda m, name: built.append(name) or real_lower(m, name))
    results = precision.measure_precisions(model, ["bf16", "int8"], ["The capital of France is"], max_new_tokens=2)
    assert built == ["bf16", "int8"] and [r.name for r in results] == ["fp32", "bf16", "int8"]
    assert results[1].weight_nbytes == load_default("bf16").weight_nbytes
    assert results[2].weight_nbytes < 0.6 * results[1].weight_nbytes
    with pytest.raises(ValueError, match="models"):
        precision.measure_precisions(model, ["int3"], ["x"])
    with pytest.raises(ValueError, match="max_new_tokens"):
        precision.measure_precisions(model, {}, ["x"], max_new_tokens=0)


def test_cast_rounds_as_load_model_does(model, bf16):
    cast = precision.cast(model, "bf16")
    assert cast.dtype == torch.bfloat16 and model.dtype == torch.float32     # the original is untouched
    for a, b in zip(cast.hf.parameters(), bf16.hf.parameters()):
        assert torch.equal(a, b)
    assert cast.hf.lm_head.weight is cast.hf.model.embed_tokens.weight     # still tied
    ids = labkit.encode(model, "The capital of France is").ids
    assert torch.equal(cast.forward(ids), bf16.forward(ids))
    fp16 = precision.lower(model, "fp16")
    assert fp16.dtype == torch.float16 and fp16.weight_nbytes == bf16.weight_nbytes
    with pytest.raises(ValueError, match="dtype"):
        precision.cast(model, "int8")
    with pytest.raises(ValueError, match="name"):
        precision.lower(model, "fp8")


def test_original_weights_are_looked_up_without_downloading(tmp_path):
    assert precision.original_model_in_cache(cache_dir=str(tmp_path)) is None
    # A cached snapshot is found.
    snap = tmp_path / "models--HuggingFaceTB--SmolLM2-135M-Instruct" / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    (snap / "model.safetensors").write_bytes(b"x")
    refs = tmp_path / "models--HuggingFaceTB--SmolLM2-135M-Instruct" / "refs"
    refs.mkdir()
    (refs / "main").write_text("0" * 40)
    assert precision.original_model_in_cache(cache_dir=str(tmp_path)) == str(snap / "model.safetensors")
