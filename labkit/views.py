"""The live views of the notebooks: controls and charts that answer as you move them.

    view = labkit.views.SamplingExplorer(model, "The capital of France is")
    view                        # a cell ending in a view shows it

The views, in the order the notebooks meet them (each has `.widget`, the
ipywidgets box to show; `.figures()`, copies of its current charts; and
`.save_html(path)`, the charts as one offline page):

    TokenizerView(model)              type text, watch its tokens and ids
    PositionExplorer(model)           sinusoidal and RoPE positions: position / pair sliders
    AttentionExplorer(model, text)    one recorded forward pass; layer and head sliders
    SamplingExplorer(model, prompt)   next-token logits computed once; the sliders re-filter them
    LiveGeneration(model, prompt)     step / run / reset through generation, one token at a time
    PromptLengthExplorer(model, text) prefill the first N tokens: prefill time and KV cache size

Each is a labkit.jupyter.View: its charts are FigureBoxes (how they redraw under
JupyterLab, Voila and Colab, and why redraws wait a moment, is explained
there), its sliders and dropdowns come from labkit.controls, its figures from
labkit.charts. Every view takes `figure_mode` (None: for where the kernel runs).

Left out: step-by-step beam search (the engine runs beam search as a whole; see
LiveGeneration), and the lecture dashboard (dashboard.py, built on LiveGeneration).
"""

from __future__ import annotations

import html
import math
import time
from typing import Callable

import ipywidgets as widgets
import plotly.graph_objects as go
import torch

from . import charts
from .controls import METHOD_LABELS, LayerHeadControls, SamplingControls, slider_style
from .costs import bytes_per_value
from .encoding import encode, model_rope_angles, rope_angles, sinusoidal_positions, token_strings
from .generation import Decoder, generate, prefill
from .jupyter import MODEL_DELAY_S, View
from .sampling import SamplingParams, distribution, sample
from .timing import sync
from .trace import Trace

TOP_N = 20              # candidate tokens shown in a distribution chart


def _fixed_rows(fig: go.Figure, ref: go.Figure) -> go.Figure:
    """Give a token strip at least the height and row space of `ref` (a strip of
    the most tokens expected), so boxes keep their size and the page stays still."""
    lo, ref_lo = fig.layout.yaxis.range[0], ref.layout.yaxis.range[0]
    if lo > ref_lo:
        fig.update_yaxes(range=[ref_lo, fig.layout.yaxis.range[1]])
        fig.update_layout(height=ref.layout.height)
    return fig


# ----------------------------------------------------------------------------
# Stage 1: tokens and positions
# ----------------------------------------------------------------------------

class TokenizerView(View):
    """A text box; the token strip (with ids) and the id table follow as you type.

    Tokenizing is cheap, so this needs no model call beyond the tokenizer.
    """

    TABLE_ROWS = 16

    def __init__(self, model, text: str = "The capital of France is Paris.", chat: bool = False,
                 figure_mode: str | None = None):
        super().__init__(figure_mode=figure_mode)
        self.model = model
        self.text = widgets.Textarea(value=text, description="text", continuous_update=True,
                                     layout=widgets.Layout(width="90%"), style=slider_style())
        self.chat = widgets.Checkbox(value=chat, description="apply the chat template")
        self.info = widgets.HTML()
        # A strip of ~3 rows of tokens sets the smallest height, so a short text
        # does not make the chart shrink and the page jump while typing.
        self._strip_ref = charts.token_strip(["token"] * 30, [10000] * 30, show_ids=True)
        strip, table = self._figures()
        self.add_box("tokens", strip)
        # The table keeps the height of a TABLE_ROWS-token one, so the page does not
        # jump while typing; longer ones scroll inside it (its subtitle says so).
        self.add_box("table", table, height=charts.token_table(
            ["x"] * self.TABLE_ROWS, [0] * self.TABLE_ROWS, max_rows=self.TABLE_ROWS).layout.height)
        for w in (self.text, self.chat):
            w.observe(lambda _: self._redraw_later(self._redraw), names="value")
        self.widget = widgets.VBox([self.text, self.chat, self.info, self.error,
                                    self.boxes["tokens"].widget, self.boxes["table"].widget])

    def encoding(self) -> tuple[list[int], list[str]]:
        """(ids, tokens) of the text in the box."""
        if not self.text.value:
            return [], []
        enc = encode(self.model, self.text.value, chat=self.chat.value)
        return enc.ids.tolist(), enc.tokens

    def _figures(self) -> tuple[go.Figure, go.Figure]:
        ids, tokens = self.encoding()
        self.info.value = f"{len(self.text.value)} characters → <b>{len(ids)} tokens</b>"
        strip = _fixed_rows(charts.token_strip(tokens, ids, show_ids=True), self._strip_ref)
        return strip, charts.token_table(tokens, ids, max_rows=self.TABLE_ROWS)

    def _redraw(self) -> None:
        strip, table = self._figures()
        self.boxes["tokens"].update(strip)
        self.boxes["table"].update(table)


