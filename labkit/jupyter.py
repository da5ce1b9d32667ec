"""Jupyter plumbing for the views: one chart box, deferred calls, what every view shares.

    box = FigureBox(fig)          # box.widget goes in a layout; box.update(new_fig) redraws it
    class MyView(View): ...       # .widget, .boxes, .figures(), .save_html(path), an error line

What is here, in the order a view uses it:

    where we run      in_kernel, in_voila, in_colab, figurewidget_works, default_figure_mode
    one chart         FigureBox (three ways to draw, FIGURE_MODES, chosen per box)
    waiting a moment  Later (debouncing), REDRAW_DELAY_S, MODEL_DELAY_S, JOB_PAUSE_S
    every view        View: showing, copies of the charts, errors shown in the page,
                      redraws that wait, long jobs that yield to the event loop

How a chart changes (FigureBox's `mode`, one of FIGURE_MODES):

    "figurewidget"  a plotly FigureWidget changed in place: a redraw sends only
                    what differs, in one `batch_update` message, so the chart does
                    not flash. For JupyterLab and Notebook 7.
    "display"       an ipywidgets.Output into which the figure is displayed again
                    (`clear_output(wait=True)` then `display`). For Colab, which
                    ships ipywidgets 7.7 and plotly 5, where FigureWidget does not
                    display (plotly issue 2202, colabtools issue 5889), and for
                    plotly >= 6 without anywidget, where FigureWidget cannot be
                    imported.
    "outputs"       an ipywidgets.Output whose `outputs` are replaced, as plain
                    widget state. For Voila 0.5: there a FigureWidget does not
                    apply the updates sent after the page has loaded, and
                    `with output: display(fig)` called from a job on the event
                    loop (the run button's steps) reaches no output area; widget
                    state arrives either way. The cost is a full re-render.

Each box takes its mode as an argument; None picks `default_figure_mode()`, from
where the kernel runs (Voila, Colab, or a Jupyter with FigureWidget). No module
global decides it, so two views (or the dashboard) can draw differently side by side.

Why redraws wait a moment. A slider dragged in the browser sends a new value
every few milliseconds, and the kernel handles them one after another. If each
one ran the model, the kernel would be busy long after the hand stopped. So a
slider only *asks* for a redraw, on the kernel's event loop a little later, and
a newer request replaces an older one still waiting: a drag costs one redraw,
for the last value (`Later`). Long jobs (run, sweep) go one step per turn of
the loop, so a click on reset or stop is answered between steps. With no event
loop running (pytest, a script) everything happens at once, in order.

Errors raised inside a callback (say top-p = 0, which the engine rejects) are
shown in red in the view, not lost in a log. Calling a method directly raises
as usual.

Only APIs present in both ipywidgets 7.7 and 8 are used. Left out: the controls
(controls.py), the views themselves (views.py), and the chart builders (charts.py).
"""

from __future__ import annotations

import asyncio
import html
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Callable

import ipywidgets as widgets
import plotly.graph_objects as go
import plotly.io as pio

from . import charts

FIGURE_MODES = ("figurewidget", "display", "outputs")

REDRAW_DELAY_S = 0.05   # model-free redraws: just enough to merge a burst of slider values
MODEL_DELAY_S = 0.25    # redraws that run the model: wait until the slider rests
JOB_PAUSE_S = 0.02      # between the steps of a run: time for the kernel to read clicks


# ----------------------------------------------------------------------------
# Where we run
# ----------------------------------------------------------------------------

