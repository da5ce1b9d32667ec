"""labkit.dashboard: the one-screen lecture dashboard, driven without a browser."""

import asyncio

import ipywidgets
import pytest

import labkit
from labkit.dashboard import Dashboard


@pytest.fixture(scope="module")
def dash(model):
    return Dashboard(model, max_new_tokens=6)


def all_children(w):
    yield w
    for c in getattr(w, "children", ()):
        yield from all_children(c)


def test_one_screen_has_every_piece(dash):
    parts = list(all_children(dash.widget))
    for piece in (dash.prompt, dash.chat, dash.max_tokens, dash.live.step_button, dash.live.run_button,
                  dash.live.reset_button, dash.controls.method, dash.controls.temperature,
                  dash.selectors.layer, dash.live.status, dash.timing, dash.error):
        assert piece in parts
    assert set(dash.boxes) == {"tokens", "distribution", "attention", "cache", "timing"}
    for box in dash.boxes.values():
        assert box.widget in parts
        assert box.figure.layout.width == dash.boxes["tokens"].width      # sized for two columns


def test_step_updates_every_chart(dash, model):
    dash.reset()
    before = {name: fig.to_json() for name, fig in zip(dash.boxes, dash.figures())}
    first = dash.step()
    dash.step()
    after = dict(zip(dash.boxes, dash.figures()))
    assert all(after[name].to_json() != before[name] for name in before)
    greedy = labkit.generate(model, "The capital of France is", max_new_tokens=2)
    assert dash.live.token_ids == greedy.token_ids and first == greedy.token_ids[0]
    timing = after["timing"]
    assert len(timing.data[0].y) == 2                               # one bar per step
    assert "prefill" in dash.timing.value and "decode step" in dash.timing.value
    assert dash.prefill_s == dash.live.seconds[0] > 0
    assert dash.decode_step_s == dash.live.seconds[1] > 0          # the mean of one decode step
    assert len(after["tokens"].data[0].text) == 2                   # the streamed tokens
    assert len(after["attention"].data[0].y) == len(dash.live.prompt_ids) + 1


def test_run_to_the_end_and_reset(dash):
    dash.reset()
    ids = dash.run()
    assert len(ids) == 6 and dash.live.finished
    dash.reset()
    assert dash.live.token_ids == [] and "prefill" not in dash.timing.value
    assert len(dash.figure("timing").data[0].y) == 0


def test_new_prompt_starts_again(dash, model):
    dash.reset()
    dash.step()
    dash.set_prompt("Water boils at")
    assert dash.live.token_ids == [] and dash.live.prompt_text == "Water boils at"
    dash.step()
    assert dash.live.token_ids == labkit.generate(model, "Water boils at", max_new_tokens=1).token_ids
    dash.chat.value = True
    dash.flush()
    assert dash.live.prompt_text.startswith("<|im_start|>") and dash.live.token_ids == []
    dash.max_tokens.value = 3
    dash.flush()
    assert dash.run() and len(dash.live.token_ids) <= 3
    dash.chat.value = False
    dash.max_tokens.value = 6
    dash.set_prompt("The capital of France is")


def test_sampling_controls_apply(dash):
    dash.reset()
    dash.controls.method.value = "top_k"
    dash.controls.top_k.value = 1                  # top-1 sampling is greedy
    dash.step()
    fig = dash.figure("distribution")
    assert sum(y > 0 for y in fig.data[1].y) == 1
    dash.controls.method.value = "greedy"
    dash.reset()


def test_errors_show_in_the_page(dash):
    dash.set_prompt("")
    assert "empty" in dash.error.value
    dash.set_prompt("The capital of France is")
    assert dash.error.value == ""


def test_prompt_box_waits_for_the_event_loop(model):
    """In a kernel, a new prompt is applied a moment later, once (typing bursts merge)."""
    async def main():
        d = Dashboard(model, max_new_tokens=2)
        d.prompt.value = "Water"
        d.prompt.value = "Water boils at"
        assert d.live.prompt_text == "The capital of France is"     # not yet
        await asyncio.sleep(0.2)
        return d
    d = asyncio.run(main())
    assert d.live.prompt_text == "Water boils at"
    assert isinstance(d.widget, ipywidgets.VBox)


def test_page_figures_under_voila(model, monkeypatch):
    """Under Voila the charts are Output widgets whose outputs are replaced at each update."""
    from labkit import jupyter

    monkeypatch.setenv("VOILA_BASE_URL", "/")
    assert jupyter.in_voila()
    d = Dashboard(model, max_new_tokens=3)
    assert d.figure_mode == d.live.figure_mode == "outputs"
    assert all(b.mode == "outputs" and isinstance(b.view, ipywidgets.Output) for b in d.boxes.values())
    assert all(d.live.boxes[name] is d.boxes[name] for name in d.live.boxes)
    d.step()
    out = d.boxes["tokens"].view.outputs
    assert len(out) == 1
    shown = out[0]["data"]["application/vnd.plotly.v1+json"]
    assert shown["data"][0]["customdata"] == d.live.token_ids          # the chart shows the new token
    assert shown["layout"]["width"] == d.boxes["tokens"].width
    assert len(d.figure("timing").data[0].y) == 1
    if jupyter.figurewidget_works():                                    # a choice passed in wins
        assert all(b.mode == "figurewidget" for b in
                   Dashboard(model, max_new_tokens=2, figure_mode="figurewidget").boxes.values())