class PositionExplorer(View):
    """Sinusoidal positions and RoPE angles, with a position and a pair slider.

    Both schemes use the same form of frequency: pair i turns at
    ω_i = base^(-2i/d). The sinusoidal table (base 10,000, dimensions 2i and
    2i+1) writes sin(pω_i), cos(pω_i) into the vector; RoPE rotates a query/key
    pair by the angle pω_i. With a Llama-style model the RoPE angles are the
    model's own: its base (rope_theta, 100,000 for SmolLM2) and head size, and
    its pairs are dimensions (i, i + head_size/2). rope=False shows the
    sinusoidal table alone (notebook 02, before queries and keys exist).
    """

    def __init__(self, model=None, n_positions: int = 64, d_model: int = 64, position: int = 5, pair: int = 2,
                 rope: bool = True, figure_mode: str | None = None):
        super().__init__(figure_mode=figure_mode)
        self.rope = rope
        self.pe = sinusoidal_positions(n_positions, d_model)                  # (P, d)
        positions = torch.arange(n_positions)
        if model is not None and model.config.family == "llama":
            self.angles, self.source = model_rope_angles(model, positions), f"{model.name}'s RoPE"
        else:
            self.angles, self.source = rope_angles(positions, d_model), f"RoPE, head size {d_model}"
        style = slider_style()
        self.position = widgets.IntSlider(value=position, min=0, max=n_positions - 1, description="position",
                                          style=style)
        self.pair = widgets.IntSlider(value=pair, min=0, max=d_model // 2 - 1, description="frequency pair i",
                                      style=style)
        self.info = widgets.HTML()
        sin_fig, rope_fig = self._figures()
        self.add_box("sinusoidal", sin_fig)
        if rope:
            self.add_box("rope", rope_fig)
        for w in (self.position, self.pair):
            w.observe(lambda _: self._redraw_later(self._redraw), names="value")
        self.widget = widgets.VBox([widgets.HBox([self.position, self.pair]), self.info, self.error]
                                   + [box.widget for box in self.boxes.values()])

    def _figures(self) -> tuple[go.Figure, go.Figure]:
        p, i = self.position.value, self.pair.value
        d, n_pairs = self.pe.shape[1], self.angles.shape[1]
        sin_fig = charts.sinusoidal_heatmap(self.pe)
        # A box around the two numbers the sliders pick: row p, columns 2i and 2i+1.
        sin_fig.add_shape(type="rect", x0=2 * i - 0.5, x1=2 * i + 1.5, y0=p - 0.5, y1=p + 0.5,
                          line=dict(color="black", width=3))
        k = min(i, n_pairs - 1)
        pairs = sorted({0, k, n_pairs - 1})
        rope_fig = charts.rope_angles_chart(self.angles, wrap=True, pairs=pairs, title=f"{self.source}: rotation angle")
        angle = float(self.angles[p, k])
        rope_fig.add_vline(x=p, line=dict(color="black", dash="dot"))
        rope_fig.add_trace(go.Scatter(x=[p], y=[angle % (2 * math.pi)], mode="markers", name=f"pair {k} at {p}",
                                      marker=dict(color="black", size=14, symbol="x")))
        omega = float(1.0 / 10000 ** (2 * i / d))
        self.info.value = (
            f"position <b>{p}</b>, pair <b>{i}</b>: ω = 10000<sup>-2·{i}/{d}</sup> = {omega:.4g} rad/position; "
            f"sinusoidal PE[{p}, {2 * i}] = sin({p}ω) = {float(self.pe[p, 2 * i]):.3f}, "
            f"PE[{p}, {2 * i + 1}] = cos({p}ω) = {float(self.pe[p, 2 * i + 1]):.3f}")
        if self.rope:
            self.info.value += (
                f"; RoPE ({self.source}; Hugging Face's pairing: dims i and i + head size/2) turns pair {k} "
                f"by {angle:.3f} rad = {angle / (2 * math.pi):.3f} turns, "
                f"ω = {float(self.angles[1, k]) if self.angles.shape[0] > 1 else float('nan'):.4g} rad/position")
        return sin_fig, rope_fig

    def _redraw(self) -> None:
        sin_fig, rope_fig = self._figures()
        self.boxes["sinusoidal"].update(sin_fig)
        if self.rope:
            self.boxes["rope"].update(rope_fig)