def in_kernel() -> bool:
    """True inside a Jupyter kernel (not in pytest or a script)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return getattr(get_ipython(), "kernel", None) is not None


def in_voila() -> bool:
    """True in a kernel that Voila started (it sets these variables for its kernels)."""
    return any(k in os.environ for k in ("VOILA_BASE_URL", "VOILA_SERVER_URL", "VOILA_APP_PORT"))


def in_colab() -> bool:
    return "google.colab" in sys.modules


def figurewidget_works() -> bool:
    """FigureWidget displays in JupyterLab / Notebook 7, not in Colab, and needs
    anywidget on plotly >= 6 (importing it raises ImportError without)."""
    if in_colab():
        return False
    try:
        from plotly.graph_objs._figurewidget import FigureWidget  # noqa: F401
    except ImportError:
        return False
    return True


def default_figure_mode() -> str:
    """The FigureBox mode for where this kernel runs (see the module docstring)."""
    if in_voila():
        return "outputs"
    return "figurewidget" if figurewidget_works() else "display"


# ----------------------------------------------------------------------------
# One chart
# ----------------------------------------------------------------------------

class FigureBox:
    """One chart of a view, drawn the way `mode` says (one of FIGURE_MODES; None:
    default_figure_mode()). `.widget` goes in a layout, `.update(fig)` redraws,
    `.figure` is the figure shown.

    width / height, when given, are forced on every figure shown, so the page
    does not jump as the data grows.
    """

    def __init__(self, fig: go.Figure, width: int | None = None, height: int | None = None,
                 mode: str | None = None):
        mode = default_figure_mode() if mode is None else mode
        if mode not in FIGURE_MODES:
            raise ValueError(f"mode must be one of {FIGURE_MODES} or None, got {mode!r}")
        self.mode = mode
        self.width, self.height = width, height
        self.figure = self._sized(fig)
        self.view = go.FigureWidget(self.figure) if mode == "figurewidget" else widgets.Output()
        self._template = pio.templates.default   # the template the figure was built with
        if mode != "figurewidget":
            self._render()
        min_height = height or self.figure.layout.height
        self.widget = widgets.Box([self.view], layout=widgets.Layout(
            min_height=f"{int(min_height)}px" if min_height else None))

    def update(self, fig: go.Figure) -> None:
        self.figure = self._sized(fig)
        if self.mode == "figurewidget":
            # Figures take the default template when built; the same name means the
            # same template (unless someone edited it in place), so skip comparing it.
            template = pio.templates.default
            _sync(self.view, self.figure, same_template=template == self._template)
            self._template = template
        else:
            self._render()

    def resize(self, width: int, height: int) -> None:
        """Show this and every later figure at width x height pixels; the box keeps
        that room, so the page does not jump."""
        self.width, self.height = width, height
        self.widget.layout.min_height = f"{height}px"
        self.widget.layout.width = f"{width + 10}px"
        self.update(self.figure)

    def _sized(self, fig: go.Figure) -> go.Figure:
        if self.width or self.height:
            fig.update_layout(width=self.width or fig.layout.width, height=self.height or fig.layout.height)
        return fig

    def _render(self) -> None:
        if self.mode == "display" and in_kernel():
            from IPython.display import clear_output, display
            with self.view:
                clear_output(wait=True)   # wait: swap in the new chart without a blank flash
                display(self.figure)
        else:
            # "outputs", or no kernel (pytest, a script) where nothing can draw it:
            # the same state a kernel would have made, so it can be inspected.
            self.view.outputs = ({"output_type": "display_data", "metadata": {}, "data": {
                "application/vnd.plotly.v1+json": json.loads(pio.to_json(self.figure)),
                "text/plain": f"<Figure: {self.figure.layout.title.text or ''}>"}},)


def _sync(widget: go.FigureWidget, fig: go.Figure, same_template: bool = False) -> None:
    """Make a FigureWidget show `fig`, sending only what changed, in one message.

    same_template: the widget already has fig's template. Checking that costs
    more than the rest of an update (a template is a large object), so the
    caller says so when it knows.
    """
    new = fig.to_dict()
    layout = new["layout"]
    keep = ("template",) if same_template else ()
    if same_template:
        layout.pop("template", None)
    with widget.batch_update():
        if [t.type for t in widget.data] == [t["type"] for t in new["data"]]:
            for trace, props in zip(widget.data, new["data"]):
                _assign(trace, props, keep=("uid",))   # uid: the widget's own trace ids
        else:
            widget.data = ()
            widget.add_traces(fig.data)
        _assign(widget.layout, layout, keep=keep)


def _assign(obj, props: dict, keep: tuple[str, ...] = ()) -> None:
    """Set every property of a trace or layout to `props`; clear the ones it lacks
    (except `keep`). Plotly compares each value with the one it has and sends
    only real changes."""
    for key in obj.to_plotly_json():
        if key not in props and key not in keep:
            obj[key] = None
    for key, value in props.items():
        obj[key] = value


# ----------------------------------------------------------------------------
# Waiting a moment
# ----------------------------------------------------------------------------

def _running_loop() -> asyncio.AbstractEventLoop | None:
    """The kernel's event loop when we are called from it (a widget callback, a cell)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class Later:
    """Run a function `delay` seconds later on the event loop; a newer call
    replaces one still waiting, so a burst of requests runs it once.
    With no running loop the function runs at once."""

    def __init__(self, delay: float):
        self.delay = delay
        self._fn: Callable[[], None] | None = None
        self._handle: asyncio.TimerHandle | None = None

    def call(self, fn: Callable[[], None]) -> None:
        self._fn = fn
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        loop = _running_loop()
        if loop is None:
            self.flush()
        else:
            self._handle = loop.call_later(self.delay, self.flush)

    def flush(self) -> None:
        """Run the waiting call now (if any)."""
        if self._handle is not None:
            self._handle.cancel()
        fn, self._fn, self._handle = self._fn, None, None
        if fn is not None:
            fn()

    @property
    def pending(self) -> bool:
        return self._fn is not None


# ----------------------------------------------------------------------------
# What every view shares
# ----------------------------------------------------------------------------

