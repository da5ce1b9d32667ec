"""The controls the views are built from: a sampling panel and layer / head sliders.

    controls = SamplingControls(method="top_p")
    controls.widget                 # the panel to show
    controls.params()               # {"method": "top_p", "temperature": 1.0, "top_p": 0.9}
    controls.observe(fn)            # fn() after any change

What is here: SamplingControls (method dropdown; temperature, top-k, top-p and
min-p sliders), LayerHeadControls (layer and head sliders sized to a model),
METHOD_LABELS (how a method is named on screen) and slider_style (labels
that are not cut short).

A control holds values, never a model: the views decide what a change means
(re-filter logits, regenerate, redraw). Only APIs present in both ipywidgets 7.7
and 8 are used. Left out: stop strings and repetition penalty (the engine has
them; a lecture rarely needs a slider for them), and the number of beams.
"""

from __future__ import annotations

from typing import Callable

import ipywidgets as widgets

from .sampling import METHODS

METHOD_LABELS = {"greedy": "greedy", "temperature": "temperature", "top_k": "top-k",
                 "top_p": "top-p", "min_p": "min-p", "beam": "beam search"}


def slider_style() -> dict:
    """Style for a labelled control: the label takes the room it needs."""
    return {"description_width": "initial"}


class SamplingControls:
    """A sampling-method dropdown and temperature / top-k / top-p / min-p sliders.

    Only the sliders the chosen method reads are enabled (labkit.distribution
    applies the filter the method names). top-p goes down to 0 on purpose: the
    engine rejects it, and the view shows why.
    """

    def __init__(self, method: str = "top_p", temperature: float = 1.0, top_k: int = 50,
                 top_p: float = 0.9, min_p: float = 0.05, beam: bool = False):
        methods = list(METHODS) + (["beam"] if beam else [])
        style = slider_style()
        self.method = widgets.Dropdown(options=[(METHOD_LABELS[m], m) for m in methods], value=method,
                                       description="method", style=style)
        self.temperature = widgets.FloatSlider(value=temperature, min=0.0, max=2.0, step=0.05,
                                               description="temperature", style=style)
        self.top_k = widgets.IntSlider(value=top_k, min=1, max=100, description="top-k", style=style)
        self.top_p = widgets.FloatSlider(value=top_p, min=0.0, max=1.0, step=0.01, description="top-p",
                                         style=style)
        self.min_p = widgets.FloatSlider(value=min_p, min=0.0, max=0.5, step=0.01, description="min-p",
                                         style=style)
        self.all = [self.method, self.temperature, self.top_k, self.top_p, self.min_p]
        self.widget = widgets.VBox([self.method, widgets.HBox([self.temperature, self.top_k]),
                                    widgets.HBox([self.top_p, self.min_p])])
        self.method.observe(lambda _: self._enable(), names="value")
        self._enable()

    def observe(self, fn: Callable[[], None]) -> None:
        """Call fn() whenever any control changes."""
        for w in self.all:
            w.observe(lambda _: fn(), names="value")

    def _enable(self) -> None:
        m = self.method.value
        self.temperature.disabled = m in ("greedy", "beam")
        self.top_k.disabled, self.top_p.disabled, self.min_p.disabled = m != "top_k", m != "top_p", m != "min_p"

    def params(self) -> dict:
        """Keyword arguments for labkit.distribution / sample (beam: greedy's)."""
        m = self.method.value
        p = {"method": "greedy" if m == "beam" else m, "temperature": self.temperature.value}
        if m == "top_k":
            p["top_k"] = self.top_k.value
        if m == "top_p":
            p["top_p"] = self.top_p.value
        if m == "min_p":
            p["min_p"] = self.min_p.value
        return p


class LayerHeadControls:
    """Layer and head sliders sized to the model."""

    def __init__(self, model, layer: int = 0, head: int = 0):
        c = model.config
        style = slider_style()
        self.layer = widgets.IntSlider(value=layer, min=0, max=c.n_layers - 1, description="layer", style=style)
        self.head = widgets.IntSlider(value=head, min=0, max=c.n_heads - 1, description="head", style=style)
        self.widget = widgets.HBox([self.layer, self.head])

    def observe(self, fn: Callable[[], None]) -> None:
        for w in (self.layer, self.head):
            w.observe(lambda _: fn(), names="value")