# ----------------------------------------------------------------------------
# Stage 2: attention
# ----------------------------------------------------------------------------

class AttentionExplorer(View):
    """One recorded forward pass of `text`; layer / head sliders pick the pattern.

    The model runs once, at construction; the sliders only choose which of the
    recorded (heads, T, T) patterns to draw. `all_heads` adds a grid of every
    head of the chosen layer.
    """

    def __init__(self, model, text: str = "The capital of France is", layer: int = 0, head: int = 0,
                 all_heads: bool = True, chat: bool = False, figure_mode: str | None = None):
        super().__init__(figure_mode=figure_mode)
        self.model = model
        enc = encode(model, text, chat=chat)
        self.tokens = enc.tokens
        self.trace = Trace()
        model.forward(enc.ids, trace=self.trace)           # records every layer's (heads, T, T) pattern
        self.selectors = LayerHeadControls(model, layer, head)
        self.info = widgets.HTML()
        self._grid_layer = layer
        self.add_box("head", self._head_figure())
        if all_heads:
            self.add_box("layer", self._grid_figure())
        self.selectors.observe(lambda: self._redraw_later(self._redraw))
        self.widget = widgets.VBox([self.selectors.widget, self.info, self.error]
                                   + [b.widget for b in self.boxes.values()])

    def pattern(self) -> torch.Tensor:
        """The selected head's attention probabilities, (T, T)."""
        return self.trace.attentions[self.selectors.layer.value][self.selectors.head.value]

    def _head_figure(self) -> go.Figure:
        layer, head = self.selectors.layer.value, self.selectors.head.value
        c = self.model.config
        kv = head // c.group_size
        self.info.value = (f"layer {layer}, head {head}: reads KV head {kv}, shared by query heads "
                           f"{kv * c.group_size}–{(kv + 1) * c.group_size - 1}")
        return charts.attention_heatmap(self.pattern(), self.tokens, self.tokens, layer=layer, head=head)

    def _grid_figure(self) -> go.Figure:
        layer = self.selectors.layer.value
        return charts.attention_grid(self.trace.attentions[layer], self.tokens, layer=layer)

    def _redraw(self) -> None:
        self.boxes["head"].update(self._head_figure())
        if "layer" in self.boxes and self._grid_layer != self.selectors.layer.value:
            self._grid_layer = self.selectors.layer.value
            self.boxes["layer"].update(self._grid_figure())


# ----------------------------------------------------------------------------
# Stage 3: sampling
# ----------------------------------------------------------------------------

