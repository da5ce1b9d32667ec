"""labkit.views (and the labkit.jupyter plumbing under them) driven from pytest, without a browser.

There is no running event loop here, so every control acts at once; the last
tests start a loop to check that slider bursts are coalesced and long runs
yield to it. Each test reads the figures a view would show and checks them
against the engine (labkit.distribution / sample / generate).
"""

import asyncio

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

import labkit
from labkit import charts, jupyter, views

PROMPT = "The capital of France is"


def bars(view):
    """(colours of the 'before' bars, their heights, the 'after' heights)."""
    fig = view.figure("distribution")
    before, after = fig.data[0], fig.data[1]
    return list(before.marker.color), np.array(before.y), np.array(after.y)


def no_model_calls(model, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("the model was called")
    monkeypatch.setattr(model, "forward", forbidden)


def count_model_calls(model, monkeypatch) -> list:
    calls, real = [], model.forward

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)
    monkeypatch.setattr(model, "forward", counting)
    return calls


# ----------------------------------------------------------------------------
# SamplingExplorer: sliders re-filter logits computed once
# ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def explorer(model):
    return views.SamplingExplorer(model, PROMPT, method="temperature")


def test_sliders_refilter_without_calling_the_model(model, explorer, monkeypatch):
    no_model_calls(model, monkeypatch)
    c = explorer.controls
    c.method.value, c.temperature.value = "temperature", 0.5
    _, before, cold = bars(explorer)
    c.temperature.value = 1.5
    _, _, hot = bars(explorer)
    assert hot[0] < cold[0]                                     # hotter: the top token loses mass
    assert before[0] == pytest.approx(float(explorer.logits.softmax(-1).max()))

    c.method.value, c.top_k.value = "top_k", 3
    colours, _, after = bars(explorer)
    assert sum(col != charts.GREY for col in colours) == 3
    assert (after[:3] > 0).all() and (after[3:] == 0).all()

    # At temperature 1 the bars' running total is what top-p counts.
    c.method.value, c.temperature.value, c.top_p.value = "top_p", 1.0, 0.5
    colours, before, _ = bars(explorer)
    kept = [b for col, b in zip(colours, before) if col != charts.GREY]
    assert sum(kept) >= 0.5 > sum(kept[:-1])                    # the smallest set reaching p
    assert explorer.error.value == ""


def test_bad_value_shows_in_the_view(explorer):
    c = explorer.controls
    c.method.value, c.top_p.value = "top_p", 0.7
    good = bars(explorer)[2]
    c.top_p.value = 0.0                                         # the engine rejects top_p = 0
    assert "top_p must be in (0, 1]" in explorer.error.value
    assert (bars(explorer)[2] == good).all()                    # the last good chart stays
    c.top_p.value = 0.7
    assert explorer.error.value == ""


def test_sample_button_marks_the_drawn_token(explorer):
    c = explorer.controls
    c.method.value, c.temperature.value, c.top_k.value = "top_k", 1.0, 5
    explorer.draws = 0
    explorer.sample_button.click()
    token, _ = labkit.sample(explorer.logits, "top_k", temperature=1.0, top_k=5, seed=explorer.seed)
    assert explorer.chosen == token
    widths = list(explorer.figure("distribution").data[0].marker.line.width)
    assert widths.index(4) == explorer.top_ids.tolist().index(token)
    c.top_k.value = 6                                           # a new distribution drops the mark
    assert 4 not in list(explorer.figure("distribution").data[0].marker.line.width)


def test_figurewidget_is_changed_in_place(explorer):
    if explorer.figure_mode != "figurewidget":
        pytest.skip("FigureWidget is not available here")
    box = explorer.boxes["distribution"]
    widget = box.view
    c = explorer.controls
    c.method.value, c.top_p.value = "top_p", 0.6               # draws the top-p line
    c.method.value = "temperature"                              # the line must go again
    assert box.view is widget and isinstance(widget, go.FigureWidget)

    def plain(fig):
        d = go.Figure(fig).to_dict()
        d["layout"].pop("template", None)
        d["data"] = [{k: v for k, v in t.items() if k != "uid"} for t in d["data"]]
        return d
    assert repr(plain(widget)) == repr(plain(box.figure))
    assert "shapes" not in plain(widget)["layout"]


# ----------------------------------------------------------------------------
# LiveGeneration: step / run / reset
# ----------------------------------------------------------------------------

def test_live_steps_match_generate(model):
    view = views.LiveGeneration(model, PROMPT, max_new_tokens=4)
    n_prompt = len(view.prompt_ids)
    for _ in range(3):
        view.step()
    strip, cache_fig, row = view.figure("tokens"), view.figure("cache"), view.figure("attention")
    assert len(strip.data[0].text) == 3
    used = np.array(cache_fig.data[0].customdata)
    assert len(used) == 3
    assert (np.diff(used) == view.cache.bytes_per_token).all()
    assert used[0] == n_prompt * view.cache.bytes_per_token
    # Step 2's query is token 1, fed at position n_prompt + 1: it sees n_prompt + 2 keys.
    assert len(row.data[0].y) == n_prompt + 2
    assert sum(row.data[0].y) == pytest.approx(1.0, abs=1e-4)
    view.run()
    gen = labkit.generate(model, PROMPT, max_new_tokens=4, method="greedy")
    assert view.token_ids == gen.token_ids
    assert view.finished and view.step() is None


