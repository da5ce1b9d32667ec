"""labkit.precision: bytes, speed and quality of the same model at lower precision."""

import labkit
from labkit import precision


def test_measure_precisions_and_chart(model):
    bf16 = labkit.load_model(device="cpu", dtype="bf16")
    prompts = ["The capital of France is", "Water boils at"]
    results = precision.measure_precisions(model, {"bf16": bf16}, prompts, max_new_tokens=3)
    ref, low = results
    assert [r.name for r in results] == ["fp32", "bf16"]
    assert ref.quality is None and ref.kl_mean == 0 and ref.row()["top1_agree"] == 1
    assert 0 < low.quality.kl_mean < 0.1 and low.quality.n_prompts == 2
    assert abs(2 * low.weight_nbytes - ref.weight_nbytes) < 1e-4 * ref.weight_nbytes   # half the bytes
    assert ref.text.startswith(" Paris") and len(ref.token_ids) == 3
    assert ref.tpot_s > 0 and low.ttft_s > 0 and "cpu" in ref.device
    fig = precision.precision_chart(results)
    assert len(fig.data) == 3 and list(fig.data[0].x) == ["fp32", "bf16"]
    assert fig.data[2].y[0] == 0 and fig.data[2].y[1] > 0