class SamplingExplorer(View):
    """The next-token distribution of one prompt, re-filtered as the sliders move.

    The model runs once, at construction. Moving a slider only re-filters those
    logits with labkit.distribution (no model call) and redraws the top
    `top_n` tokens; the kept mass is summed over the whole vocabulary.
    "sample" draws a token (seeded: the n-th draw uses seed + n) and marks it.
    """

    def __init__(self, model, prompt: str = "The capital of France is", method: str = "top_p",
                 top_n: int = TOP_N, seed: int = 0, chat: bool = False, figure_mode: str | None = None,
                 **control_values):
        super().__init__(figure_mode=figure_mode)
        self.model, self.seed, self.draws = model, seed, 0
        enc = encode(model, prompt, chat=chat)
        self.logits = model.forward(enc.ids)[-1].float()             # (vocab,): the one model call
        self.probs_before = self.logits.softmax(-1)
        top = self.probs_before.topk(top_n)
        self.top_ids, self.top_before = top.indices, top.values
        self.labels = token_strings(model.tokenizer, self.top_ids)
        self.chosen: int | None = None                               # token id of the last draw
        self.controls = SamplingControls(method=method, **control_values)
        self.sample_button = widgets.Button(description="sample", icon="random", tooltip="draw a token")
        self.summary = widgets.HTML()
        self.drawn = widgets.HTML()
        self.add_box("distribution", self._figure())
        self.controls.observe(self._controls_changed)
        self.sample_button.on_click(lambda _: self._safely(self.sample, "sampling"))
        prompt_html = widgets.HTML(f"prompt: <code>{html.escape(enc.text)}</code> → next token?")
        self.widget = widgets.VBox([prompt_html, self.controls.widget,
                                    widgets.HBox([self.sample_button, self.drawn]), self.summary, self.error,
                                    self.boxes["distribution"].widget])

    def distribution(self) -> torch.Tensor:
        """The filtered probabilities (vocab,) for the current controls."""
        return distribution(self.logits, **self.controls.params())

    def sample(self) -> int:
        """Draw a token from the current distribution, mark it, return its id."""
        token, probs = sample(self.logits, **self.controls.params(), seed=self.seed + self.draws)
        self.draws += 1
        self.chosen = token
        self._redraw()
        piece = token_strings(self.model.tokenizer, [token])[0]
        rank = int((self.probs_before > self.probs_before[token]).sum()) + 1
        self.drawn.value = (f"drew <b>{html.escape(charts.token_label(piece))}</b> (rank {rank}, "
                            f"probability {float(probs[token]):.3f} after the filters)")
        return token

    def _controls_changed(self) -> None:
        self.chosen = None          # a draw belongs to the distribution it came from
        self.drawn.value = ""
        self._redraw_later(self._redraw, "sampling")

    def _figure(self) -> go.Figure:
        params = self.controls.params()
        after = distribution(self.logits, **params)                   # raises ValueError on bad values
        kept = after > 0
        mass = float(self.probs_before[kept].sum())
        summary = (f"kept <b>{int(kept.sum()):,}</b> of {len(after):,} tokens, which held "
                   f"<b>{mass:.3f}</b> of the probability before filtering")
        t = params["temperature"]
        scaled = None
        if params["method"] != "greedy" and t not in (0, 1):
            # The filters see the logits after temperature, so top-p counts this mass, not the bars'.
            scaled_all = (self.logits.float() / t).softmax(-1)
            scaled = scaled_all[self.top_ids]
            summary += f" ({float(scaled_all[kept].sum()):.3f} after temperature {t:g}, the mass top-p counts; min-p compares each token with the most likely one)"
        self.summary.value = summary
        top = self.top_ids.tolist()
        chosen = top.index(self.chosen) if self.chosen in top else None
        return charts.distribution_chart(self.labels, self.top_before, after[self.top_ids], chosen=chosen,
                                      top_p=params.get("top_p"), probs_scaled=scaled,
                                      title=f"Next-token distribution: {METHOD_LABELS[params['method']]}")

    def _redraw(self) -> None:
        self.boxes["distribution"].update(self._figure())


# ----------------------------------------------------------------------------
# The loop: live generation
# ----------------------------------------------------------------------------

