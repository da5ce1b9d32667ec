"""labkit.precision: bytes, speed and quality of the same model at lower precision."""

import pytest

import labkit
from labkit import precision, quantize


def test_measure_precisions_and_chart(model):
    bf16 = labkit.load_model(device="cpu", dtype="bf16")
    prompts = ["The capital of France is", "Water boils at"]
    results = precision.measure_precisions(model, {"bf16": bf16, "fp32 again": model}, prompts, max_new_tokens=3)
    ref, low, same = results
    assert [r.name for r in results] == ["fp32", "bf16", "fp32 again"]
    assert ref.quality is None and ref.kl_mean == 0 and ref.row()["top1_agree"] == 1
    # The same model again: no difference at all.
    assert same.quality.kl_mean == 0 and same.quality.greedy_identical == 1 and same.token_ids == ref.token_ids
    q = low.quality
    assert 0 < q.kl_mean < 0.1 and q.n_prompts == 2
    assert q.n_positions == sum(len(labkit.encode(model, p).ids) + 2 for p in prompts)   # prompt + 2 forced
    assert 0 <= q.greedy_prefix <= 1 and q.top1_agreement > 0.5
    assert abs(2 * low.weight_nbytes - ref.weight_nbytes) < 1e-4 * ref.weight_nbytes   # half the bytes
    assert ref.text.startswith(" Paris") and len(ref.token_ids) == 3
    assert ref.tpot_s > 0 and low.ttft_s > 0 and "cpu" in ref.device
    fig = precision.precision_chart(results)
    assert len(fig.data) == 3 and list(fig.data[0].x) == ["fp32", "bf16", "fp32 again"]
    assert fig.data[2].y[0] == 0 and fig.data[2].y[1] > 0


def test_agrees_with_quantize_compare_on_the_prompt_positions(model):
    """The KL at the prompt's positions is what labkit.quantize.compare measures."""
    bf16 = labkit.load_model(device="cpu", dtype="bf16")
    prompt = "The capital of France is"
    ours = precision.measure_precisions(model, {"bf16": bf16}, [prompt], max_new_tokens=1)[1].quality
    theirs = quantize.compare(model, bf16, [prompt], max_new_tokens=1)
    assert ours.n_positions == theirs.n_positions          # one new token: nothing forced beyond the prompt
    assert ours.kl_mean == pytest.approx(theirs.kl_mean, rel=1e-3)
    assert ours.top1_agreement == theirs.top1_agreement


def test_no_prompts(model):
    with pytest.raises(ValueError):
        precision.measure_precisions(model, {}, [])