def test_live_set_prompt_starts_again_from_it(model):
    view = views.LiveGeneration(model, PROMPT, max_new_tokens=2)
    view.step()
    view.set_prompt("Water boils at", max_new_tokens=3)
    assert view.token_ids == [] and view.prompt_text == "Water boils at" and view.max_new_tokens == 3
    view.run()
    assert view.token_ids == labkit.generate(model, "Water boils at", max_new_tokens=3).token_ids
    view.set_prompt("Hi", chat=True)
    assert view.prompt_tokens[0] == "<|im_start|>" and view.max_new_tokens == 3
    with pytest.raises(ValueError, match="empty"):
        view.set_prompt("")


def test_buttons_and_selectors(model):
    view = views.LiveGeneration(model, PROMPT, max_new_tokens=2)
    view.step_button.click()
    view.step_button.click()
    assert len(view.token_ids) == 2
    before = np.array(view.figure("attention").data[0].y)
    view.selectors.layer.value, view.selectors.head.value = 5, 3
    after = view.figure("attention")
    assert np.allclose(after.data[0].y, view._row[5, 3].numpy())
    assert not np.allclose(after.data[0].y, before)
    view.reset_button.click()
    assert view.token_ids == [] and view.cache.length == 0
    assert len(view.figure("cache").data[0].y) == 0
    view.run_button.click()
    assert len(view.token_ids) == 2 and view.finish_reason == "length"


def test_bad_value_stops_a_step_before_the_model_runs(model):
    view = views.LiveGeneration(model, PROMPT, max_new_tokens=3, method="top_p")
    view.controls.top_p.value = 0.0
    assert "top_p" in view.error.value                          # shown as soon as it is set
    view.step_button.click()
    assert "top_p must be in (0, 1]" in view.error.value
    assert view.token_ids == [] and view.cache.length == 0


def test_beam_runs_as_a_whole(model):
    view = views.LiveGeneration(model, PROMPT, max_new_tokens=2, method="beam", num_beams=2)
    view.run()
    gen = labkit.generate(model, PROMPT, max_new_tokens=2, method="beam", num_beams=2)
    assert view.token_ids == gen.token_ids
    assert "beam" in view.finish_reason
    assert len(view.figure("tokens").data[0].text) == len(gen.token_ids)
    used = view.figure("cache").data[0].customdata            # two beams: twice the cache per token
    assert list(used) == [s.cache_nbytes for s in gen.steps]
    assert view.cache.bytes_per_token == 2 * model.new_cache(max_len=1).bytes_per_token


# ----------------------------------------------------------------------------
# The other figure modes: an Output that re-renders the figure
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["display", "outputs"])
def test_output_modes(model, mode):
    view = views.SamplingExplorer(model, PROMPT, method="top_k", top_k=50, figure_mode=mode)
    box = view.boxes["distribution"]
    assert not isinstance(box.view, go.FigureWidget)

    def shown_colours():
        (out,) = box.view.outputs
        return out["data"]["application/vnd.plotly.v1+json"]["data"][0]["marker"]["color"]
    assert sum(c != charts.GREY for c in shown_colours()) == views.TOP_N
    view.controls.top_k.value = 3
    assert sum(c != charts.GREY for c in shown_colours()) == 3

    live = views.LiveGeneration(model, PROMPT, max_new_tokens=2, figure_mode=mode)
    live.step()
    assert all(box.mode == mode for box in live.boxes.values())
    (out,) = live.boxes["tokens"].view.outputs
    assert len(out["data"]["application/vnd.plotly.v1+json"]["data"][0]["text"]) == 1


def test_figure_mode_follows_where_the_kernel_runs(model, monkeypatch):
    import sys
    import types
    assert jupyter.default_figure_mode() == ("figurewidget" if jupyter.figurewidget_works() else "display")
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    assert jupyter.figurewidget_works() is False and jupyter.default_figure_mode() == "display"
    monkeypatch.setenv("VOILA_BASE_URL", "/")
    assert jupyter.in_voila() and jupyter.default_figure_mode() == "outputs"
    assert views.TokenizerView(model, "Hi").boxes["tokens"].mode == "outputs"     # chosen per view, at build
    with pytest.raises(ValueError, match="figure_mode must be one of"):
        views.TokenizerView(model, "Hi", figure_mode="widget")
    with pytest.raises(ValueError, match="mode must be one of"):
        jupyter.FigureBox(go.Figure(), mode="svg")


# ----------------------------------------------------------------------------
# The smaller views
# ----------------------------------------------------------------------------