class LiveGeneration(View):
    """Generation one token at a time, every chart updated after each step.

    A labkit.generation.Decoder does the work (the loop labkit.generate
    runs): step() runs prefill the first time and one decode step after,
    samples with the current controls (they apply from the next step on),
    and redraws: the
    tokens so far coloured by the probability the model gave them (softmax at
    temperature 1, as Step.prob), the distribution the token was drawn from,
    the newest query's attention over every cached key (layer / head sliders),
    and the KV cache size. run(n) steps n times (to the end by default);
    reset() starts again. The run button steps one token per turn of the
    event loop, so stop and reset answer at once.

    Beam search keeps several sequences and the engine runs it as a whole, so
    it cannot be stepped: with "beam search" chosen, run() calls
    labkit.generate(method="beam") and shows its answer, and step() steps
    greedily (beam search with one beam).
    """

    def __init__(self, model, prompt: str = "The capital of France is", max_new_tokens: int = 24,
                 method: str = "greedy", seed: int = 0, top_n: int = TOP_N, num_beams: int = 4,
                 chat: bool = False, regenerate: bool = False, figure_mode: str | None = None,
                 on_redraw: Callable[[], None] | None = None, **control_values):
        super().__init__(figure_mode=figure_mode)
        self.on_redraw = on_redraw            # called after every redraw (the dashboard's readout)
        self.model, self.seed, self.top_n, self.num_beams = model, seed, top_n, num_beams
        self.regenerate = regenerate          # redo the tokens so far when a sampling control moves
        self.max_new_tokens = max_new_tokens
        enc = encode(model, prompt, chat=chat)
        self.prompt_encoding, self.prompt_text, self.prompt_ids, self.prompt_tokens = enc, enc.text, enc.ids, enc.tokens
        self.controls = SamplingControls(method=method, beam=True, **control_values)
        self.selectors = LayerHeadControls(model)
        self.step_button = widgets.Button(description="step", icon="step-forward", tooltip="generate one token")
        self.run_button = widgets.Button(description="run", icon="play", tooltip="generate to the end")
        self.reset_button = widgets.Button(description="reset", icon="undo", tooltip="start again")
        self.status = widgets.HTML()
        self._new_state()

        # Sizes of the fullest charts this view will show, so nothing jumps as they fill.
        n_keys = len(self.prompt_ids) + max_new_tokens
        self._strip_ref = charts.token_strip(["token"] * max_new_tokens, [0] * max_new_tokens,
                                          probs=[0.5] * max_new_tokens)
        row_ref = charts.attention_row([0.0] * n_keys, ["token"] * n_keys)
        dist_ref = charts.distribution_chart(["token"] * top_n, [0.0] * top_n, [0.0] * top_n)
        self.add_box("tokens", self._tokens_figure())
        self.add_box("distribution", self._distribution_figure(), width=dist_ref.layout.width)
        self.add_box("attention", self._attention_figure(), width=row_ref.layout.width)
        self.add_box("cache", self._cache_figure())
        self._status()

        self.step_button.on_click(lambda _: self._queue([self.step], "step"))
        self.run_button.on_click(lambda _: self._stop() if self.busy else self._queue(self._run_jobs(), "step"))
        self.reset_button.on_click(lambda _: (self._stop(), self._safely(self.reset, "step")))
        self.selectors.observe(lambda: self._redraw_later(self._redraw_attention, "attention"))
        self.controls.observe(self._controls_changed)
        self.widget = widgets.VBox([
            self.controls.widget, widgets.HBox([self.step_button, self.run_button, self.reset_button]),
            self.status, self.error, self.boxes["tokens"].widget, self.boxes["distribution"].widget,
            self.selectors.widget, self.boxes["attention"].widget, self.boxes["cache"].widget])

    # -- state ----------------------------------------------------------------

    def _new_state(self) -> None:
        # record=True: every Step keeps its query's attention row, for the attention chart.
        # Recording attends by hand, so the step times shown here are those of
        # that path, somewhat slower than generate's (SDPA, nothing recorded).
        self.decoder = Decoder(self.model, self.prompt_encoding, self.max_new_tokens,
                               SamplingParams(seed=self.seed), record=True)
        self.cache = self.decoder.cache
        # What the charts show, one entry per token (beam search fills them from its answer).
        self.token_ids: list[int] = []
        self.tokens: list[str] = []
        self.probs: list[float] = []          # the model's probability of each token
        self.seconds: list[float] = []        # each step's work: the prefill first, then decode steps
        self.cache_bytes: list[int] = []      # KV cache bytes after each step
        self.finish_reason = ""
        self._row = None                      # (layers, heads, keys): the last query's attention

    @property
    def finished(self) -> bool:
        return bool(self.finish_reason)

    @property
    def text(self) -> str:
        return self.model.tokenizer.decode(self.token_ids, skip_special_tokens=True)

    # -- the three actions ----------------------------------------------------

    def reset(self) -> None:
        """Forget the generated tokens and start from the prompt again."""
        self._new_state()
        self._redraw()

    def set_prompt(self, prompt: str, chat: bool = False, max_new_tokens: int | None = None) -> None:
        """Start again from a new prompt (a running generation stops first).
        chat: wrap it in the model's chat template; max_new_tokens: None keeps the current one."""
        enc = encode(self.model, prompt, chat=chat)
        if len(enc.ids) == 0:
            raise ValueError("the prompt is empty: type something to continue")
        self.prompt_encoding, self.prompt_text, self.prompt_ids, self.prompt_tokens = enc, enc.text, enc.ids, enc.tokens
        if max_new_tokens is not None:
            self.max_new_tokens = max_new_tokens
        self._stop()
        self.reset()

    def step(self) -> int | None:
        """Generate one token and redraw; returns its id (None once finished)."""
        if self.finished:
            return None
        # Made (and so checked) before the model runs: a bad value changes nothing. Beam: one greedy step.
        self.decoder.params = SamplingParams(**self.controls.params(), seed=self.seed)
        step = self.decoder.step()
        self.token_ids.append(step.token_id)
        self.tokens.append(token_strings(self.model.tokenizer, [step.token_id])[0])
        self.probs.append(step.prob)
        self.seconds.append(step.seconds)
        self.cache_bytes.append(step.cache_nbytes)
        self._row = step.attention
        self.finish_reason = self.decoder.finish_reason
        self._redraw()
        return step.token_id

    def run(self, n: int | None = None) -> list[int]:
        """Step n times (default: to the end; beam search: all at once). Returns the ids so far."""
        if self.controls.method.value == "beam":
            self._run_beam()
        else:
            for _ in range(self.max_new_tokens if n is None else n):
                if self.step() is None:
                    break
        return self.token_ids

    def _controls_changed(self) -> None:
        if not self._safely(lambda: SamplingParams(**self.controls.params()), "step"):
            return
        if self.regenerate and self.token_ids:
            # Same number of tokens again with the new settings. Debounced, and
            # a run still going is stopped first, so rapid slider moves only
            # ever regenerate for the latest value.
            n = len(self.token_ids)
            self._stop()
            self._redraw_later(lambda: self._regenerate(n), "step")

    def _regenerate(self, n: int) -> None:
        self.reset()
        if self.controls.method.value == "beam":
            self._queue([self._run_beam], "step")
        else:
            self._queue([self.step] * n, "step")

    def _run_jobs(self) -> list[Callable[[], object]]:
        if self.controls.method.value == "beam":
            return [self._run_beam]
        return [self.step] * (self.max_new_tokens - len(self.token_ids))

    def _run_beam(self) -> None:
        """Beam search as a whole; the tokens are scored by one forward pass over them."""
        self._new_state()
        gen = generate(self.model, self.prompt_ids, self.max_new_tokens, method="beam", num_beams=self.num_beams)
        ids = torch.cat([self.prompt_ids, torch.tensor(gen.token_ids, dtype=torch.long)])
        n = len(self.prompt_ids)
        before = self.model.forward(ids)[n - 1:-1].float().softmax(-1)     # (new tokens, vocab)
        self.token_ids = list(gen.token_ids)
        self.tokens = token_strings(self.model.tokenizer, self.token_ids)
        self.probs = [float(before[i, t]) for i, t in enumerate(self.token_ids)]
        self.seconds = [s.seconds for s in gen.steps]
        self.cache_bytes = [s.cache_nbytes for s in gen.steps]
        self.cache = gen.cache
        self.finish_reason = f"{gen.finish_reason} (beam search, {self.num_beams} beams)"
        self._redraw()

    def _busy_changed(self) -> None:
        self.run_button.description = "stop" if self.busy else "run"
        self.run_button.icon = "stop" if self.busy else "play"

    # -- drawing --------------------------------------------------------------

    def _tokens_figure(self) -> go.Figure:
        fig = charts.token_strip(self.tokens, self.token_ids, probs=self.probs,
                              title="Generated tokens (colour: the model's probability)")
        return _fixed_rows(fig, self._strip_ref)

    def _distribution_figure(self) -> go.Figure:
        logits, after = self.decoder.last_logits, self.decoder.last_probs      # (vocab,) each
        if logits is None:
            return charts.distribution_chart([], [], [], title="Next-token distribution (press step)")
        step, token = len(self.token_ids) - 1, self.token_ids[-1]
        before = logits.float().softmax(-1)                                   # the model's own, T = 1
        top = before.topk(self.top_n).indices.tolist()
        chosen = top.index(token) if token in top else None
        return charts.distribution_chart(token_strings(self.model.tokenizer, top), before[top], after[top],
                                         chosen=chosen, top_p=self.decoder.params.top_p,
                                         title=f"Step {step}: the distribution token {step} was drawn from")

    def _attention_figure(self) -> go.Figure:
        layer, head = self.selectors.layer.value, self.selectors.head.value
        if self._row is None:
            return charts.attention_row([], [], layer, head, title="Where the newest token looks (press step)")
        row = self._row[layer, head]
        keys = (self.prompt_tokens + self.tokens)[:len(row)]
        return charts.attention_row(row, keys, layer, head)

    def _cache_figure(self) -> go.Figure:
        return charts.kv_cache_chart(list(range(len(self.cache_bytes))), self.cache_bytes,
                                  allocated_bytes=self.cache.allocated_nbytes)

    def _status(self) -> None:
        gen = "".join(f'<span style="background:#FFF1C1">{html.escape(t)}</span>' for t in self.tokens)
        parts = [f"<code>{html.escape(self.prompt_text)}</code>{gen}"]
        if self.token_ids:
            k = len(self.token_ids) - 1
            phase = "prefill" if k == 0 else "decode"
            parts.append(f"step {k} ({phase}): <b>{html.escape(charts.token_label(self.tokens[-1]))}</b>, probability "
                         f"{self.probs[-1]:.3f}, {self.seconds[-1] * 1e3:.0f} ms; KV cache {self.cache.length} "
                         f"positions, {charts.format_bytes(self.cache_bytes[-1])} "
                         f"(+{charts.format_bytes(self.cache.bytes_per_token)} per token)")
        if self.finished:
            parts.append(f"finished: {html.escape(self.finish_reason)}")
        self.status.value = "<br>".join(parts)

    def _redraw_attention(self) -> None:
        self.boxes["attention"].update(self._attention_figure())

    def _redraw(self) -> None:
        self._status()
        self.boxes["tokens"].update(self._tokens_figure())
        self.boxes["distribution"].update(self._distribution_figure())
        self._redraw_attention()
        self.boxes["cache"].update(self._cache_figure())
        if self.on_redraw:
            self.on_redraw()


