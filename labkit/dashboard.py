"""The lecture dashboard: one screen, everything a live demo needs, updating in place.

    dash = labkit.dashboard.Dashboard(model)
    dash                      # a cell ending in it shows it; or `voila notebooks/11_dashboard.ipynb`

What is on the screen (two columns of charts, side by side from 1280 pixels wide):

    prompt box | "chat template" box, max-new-tokens slider, step / run / reset
    sampling controls (method, temperature, top-k, top-p, min-p) | the text so far, the last
                                                                  token, prefill, decode step, cache
    generated tokens, coloured by probability  | the newest token's attention row (layer / head)
    the distribution the last token was drawn  | KV cache growth
      from (taller: it has a legend and labels)| time per step (prefill vs decode)

It is built from labkit.views.LiveGeneration (controls, buttons, tokens,
distribution, attention row, cache chart), laid out for a projector, plus
what a lecture adds: a prompt box and the timing chart (charts.timing_chart:
the prefill bar and the mean decode step). Every chart is
redrawn after each step, at a fixed size, so the page does not jump while the
tokens stream in: changed in place in JupyterLab, re-rendered under Voila and
Colab (labkit.jupyter.FigureBox explains the three ways and why).

A new prompt, a change of the chat box or of max new tokens starts again
from the prompt (nothing runs until step or run is pressed).

Left out: model choice from the page (loading another model takes longer
than a lecture pause; pass it in), and editing the system prompt.
"""

from __future__ import annotations

import html

import ipywidgets as widgets
import plotly.graph_objects as go

from . import charts
from .controls import slider_style
from .jupyter import View
from .views import LiveGeneration

# Chart sizes that put the two columns side by side on a 1280-pixel-wide screen
# (a laptop on a projector); on a narrower one the columns stack, and browser
# zoom does the rest. The distribution chart is TALL times higher than the others.
CHART_WIDTH = 590
CHART_HEIGHT = 320
TALL = 1.5