class View:
    """What every view shares: .widget, .boxes (its charts by name), an error line,
    display, figures(), save_html().

    A subclass builds its charts with `self.add_box(name, fig)`, asks for redraws
    with `self._redraw_later(fn)`, and queues long jobs with `self._queue(jobs)`.
    figure_mode: how its charts are drawn (see FigureBox; None: for where we run).
    """

    widget: widgets.Widget

    def __init__(self, delay: float = REDRAW_DELAY_S, figure_mode: str | None = None):
        if figure_mode not in FIGURE_MODES + (None,):
            raise ValueError(f"figure_mode must be one of {FIGURE_MODES} or None, got {figure_mode!r}")
        self.figure_mode = default_figure_mode() if figure_mode is None else figure_mode
        self.error = widgets.HTML("")
        self.boxes: dict[str, FigureBox] = {}
        self._later = Later(delay)
        self._errors: dict[str, str] = {}
        self._jobs: list[Callable[[], object]] = []
        self._pumping = False

    # -- showing --------------------------------------------------------------

    def add_box(self, name: str, fig: go.Figure, width: int | None = None,
                height: int | None = None) -> FigureBox:
        """A chart of this view, drawn in the view's figure mode, kept in .boxes[name]."""
        self.boxes[name] = FigureBox(fig, width=width, height=height, mode=self.figure_mode)
        return self.boxes[name]

    def _ipython_display_(self) -> None:
        from IPython.display import display
        display(self.widget)

    def figures(self) -> list[go.Figure]:
        """Copies of the charts as they are now (waiting redraws are done first)."""
        self.flush()
        return [go.Figure(box.figure) for box in self.boxes.values()]

    def figure(self, name: str) -> go.Figure:
        """A copy of one chart, by name (see `.boxes`)."""
        self.flush()
        return go.Figure(self.boxes[name].figure)

    def save_html(self, path: str | Path) -> Path:
        """The current charts as one standalone offline HTML page."""
        return charts.save_html(self.figures(), path, title=f"LLM Inference Lab: {type(self).__name__}")

    def flush(self) -> None:
        """Do now what is still waiting for the event loop: a debounced redraw,
        then any queued jobs (the steps of a run). Notebook cells that check a
        view after moving a control call this, since they cannot yield to the loop."""
        self._later.flush()
        while self._jobs:
            if not self._safely(self._jobs.pop(0), "step"):
                self._jobs.clear()

    @property
    def busy(self) -> bool:
        """True while queued jobs (a run, a sweep) are still going."""
        return self._pumping or bool(self._jobs)

    # -- for subclasses: callbacks, redraws, jobs ------------------------------

    def _safely(self, fn: Callable[[], object], source: str = "update") -> bool:
        """Run fn; on an error, show it in the view instead of raising."""
        try:
            fn()
        except Exception as exc:  # a callback has no caller to raise to: show it
            self._errors[source] = (
                f"<b>{html.escape(type(exc).__name__)}</b>: {html.escape(str(exc))}"
                f"<details><summary>traceback</summary><pre>{html.escape(traceback.format_exc())}</pre></details>")
            self._show_errors()
            return False
        if self._errors.pop(source, None) is not None:
            self._show_errors()
        return True

    def _show_errors(self) -> None:
        self.error.value = "".join(f'<div style="color:#C62828">{m}</div>' for m in self._errors.values())

    def _redraw_later(self, fn: Callable[[], None], source: str = "update") -> None:
        """Run fn a moment later (a newer request replaces this one); errors show in the view."""
        self._later.call(lambda: self._safely(fn, source))

    def _queue(self, jobs: list[Callable[[], object]], source: str = "run") -> None:
        """Run jobs one per turn of the event loop (all at once without a loop).
        A job that fails stops the rest."""
        self._jobs.extend(jobs)
        loop = _running_loop()
        if loop is None:
            while self._jobs:
                if not self._safely(self._jobs.pop(0), source):
                    self._jobs.clear()
            self._busy_changed()
            return
        if not self._pumping:
            self._pumping = True
            self._busy_changed()
            loop.call_soon(self._pump, source)

    def _pump(self, source: str) -> None:
        if self._jobs and not self._safely(self._jobs.pop(0), source):
            self._jobs.clear()
        if self._jobs:
            # A pause between jobs, not a loop: the kernel passes a click through
            # several quick hops of the event loop, and they all fit in the pause,
            # so stop and reset are answered before the next job starts.
            asyncio.get_running_loop().call_later(JOB_PAUSE_S, self._pump, source)
        else:
            self._pumping = False
            self._busy_changed()

    def _stop(self) -> None:
        """Drop the queued jobs (a run stops after the step it is in)."""
        self._jobs.clear()

    def _busy_changed(self) -> None:
        """Hook: a view with a run button relabels it (read `self.busy`)."""