# ----------------------------------------------------------------------------
# Performance: prompt length
# ----------------------------------------------------------------------------

class PromptLengthExplorer(View):
    """Prefill the first N tokens of a long prompt: prefill time and KV cache size.

    The prefill is the largest part of the time to first token (TTFT adds the
    tokenization, and on a server the queueing; labkit.generation defines it).
    Each slider stop runs one prefill (timed once: the chart collects every
    length measured so far, so a noisy point shows up as an outlier, not as
    the whole curve). The slider sends its value only on release, and redraws
    are coalesced, so a busy model is never asked for stale lengths.
    sweep(lengths) measures several lengths in a row.
    """

    def __init__(self, model, text: str, length: int | None = None, chat: bool = False,
                 figure_mode: str | None = None):
        super().__init__(delay=MODEL_DELAY_S, figure_mode=figure_mode)
        self.model = model
        enc = encode(model, text, chat=chat)
        self.ids, self.tokens = enc.ids, enc.tokens
        n = len(self.ids)
        self.slider = widgets.IntSlider(value=n if length is None else length, min=1, max=n,
                                        continuous_update=False, description="prompt length (tokens)",
                                        style=slider_style(), layout=widgets.Layout(width="60%"))
        self.sweep_button = widgets.Button(description="sweep", icon="line-chart",
                                           tooltip="measure 8 lengths from 1 to all")
        self.info = widgets.HTML()
        self.prefill_s: dict[int, float] = {}     # length -> seconds of its latest prefill
        self.length = self.slider.value           # the length shown
        self.cache = None
        self.add_box("prefill", self._prefill_figure(), height=480)
        self.add_box("cache", self._cache_figure(), height=520)
        self.set_length(self.slider.value)
        self.slider.observe(lambda _: self._redraw_later(lambda: self.set_length(self.slider.value), "length"),
                            names="value")
        self.sweep_button.on_click(lambda _: self._stop() if self.busy else self._queue(
            [lambda n=n: self.set_length(n) for n in self._sweep_lengths()], "length"))
        self.widget = widgets.VBox([widgets.HBox([self.slider, self.sweep_button]), self.info, self.error,
                                    self.boxes["prefill"].widget, self.boxes["cache"].widget])

    def set_length(self, n: int) -> float:
        """Prefill the first n tokens (one model call), redraw; returns its time in seconds."""
        if not 1 <= n <= len(self.ids):
            raise ValueError(f"length must be in [1, {len(self.ids)}], got {n}")
        self.cache = self.model.new_cache(max_len=n)
        start = time.perf_counter()
        logits = prefill(self.model, self.ids[:n], self.cache)             # (vocab,)
        sync(self.model.device)            # on a GPU the prefill is queued, not yet finished
        self.prefill_s[n] = time.perf_counter() - start
        self.length = n
        nxt = token_strings(self.model.tokenizer, [int(logits.argmax())])[0]
        tail = "".join(self.tokens[max(0, n - 12):n])
        self.info.value = (f"first <b>{n}</b> tokens (…<code>{html.escape(tail)}</code>) → "
                           f"prefill <b>{self.prefill_s[n] * 1e3:.0f} ms</b>; KV cache {charts.format_bytes(self.cache.nbytes)} "
                           f"= {n} × {charts.format_bytes(self.cache.bytes_per_token)}; most likely next token "
                           f"<b>{html.escape(charts.token_label(nxt))}</b>")
        self.boxes["prefill"].update(self._prefill_figure())
        self.boxes["cache"].update(self._cache_figure())
        return self.prefill_s[n]

    @property
    def ttft(self) -> dict[int, float]:
        """The old name of prefill_s (it timed the prefill, not the whole TTFT)."""
        return self.prefill_s

    def sweep(self, lengths: list[int] | None = None) -> dict[int, float]:
        """Measure the prefill at several lengths (default: 8 from 1 to all); returns self.prefill_s."""
        for n in lengths or self._sweep_lengths():
            self.set_length(n)
        return self.prefill_s

    def _sweep_lengths(self) -> list[int]:
        n = len(self.ids)
        return sorted({max(1, round(n * k / 8)) for k in range(1, 9)})

    def _prefill_figure(self) -> go.Figure:
        return charts.prefill_points_chart(self.prefill_s, current=self.length, max_length=len(self.ids),
                                           device=str(self.model.device))

    def _cache_figure(self) -> go.Figure:
        c = self.model.config
        return charts.cache_size_comparison(c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim,
                                         self.length,
                                         bytes_per_value=bytes_per_value(self.model.dtype),
                                         title=f"KV cache after prefill: {self.model.name} uses {c.n_kv_heads} "
                                               f"KV heads")