def test_tokenizer_view_follows_the_text(model):
    view = views.TokenizerView(model, "Hello")
    view.text.value = PROMPT
    enc = labkit.encode(model, PROMPT)
    strip, table = view.figures()
    assert [int(i) for i in strip.data[0].customdata] == enc.ids.tolist()
    assert list(table.data[0].cells.values[0]) == enc.ids.tolist()
    view.chat.value = True
    assert len(view.figure("tokens").data[0].customdata) == len(labkit.encode(model, PROMPT, chat=True).ids)
    view.chat.value, view.text.value = False, ""
    assert len(view.figure("tokens").data[0].customdata) == 0 and view.error.value == ""


def test_attention_explorer_draws_the_chosen_head(model, monkeypatch):
    view = views.AttentionExplorer(model, PROMPT)
    no_model_calls(model, monkeypatch)
    view.selectors.layer.value, view.selectors.head.value = 7, 4
    head, grid = view.figures()
    assert np.allclose(head.data[0].z, view.trace.attentions[7][4].numpy())
    assert len(grid.data) == model.config.n_heads
    assert np.allclose(grid.data[4].z, view.trace.attentions[7][4].numpy())


def test_position_explorer_marks_the_chosen_pair(model):
    view = views.PositionExplorer(model, n_positions=32, d_model=16)
    view.position.value, view.pair.value = 9, 3
    sin_fig, rope_fig = view.figures()
    box = sin_fig.layout.shapes[-1]
    assert (box.x0, box.x1, box.y0, box.y1) == (5.5, 7.5, 8.5, 9.5)
    marker = rope_fig.data[-1]
    expected = float(labkit.model_rope_angles(model, [9])[0, 3]) % (2 * np.pi)
    assert marker.x[0] == 9 and marker.y[0] == pytest.approx(expected)


def test_position_explorer_without_rope_shows_the_table_alone(model):
    view = views.PositionExplorer(model, n_positions=32, d_model=16, rope=False)
    assert list(view.boxes) == ["sinusoidal"] and "RoPE" not in view.info.value
    view.position.value, view.pair.value = 4, 1
    (sin_fig,) = view.figures()
    box = sin_fig.layout.shapes[-1]
    assert (box.x0, box.x1, box.y0, box.y1) == (1.5, 3.5, 3.5, 4.5)
    assert "PE[4, 2] = sin(4ω)" in view.info.value


def test_prompt_length_explorer(model):
    text = "The capital of France is Paris. " * 6
    view = views.PromptLengthExplorer(model, text, length=8)
    view.slider.value = 20
    prefill, cache = view.figures()
    assert sorted(view.prefill_s) == [8, 20] and list(prefill.data[0].x) == [8, 20]
    assert "prefill" in prefill.layout.yaxis.title.text
    gqa = cache.data[0].customdata[1]                           # bars: MHA, GQA, MQA
    assert gqa == view.cache.nbytes == 20 * view.cache.bytes_per_token
    with pytest.raises(ValueError):
        view.set_length(0)


def test_display_copies_and_html(model, explorer, tmp_path):
    assert hasattr(explorer, "_ipython_display_") and explorer.widget is not None
    copy = explorer.figure("distribution")
    copy.data[0].y = [0.0] * len(copy.data[0].y)
    assert max(explorer.figure("distribution").data[0].y) > 0  # a copy, not the live figure
    path = explorer.save_html(tmp_path / "sampling.html")
    assert "plotly" in path.read_text()[:6_000_000]


# ----------------------------------------------------------------------------
# With a running event loop (as in a kernel): coalescing and yielding
# ----------------------------------------------------------------------------

def test_slider_burst_runs_the_model_once(model, monkeypatch):
    view = views.PromptLengthExplorer(model, "The capital of France is Paris. " * 4, length=4)
    calls = count_model_calls(model, monkeypatch)

    async def drag():
        for n in (5, 6, 7, 8, 9):
            view.slider.value = n
        assert calls == []                                      # nothing yet: waiting for the burst to end
        await asyncio.sleep(jupyter.MODEL_DELAY_S + 0.5)
    asyncio.run(drag())
    assert len(calls) == 1 and view.length == 9


def test_run_button_yields_and_stops(model):
    view = views.LiveGeneration(model, PROMPT, max_new_tokens=20)

    async def run_then_stop():
        view.run_button.click()
        assert view.busy and view.run_button.description == "stop" and view.token_ids == []
        while not view.token_ids:                               # the loop gets control between steps
            await asyncio.sleep(0.01)
        view.run_button.click()                                 # stop
        await asyncio.sleep(0.2)
    asyncio.run(run_then_stop())
    assert 1 <= len(view.token_ids) <= 3 and not view.busy     # stopped within a step or two
    assert view.run_button.description == "run"


def test_live_generation_regenerates_when_a_control_moves(model):
    view = views.LiveGeneration(model, "Once upon a time", max_new_tokens=4, method="temperature",
                                  temperature=1.0, regenerate=True, seed=0)
    view.run()
    first = list(view.token_ids)
    view.controls.temperature.value = 0.0           # temperature 0 = greedy
    view.flush()
    greedy = labkit.generate(model, "Once upon a time", max_new_tokens=4, stop_at_eos=False).token_ids
    assert first != greedy                           # the sampled run was different ...
    assert len(view.token_ids) == len(first) == 4
    assert view.token_ids == greedy                  # ... and moving the slider redid it greedily