class Dashboard(View):
    """One screen for a live lecture: prompt, sampling controls, step / run / reset,
    streaming tokens, the distribution, the attention row, cache growth, and the
    prefill time and mean decode step (not TTFT / TPOT: a lecturer's pauses
    between clicks would count in those).

    model: a labkit.Model (any device); the other arguments are the starting values.
    `live` is the LiveGeneration doing the work; step(), run(n), reset() and
    set_prompt(text) drive it from code, as the buttons and the box do.
    figure_mode: how every chart is drawn, one of labkit.jupyter.FIGURE_MODES
    ("figurewidget": changed in place, for JupyterLab; "outputs": re-rendered as
    widget state, for Voila; "display": re-displayed, for Colab); None picks the
    one for where the kernel runs.
    Other keywords go to LiveGeneration: starting control values (temperature=,
    top_p=, ...) and regenerate=True (moving a sampling control re-generates
    the tokens so far with the new setting).
    """

    def __init__(self, model, prompt: str = "The capital of France is", max_new_tokens: int = 24,
                 method: str = "greedy", chat: bool = False, seed: int = 0,
                 chart_width: int = CHART_WIDTH, chart_height: int = CHART_HEIGHT,
                 figure_mode: str | None = None, **control_values):
        super().__init__(figure_mode=figure_mode)
        self.model = model
        style = slider_style()
        self.prompt = widgets.Textarea(value=prompt, description="prompt", continuous_update=False,
                                       placeholder="type a prompt, then click outside the box",
                                       layout=widgets.Layout(flex="1 1 auto", height="4.2em"), style=style)
        self.chat = widgets.Checkbox(value=chat, description="chat template", indent=False,
                                     layout=widgets.Layout(width="auto", margin="0 2em 0 0"))
        self.max_tokens = widgets.IntSlider(value=max_new_tokens, min=1, max=128, description="max new tokens",
                                            continuous_update=False, style=style)
        self.live = live = LiveGeneration(model, prompt, max_new_tokens=max_new_tokens, method=method,
                                          seed=seed, chat=chat, figure_mode=self.figure_mode,
                                          on_redraw=self._redraw_timing, **control_values)
        self.controls, self.selectors = live.controls, live.selectors
        self.timing = widgets.HTML()
        self.boxes = dict(live.boxes)     # the same boxes: the live view redraws them, the page shows them
        self.add_box("timing", self._timing_figure())
        # Smaller charts, so that two columns fit side by side; the boxes keep this
        # size at every update, so the page does not jump while tokens stream in.
        for name, box in self.boxes.items():
            height = int(chart_height * (TALL if name == "distribution" else 1))
            if name == "tokens":
                # The token strip keeps its own height (rows for max_new_tokens tokens):
                # a taller figure would stretch the boxes, not add rows.
                height = int(box.figure.layout.height)
            box.resize(chart_width, height)
        self._redraw_timing()

        for w in (self.prompt, self.chat, self.max_tokens):
            w.observe(lambda _: self._redraw_later(self._prompt_changed, "prompt"), names="value")
        self.widget = self._page(chart_width)

    def _page(self, chart_width: int) -> widgets.VBox:
        """The layout: the header (prompt, buttons), controls beside the readout, two columns of charts."""
        live = self.live
        buttons = widgets.HBox([live.step_button, live.run_button, live.reset_button])
        header = widgets.HBox([self.prompt, widgets.VBox([widgets.HBox([self.chat, self.max_tokens]), buttons])],
                              layout=widgets.Layout(width="100%", align_items="center"))
        readout = widgets.VBox([live.status, self.timing],
                               layout=widgets.Layout(flex="1 1 400px", margin="0 0 0 2em"))
        b = self.boxes
        column = widgets.Layout(width=f"{chart_width + 20}px")
        columns = widgets.HBox(
            [widgets.VBox([b["tokens"].widget, b["distribution"].widget], layout=column),
             widgets.VBox([self.selectors.widget, b["attention"].widget, b["cache"].widget,
                           b["timing"].widget], layout=column)],
            layout=widgets.Layout(flex_flow="row wrap", align_items="flex-start"))
        return widgets.VBox([header, widgets.HBox([live.controls.widget, readout]), self.error, live.error,
                             columns])

    # -- driving it from code ---------------------------------------------------

    def step(self) -> int | None:
        """Generate one token (prefill the first time); returns its id, None once finished."""
        self.flush()
        return self.live.step()

    def run(self, n: int | None = None) -> list[int]:
        """Step n times (default: to the end); returns the token ids so far."""
        self.flush()
        return self.live.run(n)

    def reset(self) -> None:
        self.flush()
        self.live.reset()

    def set_prompt(self, prompt: str) -> None:
        """Put `prompt` in the box and start again from it."""
        self.prompt.value = prompt
        self.flush()

    def flush(self) -> None:
        """Do the redraws still waiting for the event loop (the dashboard's and the live view's)."""
        super().flush()
        self.live.flush()

    @property
    def text(self) -> str:
        return self.live.text

    # The lecturer steps by hand, with pauses between clicks, so the dashboard
    # shows each step's own work, not clock time since the request: the
    # prefill time, and the mean decode step (what TPOT is when the steps
    # follow one another without pauses, as in generate).
    @property
    def prefill_s(self) -> float:
        return self.live.seconds[0] if self.live.seconds else float("nan")

    @property
    def decode_step_s(self) -> float:
        """The mean decode step (the timing chart's dashed line)."""
        decode = self.live.seconds[1:]
        return sum(decode) / len(decode) if decode else float("nan")

    # -- reacting ---------------------------------------------------------------

    def _prompt_changed(self) -> None:
        self.live.set_prompt(self.prompt.value, self.chat.value, self.max_tokens.value)

    def _timing_figure(self) -> go.Figure:
        seconds = self.live.seconds
        if not seconds:
            return charts.timing_chart([], prefill_steps=0, title="Time per step (press step or run)")
        return charts.timing_chart(seconds, title="Time per step: prefill vs decode")

    def _redraw_timing(self) -> None:
        live = self.live
        parts = [f"{self.model.name} on <b>{html.escape(str(self.model.device))}</b> "
                 f"({html.escape(str(self.model.dtype).replace('torch.', ''))}), "
                 f"prompt {len(live.prompt_ids)} tokens"]
        if live.seconds:
            parts.append(f"prefill <b>{self.prefill_s * 1e3:.0f} ms</b>")
        if len(live.seconds) > 1:
            parts.append(f"decode step <b>{self.decode_step_s * 1e3:.0f} ms</b> (mean, "
                         f"{1 / self.decode_step_s:.1f} tokens/s)")
        if live.cache_bytes:
            parts.append(f"KV cache {live.cache.length} positions = {charts.format_bytes(live.cache_bytes[-1])}")
        if live.token_ids:
            parts.append(f"last token <b>{html.escape(charts.token_label(live.tokens[-1]))}</b> "
                         f"(p = {live.probs[-1]:.2f})")
        self.timing.value = " · ".join(parts)
        if "timing" in self.boxes:
            self.boxes["timing"].update(self._timing_figure())
