"""Plotly figure builders for the notebooks: data in, `go.Figure` out.

Every chart builder of labkit is here, and every one is pure: it takes numbers
(numpy arrays, torch tensors or lists), strings, or the result of a measurement
(a PrefillSweep, a BatchingResult, ...), and returns a figure. Nothing here loads
or runs a model, so a chart can be redrawn at once when a slider moves, and
each builder can be tested with made-up data.

What is here, in the order the data flows through a model, then the course:

    helpers      title_text (a title and its subtitle), fit_title (wrap a long
                 one), format_bytes, the palette (BLUE, ORANGE, GREEN, RED, GREY)

    tokens       token_label, token_strip, token_table
    embeddings   embedding_heatmap, cosine_similarity_heatmap
    positions    sinusoidal_heatmap, rope_angles_chart
    attention    attention_heatmap, attention_grid, attention_row, gqa_diagram
    logit lens   logit_lens_chart
    sampling     distribution_chart
    KV cache     kv_cache_chart, cache_size_comparison (and kv_cache_bytes, the formula)
    timing       timing_chart, cache_speedup_chart
    roofline     roofline_chart
    sweeps       prefill_chart (labkit.measure.prefill_sweep), prefill_points_chart (one length
                 at a time), batch_chart (batch_sweep)
    optimising   precision_chart (labkit.precision), tiles_chart (tiled attention),
                 rounds_chart (speculative decoding)
    batching     timeline_chart, summary_chart (labkit.batching.compare), load_chart (a load sweep)
    latency      itl_chart (the gaps between tokens, with mean and percentiles)
    theme/save   lecture_theme, save_html

Conventions:
- Token text is shown with its whitespace made visible (a leading space
  becomes '␣', a newline '↵'), because "Paris" and " Paris" are different
  tokens and the difference is the whole point of the tokens notebook.
- Token axes are numeric (0, 1, 2, ...) with the token text as tick labels.
  Plotly merges repeated category names, so a prompt with "the" twice would
  silently lose a row if tokens were used as categories.
- Sizes (pixels per cell, per row) follow the font size of the current default
  template, so the same call gives a larger figure after `lecture_theme()`.
- Bytes are shown in decimal units (kB, MB, GB = 10**3, 10**6, 10**9), the
  same as `KVCache`'s printout, so a chart and a printed number agree.

Importing this module registers two templates, "labkit" and "labkit_lecture",
and makes "labkit" the default if the default is still plotly's stock one.

Left out on purpose: interactive controls and live views (controls.py,
views.py, dashboard.py), anything that needs the model, 3-D plots, and static image export (that needs kaleido and a
browser; `save_html` gives an offline file instead).
"""

from __future__ import annotations

import functools
import html
import math
import re
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from plotly.colors import sample_colorscale
from plotly.subplots import make_subplots

from . import kv_cache
from .timing import median

if TYPE_CHECKING:   # names of the results some charts draw; never imported at run time
    from .batching import BatchingResult
    from .measure import BatchSweep, PrefillSweep
    from .precision import PrecisionResult
    from .speculative import SpeculativeGeneration

# Colours shared by several charts. Okabe-Ito, which stays distinguishable
# for colour-blind readers and on washed-out projectors.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]
BLUE, ORANGE, GREEN, RED = PALETTE[0], PALETTE[1], PALETTE[2], PALETTE[3]
GREY = "#C8C8C8"  # tokens cut by top-k / top-p
# Pastel fills for token boxes: neighbours always get different colours.
TOKEN_FILLS = ["#FDE2E4", "#CDE4F7", "#D8F3DC", "#FFF1C1", "#E2D9F3", "#FFD8BE", "#C9F2EF"]
PROB_COLORSCALE = "Blues"  # probabilities: light = unlikely, dark = likely
ATTENTION_COLORSCALE = "Blues"
DIVERGING_COLORSCALE = "RdBu_r"  # signed values: blue < 0 < red
MONOSPACE = "DejaVu Sans Mono, Menlo, Consolas, monospace"

MAX_TICKS = 48  # beyond this many tokens an axis labels every k-th token only
MB = 10**6  # chart axes are in MB; the engine prints MB too


# --------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------

def _to_numpy(x: Any) -> np.ndarray:
    """Numpy float array from a numpy array, a torch tensor or a (nested) list."""
    if hasattr(x, "detach"):  # a torch tensor; checked by duck type so torch stays optional
        return x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=float)


def token_label(token: str, max_chars: int | None = None) -> str:
    """Token text with whitespace made visible, ready to print in a chart.

    ' Paris' -> '␣Paris', '\\n' -> '↵', '\\t' -> '⇥'; other unprintable
    characters are written as escapes; '' -> '∅'. Long tokens are cut to
    `max_chars` with '…'. '<', '>' and '&' are escaped because plotly reads
    a little HTML in text, and would otherwise swallow tokens like '<|im_end|>'.
    """
    if token == "":
        return "∅"
    visible = []
    for ch in token:
        if ch == " ":
            visible.append("␣")
        elif ch == "\n":
            visible.append("↵")
        elif ch == "\t":
            visible.append("⇥")
        elif not ch.isprintable():
            visible.append(ascii(ch)[1:-1])  # e.g. '\x00'
        else:
            visible.append(ch)
    text = "".join(visible)
    if max_chars is not None and len(text) > max_chars:
        text = text[: max_chars - 1] + "…"
    return html.escape(text, quote=False)


def _labels(tokens: Sequence[str], max_chars: int | None = 12) -> list[str]:
    return [token_label(str(t), max_chars) for t in tokens]


def _font_size() -> float:
    """Font size of the current default template (what new figures will use)."""
    try:
        size = pio.templates[pio.templates.default].layout.font.size
    except (KeyError, ValueError, AttributeError):
        size = None
    return float(size) if size else 12.0


def _token_axis(labels: Sequence[str], max_ticks: int = MAX_TICKS, rotate: bool = True) -> dict:
    """Axis settings that put token text at positions 0..n-1.

    With more than `max_ticks` tokens only every k-th one is labelled: the
    others would overlap into an unreadable smear. Hover still names every cell.
    Labels are slanted (`rotate`) unless they are few and short.
    """
    n = len(labels)
    step = max(1, math.ceil(n / max_ticks))
    idx = list(range(0, n, step))
    short = n <= 8 and max(map(len, labels), default=0) <= 6
    return dict(tickmode="array", tickvals=idx, ticktext=[labels[i] for i in idx],
                showgrid=False, zeroline=False, tickangle=0 if short or not rotate else -60)


def _pairs(rows: Sequence[str], cols: Sequence[str]) -> np.ndarray:
    """customdata[i, j] = (rows[i], cols[j]) for a heatmap's hover text.

    Built as a numpy array because plotly checks a nested list element by
    element, which takes seconds for a few hundred tokens.
    """
    r = np.array([token_label(t) for t in rows], dtype=object)
    c = np.array([token_label(t) for t in cols], dtype=object)
    return np.stack(np.broadcast_arrays(r[:, None], c[None, :]), axis=-1)


def _check_len(name: str, seq: Sequence, n: int) -> None:
    if len(seq) != n:
        raise ValueError(f"{name} has {len(seq)} entries but the data has {n}")


def title_text(main: str, sub: str | None = None) -> str:
    """A title with an optional smaller second line (works on every plotly version)."""
    return main if not sub else f"{main}<br><sup>{sub}</sup>"


def fit_title(fig: go.Figure) -> go.Figure:
    """Wrap a title (and its subtitle) that is wider than the figure onto more
    lines, and make room for them, instead of letting the browser cut it off.
    Every chart builder here applies it; charts built elsewhere can too."""
    text = fig.layout.title.text
    if not text:
        return fig
    try:
        title_px = float(pio.templates[pio.templates.default].layout.title.font.size or 0)
    except (KeyError, ValueError, AttributeError):
        title_px = 0.0
    title_px = title_px or _font_size() * 1.4
    width = fig.layout.width or 700
    # An average character of a proportional font is about half an em wide.
    chars = max(16, int((width - 60) / (0.55 * title_px)))
    lines = []
    for i, part in enumerate(text.split("<br>")):
        sup = part.startswith("<sup>") and part.endswith("</sup>")
        inner = part[5:-6] if sup else part
        limit = int(chars / 0.7) if sup or i > 0 else chars          # a subtitle's font is smaller
        if len(re.sub(r"<[^>]+>", "", inner)) <= limit or "<" in inner:   # never split inside a tag
            lines.append(part)
            continue
        wrapped = textwrap.wrap(inner, limit, break_on_hyphens=False)
        lines += [f"<sup>{w}</sup>" for w in wrapped] if sup else wrapped
    extra = len(lines) - len(text.split("<br>"))
    if extra:
        grow = int(extra * title_px * 1.2)
        top = fig.layout.margin.t
        top = 100 if top is None else top                                # plotly's default top margin
        fig.update_layout(title_text="<br>".join(lines), margin_t=top + grow)
        if fig.layout.height:
            fig.update_layout(height=fig.layout.height + grow)
    return fig


def _fits_title(builder):
    """Decorator: the figure `builder` returns gets `fit_title`."""
    @functools.wraps(builder)
    def build(*args, **kwargs):
        return fit_title(builder(*args, **kwargs))
    return build


def format_bytes(n: float) -> str:
    """1234567 -> '1.23 MB': decimal units (kB, MB, GB), as every chart and readout here uses."""
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def _si(x: float) -> str:
    """1.5e12 -> '1.5 T': decimal SI prefixes, as FLOP/s and bandwidth are quoted."""
    for prefix, size in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= size:
            return f"{x / size:.3g} {prefix}"
    return f"{x:.3g} "


def _size(width: float, height: float) -> dict:
    """A figure size given for the normal 14 px font, grown in step with the current font."""
    k = _font_size() / 14
    return dict(width=int(min(width * k, 1600)), height=int(min(height * k, 1200)))


def _heatmap_size(n_rows: int, n_cols: int) -> dict:
    """Width and height so cells are big enough to read, within a screen."""
    fs = _font_size()
    cell, k = fs * 1.8, fs / 14  # k: room for labels grows with the font
    return dict(
        width=int(min(max(n_cols * cell, 240 * k) + 220 * k, 1400)),
        height=int(min(max(n_rows * cell, 200 * k) + 200 * k, 1200)),
    )


def _step_axis(fig: go.Figure, steps: Sequence[float] | np.ndarray) -> None:
    """Whole-number ticks on an x axis of step numbers: with few steps plotly
    would otherwise label 0.2, 0.4, ... (there is no step 0.2)."""
    steps = np.asarray(steps, dtype=float)
    span = float(steps.max() - steps.min()) if steps.size else 0.0
    if span <= 10:
        fig.update_xaxes(tick0=0, dtick=1)
    else:
        fig.update_xaxes(tickformat="d")


# --------------------------------------------------------------------------
# Stage 1a: tokens
# --------------------------------------------------------------------------

def _probability_key() -> str:
    """A colour key for the subtitle of a strip coloured by probability. (A colour
    bar needs more height than a one-row strip has; a subtitle always fits.)"""
    swatches = " ".join(f'<span style="color:{c}">■</span> {v:g}'
                        for v, c in zip((0.1, 0.5, 0.9), sample_colorscale(PROB_COLORSCALE, [0.1, 0.5, 0.9])))
    return f"; colour = probability: {swatches}"


@_fits_title
def token_strip(
    tokens: Sequence[str],
    ids: Sequence[int] | Any,
    probs: Sequence[float] | Any | None = None,
    title: str = "Tokens",
    chars_per_row: int = 60,
    show_ids: bool = False,
) -> go.Figure:
    """The text as a strip of coloured boxes, one per token, wrapped into rows.

    Without `probs` neighbouring tokens get different pastel colours, so the
    token boundaries stand out. With `probs` (e.g. the probability the model
    gave each generated token) the boxes are coloured by probability and a
    colour key is added to the subtitle. Hover shows position, id and probability.
    """
    ids = [int(i) for i in _to_numpy(ids).reshape(-1)]
    n = len(tokens)
    _check_len("ids", ids, n)
    p = None if probs is None else _to_numpy(probs).reshape(-1)
    if p is not None:
        _check_len("probs", p, n)
    labels = _labels(tokens, max_chars=chars_per_row - 2)
    fs = _font_size()

    # Lay the boxes out like text: width = characters + 1, wrap at the row end.
    row_h = 1.0 if not show_ids else 1.6
    shapes, cx, cy = [], [], []
    x = row = 0
    for label, token_id in zip(labels, ids):
        chars = len(html.unescape(label))
        width = (max(chars, len(str(token_id))) if show_ids else chars) + 1
        if x > 0 and x + width > chars_per_row:
            x, row = 0, row + 1
        y0 = -row * (row_h + 0.3)
        cx.append(x + width / 2)
        cy.append(y0 - row_h / 2)
        shapes.append((x, y0 - row_h, x + width - 0.2, y0))
        x += width
    n_rows = row + 1

    if p is None:
        fills = [TOKEN_FILLS[i % len(TOKEN_FILLS)] for i in range(n)]
        text_colours = ["#111111"] * n
    else:
        fills = sample_colorscale(PROB_COLORSCALE, list(np.clip(p, 0, 1)))
        text_colours = ["white" if v > 0.55 else "#111111" for v in p]

    # All boxes in one update: add_shape one at a time is quadratic in plotly.
    fig = go.Figure(layout=dict(shapes=[
        dict(type="rect", x0=x0, y0=y0, x1=x1, y1=y1, fillcolor=fill, line=dict(color="#555555", width=1),
             layer="below")
        for (x0, y0, x1, y1), fill in zip(shapes, fills)]))

    hover = [f"position {i}<br>id {ids[i]}<br>text {token_label(t)}" for i, t in enumerate(tokens)]
    if p is not None:
        hover = [h + f"<br>probability {v:.3f}" for h, v in zip(hover, p)]
    text_y = cy if not show_ids else [y + 0.25 for y in cy]
    marker = dict(size=1, opacity=0)
    fig.add_trace(go.Scatter(
        x=cx, y=text_y, mode="markers+text", text=labels, customdata=ids,
        textfont=dict(family=MONOSPACE, color=text_colours),
        marker=marker, hovertext=hover, hoverinfo="text", showlegend=False, name="tokens",
    ))
    if show_ids:
        fig.add_trace(go.Scatter(
            x=cx, y=[y - 0.35 for y in cy], mode="text", text=[str(i) for i in ids],
            textfont=dict(family=MONOSPACE, size=round(fs * 0.7), color=text_colours),
            hoverinfo="skip", showlegend=False, name="ids",
        ))

    px_per_char = fs * 0.68  # a monospace character is about 0.6 em wide, plus room
    row_px = fs * 2.2 * row_h
    fig.update_xaxes(visible=False, range=[-0.2, chars_per_row + 0.2], fixedrange=True)
    fig.update_yaxes(visible=False, range=[-n_rows * (row_h + 0.3) + 0.1, 0.2], fixedrange=True)
    fig.update_layout(
        title=title_text(title, f"{n} tokens" + (_probability_key() if p is not None else "")),
        width=int(chars_per_row * px_per_char + 60),
        height=int(n_rows * row_px * 1.3 + fs * 6),
        margin=dict(l=20, r=20, t=int(fs * 5), b=20),
        plot_bgcolor="white",
    )
    return fig


@_fits_title
def token_table(tokens: Sequence[str], ids: Sequence[int] | Any, max_rows: int = 24) -> go.Figure:
    """A two-column table: Token ID | Token Text (whitespace made visible).

    The figure is tall enough for every row up to `max_rows`; a longer table
    scrolls inside the figure, and its subtitle says so."""
    ids = [int(i) for i in _to_numpy(ids).reshape(-1)]
    _check_len("ids", ids, len(tokens))
    fs = _font_size()
    # Rows of CJK text or byte tokens render taller than Latin ones (the
    # fallback font's line height), so each row gets 2 font sizes, not 1.8.
    row_px, header_px = fs * 2.0, fs * 2.0
    fig = go.Figure(go.Table(
        columnwidth=[1, 3],
        header=dict(values=["<b>Token ID</b>", "<b>Token Text</b>"], align="left",
                    fill_color="#DDE7F0", height=header_px),
        cells=dict(values=[ids, _labels(tokens, max_chars=None)], align="left",
                   font=dict(family=MONOSPACE), height=row_px),
    ))
    shown = min(len(ids), max_rows)
    sub = f"{len(ids)} tokens" + (f" (the first {shown} shown: scroll the table for the rest)"
                                  if len(ids) > shown else "")
    top, bottom = int(fs * 5), 10
    fig.update_layout(
        title=title_text("Tokens and their ids", sub),
        height=int(top + header_px + (shown + 0.5) * (row_px + 2) + bottom),
        width=int(fs * 30),
        margin=dict(l=20, r=20, t=top, b=bottom),
    )
    return fig


# --------------------------------------------------------------------------
# Stage 1b: embeddings
# --------------------------------------------------------------------------

@_fits_title
def embedding_heatmap(vectors: Any, tokens: Sequence[str], max_dims: int = 64,
                      title: str = "Token embeddings") -> go.Figure:
    """Rows = tokens, columns = the first `max_dims` embedding dimensions.

    Colours are symmetric around 0 (blue negative, red positive), so a
    dimension that is large for one token and small for another stands out.
    """
    v = _to_numpy(vectors)
    if v.ndim != 2:
        raise ValueError(f"vectors must be [tokens, dims], got shape {v.shape}")
    n, d = v.shape
    _check_len("tokens", tokens, n)
    shown = v[:, :max_dims]
    limit = (float(np.abs(shown).max()) if shown.size else 0.0) or 1.0
    labels = _labels(tokens)
    row_names = np.array([token_label(t) for t in tokens], dtype=object)
    fig = go.Figure(go.Heatmap(
        z=shown, x=list(range(shown.shape[1])), y=list(range(n)),
        colorscale=DIVERGING_COLORSCALE, zmid=0, zmin=-limit, zmax=limit,
        customdata=np.repeat(row_names[:, None], shown.shape[1], axis=1),
        hovertemplate="token %{customdata}<br>dim %{x}<br>value %{z:.4f}<extra></extra>",
        colorbar=dict(title=dict(text="value")),
    ))
    fig.update_yaxes(title="token", autorange="reversed", **_token_axis(labels, rotate=False))
    fig.update_xaxes(title="embedding dimension", showgrid=False)
    sub = f"first {shown.shape[1]} of {d} dimensions" if d > shown.shape[1] else f"all {d} dimensions"
    cell = _font_size() * 1.6
    fig.update_layout(title=title_text(title, sub),
                      width=int(min(max(shown.shape[1] * cell * 0.6, 500) + 260, 1400)),
                      height=int(min(max(n * cell, 200) + 200, 1200)))
    return fig


@_fits_title
def cosine_similarity_heatmap(vectors: Any, tokens: Sequence[str],
                              title: str = "Cosine similarity between token vectors") -> go.Figure:
    """T x T heatmap of cos(angle) between every pair of token vectors.

    The colour scale is fixed to [-1, 1] so two charts can be compared.
    """
    v = _to_numpy(vectors)
    if v.ndim != 2:
        raise ValueError(f"vectors must be [tokens, dims], got shape {v.shape}")
    n = v.shape[0]
    _check_len("tokens", tokens, n)
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    unit = v / np.where(norms == 0, 1.0, norms)  # a zero vector gets similarity 0, not NaN
    sim = np.clip(unit @ unit.T, -1.0, 1.0)
    labels = _labels(tokens)
    fig = go.Figure(go.Heatmap(
        z=sim, x=list(range(n)), y=list(range(n)),
        colorscale=DIVERGING_COLORSCALE, zmin=-1, zmax=1, zmid=0,
        texttemplate="%{z:.2f}" if n <= 12 else None,
        customdata=_pairs(tokens, tokens),
        hovertemplate="%{customdata[0]} vs %{customdata[1]}<br>cosine %{z:.3f}<extra></extra>",
        colorbar=dict(title=dict(text="cosine")),
    ))
    fig.update_xaxes(title="token", **_token_axis(labels))
    fig.update_yaxes(title="token", autorange="reversed", scaleanchor="x",
                     **_token_axis(labels, rotate=False))
    fig.update_layout(title=title, **_heatmap_size(n, n))
    return fig


# --------------------------------------------------------------------------
# Stage 1c: positions
# --------------------------------------------------------------------------

@_fits_title
def sinusoidal_heatmap(pe: Any, title: str = "Sinusoidal positional encoding") -> go.Figure:
    """Position x dimension heatmap of a sinusoidal encoding table [P, d].

    Left columns change fast with position (high frequency), right columns
    slowly, which is what lets the model tell near and far positions apart.
    """
    z = _to_numpy(pe)
    if z.ndim != 2:
        raise ValueError(f"pe must be [positions, dims], got shape {z.shape}")
    p, d = z.shape
    fig = go.Figure(go.Heatmap(
        z=z, x=list(range(d)), y=list(range(p)), colorscale=DIVERGING_COLORSCALE,
        zmin=-1, zmax=1, zmid=0, colorbar=dict(title=dict(text="value")),
        hovertemplate="position %{y}<br>dim %{x}<br>value %{z:.3f}<extra></extra>",
    ))
    fig.update_xaxes(title="dimension", showgrid=False)
    fig.update_yaxes(title="position", autorange="reversed", showgrid=False)
    fig.update_layout(title=title_text(title, f"{p} positions x {d} dimensions"),
                      **_size(900, min(max(p * 6, 300) + 200, 900)))
    return fig


@_fits_title
def rope_angles_chart(angles: Any, wrap: bool = False, max_lines: int = 8,
                      pairs: Sequence[int] | None = None,
                      title: str = "RoPE: rotation angle of each dimension pair") -> go.Figure:
    """Rotation angle (radians) against position, one line per frequency pair.

    `angles[p, i]` is the angle RoPE rotates pair i by at position p. With
    many pairs only about `max_lines` evenly spaced ones are drawn (or the
    ones listed in `pairs`). `wrap=True` shows the angle mod 2π, i.e. where
    the pair actually points: fast pairs spin round, slow pairs barely move.
    """
    a = _to_numpy(angles)
    if a.ndim != 2:
        raise ValueError(f"angles must be [positions, pairs], got shape {a.shape}")
    n_pos, n_pairs = a.shape
    if pairs is None:
        step = max(1, math.ceil(n_pairs / max_lines))
        pairs = list(range(0, n_pairs, step))
    positions = np.arange(n_pos)
    fig = go.Figure()
    for k, i in enumerate(pairs):
        x, y = positions.astype(float), a[:, i]
        if wrap:
            y = np.mod(y, 2 * math.pi)
            # Break the line where the angle passes 2π and restarts at 0, instead
            # of drawing a vertical drop that looks like part of the curve.
            jumps = np.nonzero(np.diff(y) < 0)[0] + 1
            x, y = np.insert(x, jumps, np.nan), np.insert(y, jumps, np.nan)
        # The angle grows linearly, so its slope is the pair's frequency.
        freq = a[1, i] - a[0, i] if n_pos > 1 else float("nan")
        fig.add_trace(go.Scatter(
            x=x, y=y, mode="lines", connectgaps=False, name=f"pair {i} (ω={freq:.3g})",
            line=dict(color=PALETTE[k % len(PALETTE)]),
            hovertemplate=f"pair {i}<br>position %{{x}}<br>angle %{{y:.3f}} rad<extra></extra>",
        ))
    fig.update_xaxes(title="position")
    if wrap:
        fig.update_yaxes(title="angle mod 2π (radians)", range=[0, 2 * math.pi],
                         tickvals=[0, math.pi / 2, math.pi, 3 * math.pi / 2, 2 * math.pi],
                         ticktext=["0", "π/2", "π", "3π/2", "2π"])
    else:
        fig.update_yaxes(title="angle (radians)")
    shown = f"{len(pairs)} of {n_pairs} pairs shown" + (", wrapped mod 2π" if wrap else "")
    fig.update_layout(title=title_text(title, shown), legend=dict(title=dict(text="pair (ω rad/position)")),
                      **_size(900, 520))
    return fig


# --------------------------------------------------------------------------
# Stage 2: attention
# --------------------------------------------------------------------------

def _where(layer: int | None, head: int | None) -> str:
    """'layer 3, head 5', or the part that is known."""
    parts = [f"layer {layer}" if layer is not None else "", f"head {head}" if head is not None else ""]
    return ", ".join(p for p in parts if p)


def _attention_trace(z: np.ndarray, q_tokens: Sequence[str], k_tokens: Sequence[str], **kw) -> go.Heatmap:
    tq, tk = z.shape
    return go.Heatmap(
        z=z, x=list(range(tk)), y=list(range(tq)), customdata=_pairs(q_tokens, k_tokens),
        hovertemplate="query %{customdata[0]} → key %{customdata[1]}<br>weight %{z:.3f}<extra></extra>",
        **kw,
    )


@_fits_title
def attention_heatmap(pattern: Any, q_tokens: Sequence[str], k_tokens: Sequence[str],
                      layer: int | None = None, head: int | None = None,
                      title: str = "Attention pattern") -> go.Figure:
    """Query x key heatmap of one head's attention weights (rows sum to 1).

    Row i shows how token i spreads its attention over the keys; with a
    causal mask the upper-right triangle is 0. Query 0 is at the top.
    """
    z = _to_numpy(pattern)
    if z.ndim != 2:
        raise ValueError(f"pattern must be [queries, keys], got shape {z.shape}")
    tq, tk = z.shape
    _check_len("q_tokens", q_tokens, tq)
    _check_len("k_tokens", k_tokens, tk)
    fig = go.Figure(_attention_trace(z, q_tokens, k_tokens, colorscale=ATTENTION_COLORSCALE,
                                     zmin=0, zmax=1, colorbar=dict(title=dict(text="weight"))))
    fig.update_xaxes(title="key (token attended to)", **_token_axis(_labels(k_tokens)))
    # autorange="reversed" puts query 0 on top, like a matrix is written.
    fig.update_yaxes(title="query (token attending)", autorange="reversed",
                     **_token_axis(_labels(q_tokens), rotate=False))
    fig.update_layout(title=title_text(title, _where(layer, head) or None), **_heatmap_size(tq, tk))
    return fig


@_fits_title
def attention_grid(patterns: Any, tokens: Sequence[str], layer: int | None = None,
                   q_tokens: Sequence[str] | None = None, cols: int | None = None,
                   title: str = "Attention patterns of every head") -> go.Figure:
    """All heads of one layer side by side, one small heatmap per head.

    `patterns` is [heads, queries, keys]. `tokens` label the keys; the
    queries are the last `queries` of them unless `q_tokens` is given (during
    cached decoding there is one query, the newest token).
    """
    z = _to_numpy(patterns)
    if z.ndim != 3:
        raise ValueError(f"patterns must be [heads, queries, keys], got shape {z.shape}")
    h, tq, tk = z.shape
    _check_len("tokens", tokens, tk)
    q_tokens = list(tokens[tk - tq:]) if q_tokens is None else q_tokens
    _check_len("q_tokens", q_tokens, tq)
    cols = cols or min(h, 3 if h <= 9 else 4)
    rows = math.ceil(h / cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[f"head {i}" for i in range(h)],
                        horizontal_spacing=0.04, vertical_spacing=0.08 if rows > 1 else 0.0)
    q_axis = _token_axis(_labels(q_tokens), max_ticks=24, rotate=False)
    k_axis = _token_axis(_labels(tokens), max_ticks=24)
    for i in range(h):
        r, c = i // cols + 1, i % cols + 1
        fig.add_trace(_attention_trace(z[i], q_tokens, tokens, coloraxis="coloraxis", name=f"head {i}"),
                      row=r, col=c)
        # Label only the outer edge of the grid: inner labels would just repeat.
        fig.update_xaxes(**k_axis, showticklabels=(i + cols >= h), row=r, col=c)
        fig.update_yaxes(**q_axis, autorange="reversed", showticklabels=(c == 1), row=r, col=c)
    fs = _font_size()
    panel = max(min(tk, 24) * fs * 0.9, 170)
    fig.update_layout(
        title=title_text(title, f"layer {layer}, {h} heads" if layer is not None else f"{h} heads"),
        coloraxis=dict(colorscale=ATTENTION_COLORSCALE, cmin=0, cmax=1, colorbar=dict(title=dict(text="weight"))),
        width=int(min(cols * panel + 300, 1500)), height=int(min(rows * panel + 260, 1600)),
        margin=dict(t=int(fs * 7)),
    )
    # make_subplots writes the panel titles as annotations with a fixed 16 px font.
    fig.update_annotations(font_size=fs)
    return fig


@_fits_title
def attention_row(row: Any, k_tokens: Sequence[str], layer: int | None = None,
                  head: int | None = None, title: str = "Where the newest token looks") -> go.Figure:
    """Bar chart of the newest token's attention over every cached key.

    During decoding the query is one token and the keys are everything in
    the KV cache, so this chart gains one bar per generated token.
    """
    w = _to_numpy(row).reshape(-1)
    n = len(w)
    _check_len("k_tokens", k_tokens, n)
    labels = _labels(k_tokens)
    top = int(np.argmax(w)) if n else -1
    colours = [ORANGE if i == top else BLUE for i in range(n)]
    fig = go.Figure(go.Bar(
        x=list(range(n)), y=w, marker_color=colours,
        customdata=[token_label(t) for t in k_tokens],
        hovertemplate="key %{x}: %{customdata}<br>weight %{y:.3f}<extra></extra>",
        name="attention weight",
    ))
    fig.update_xaxes(title="key position (cached token)", **_token_axis(labels))
    fig.update_yaxes(title="attention weight", range=[0, 1.05])
    where = _where(layer, head)
    newest = token_label(k_tokens[-1]) if n else ""
    sub = f"query {newest}, {n} keys" + (f", {where}" if where else "")
    fs = _font_size()
    fig.update_layout(title=title_text(title, sub), width=int(min(max(n * fs * 1.8, 500) + 160, 1400)),
                      height=_size(0, 480)["height"], bargap=0.15)
    return fig


@_fits_title
def gqa_diagram(n_heads: int, n_kv_heads: int, head_dim: int | None = None,
                title: str | None = None) -> go.Figure:
    """Which query heads share which key/value head (grouped-query attention).

    Query heads are a row of boxes on top, KV heads a row below; a line joins
    each query head to the KV head it reads. n_kv_heads == n_heads is plain
    multi-head attention (MHA), n_kv_heads == 1 is multi-query (MQA, Shazeer
    2019); in between is grouped-query (GQA, Ainslie et al. 2023).
    """
    if n_heads <= 0 or n_kv_heads <= 0 or n_heads % n_kv_heads:
        raise ValueError(f"n_heads ({n_heads}) must be a positive multiple of n_kv_heads ({n_kv_heads})")
    group = n_heads // n_kv_heads
    kind = "MHA" if group == 1 else ("MQA" if n_kv_heads == 1 else "GQA")
    fig = go.Figure()
    y_q, y_kv, half = 1.0, 0.0, 0.12  # row heights and half a box height
    colours = [PALETTE[j % 7] for j in range(n_kv_heads)]  # PALETTE[7] is black: text would vanish
    # KV head j sits under the middle of its group, so the lines fan out evenly.
    kv_x = [j * group + (group - 1) / 2 for j in range(n_kv_heads)]
    kv_w = max(0.8, group * 0.45)
    boxes = []
    for j in range(n_kv_heads):
        members = range(j * group, (j + 1) * group)
        xs, ys = [], []
        for q in members:
            xs += [q, kv_x[j], None]
            ys += [y_q - half, y_kv + half, None]
            boxes.append(dict(type="rect", x0=q - 0.4, x1=q + 0.4, y0=y_q - half, y1=y_q + half, layer="below",
                              fillcolor=colours[j], opacity=0.4, line=dict(color=colours[j])))
        # One lines trace per KV head; its x values (every third) are the query heads it serves.
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color=colours[j]), name=f"KV head {j}",
                                 hoverinfo="skip", showlegend=False))
        boxes.append(dict(type="rect", x0=kv_x[j] - kv_w / 2, x1=kv_x[j] + kv_w / 2, y0=y_kv - half,
                          y1=y_kv + half, layer="below", fillcolor=colours[j], opacity=0.8,
                          line=dict(color=colours[j])))
    fig.update_layout(shapes=boxes)  # in one go: add_shape one at a time is quadratic
    # Box labels; with many heads write only the numbers, the row names say what they are.
    q_text = [str(q) for q in range(n_heads)] if n_heads > 12 else [f"Q{q}" for q in range(n_heads)]
    kv_text = [str(j) for j in range(n_kv_heads)] if n_kv_heads > 12 else [f"KV{j}" for j in range(n_kv_heads)]
    fig.add_trace(go.Scatter(
        x=list(range(n_heads)), y=[y_q] * n_heads, mode="text", text=q_text, showlegend=False, name="query heads",
        hovertext=[f"query head {q} reads KV head {q // group}" for q in range(n_heads)], hoverinfo="text"))
    fig.add_trace(go.Scatter(
        x=kv_x, y=[y_kv] * n_kv_heads, mode="text", text=kv_text, showlegend=False, name="kv heads",
        hovertext=[f"KV head {j}: shared by query heads {j * group}–{(j + 1) * group - 1}" for j in range(n_kv_heads)],
        hoverinfo="text"))
    if group > 1:  # under each KV box: the query heads that share it
        fig.add_trace(go.Scatter(
            x=kv_x, y=[y_kv - 0.3] * n_kv_heads, mode="text", showlegend=False, hoverinfo="skip", name="groups",
            text=[f"Q{j * group}–Q{(j + 1) * group - 1}" for j in range(n_kv_heads)]))
    dim = f", head size {head_dim}" if head_dim else ""
    fig.update_xaxes(visible=False, range=[-0.8, n_heads - 0.2], fixedrange=True)
    fig.update_yaxes(range=[-0.5, 1.3], fixedrange=True, tickvals=[y_kv, y_q], showline=False,
                     ticktext=[f"{n_kv_heads} KV heads", f"{n_heads} query heads"], showgrid=False, zeroline=False)
    sub = f"group size {group}: each K/V head is shared by {group} query head{'s' if group > 1 else ''}{dim}"
    fs = _font_size()
    fig.update_layout(title=title_text(title or f"{kind}: {n_heads} query heads → {n_kv_heads} KV heads", sub),
                      width=int(min(max(n_heads * fs * 3.2, 600), 860)) + 200, height=int(fs * 20),
                      plot_bgcolor="white")
    return fig


# --------------------------------------------------------------------------
# Stage 2b: logit lens
# --------------------------------------------------------------------------

@_fits_title
def logit_lens_chart(top_tokens: Sequence[Sequence[str]], top_probs: Any, input_tokens: Sequence[str],
                     layer_labels: Sequence[str] | None = None,
                     title: str = "Logit lens: the top next-token guess after each layer") -> go.Figure:
    """Layer x position heatmap: each cell names the most likely next token.

    `top_tokens[l][t]` is the token the model would predict after input
    position t if it stopped at layer l, `top_probs[l][t]` its probability
    (the cell colour). The bottom row is the earliest layer.
    """
    z = _to_numpy(top_probs)
    if z.ndim != 2:
        raise ValueError(f"top_probs must be [layers, positions], got shape {z.shape}")
    n_layers, n = z.shape
    _check_len("top_tokens", top_tokens, n_layers)
    _check_len("input_tokens", input_tokens, n)
    for row in top_tokens:
        _check_len("a row of top_tokens", row, n)
    layer_labels = list(layer_labels) if layer_labels is not None else [str(i) for i in range(n_layers)]
    _check_len("layer_labels", layer_labels, n_layers)
    cell_text = [[token_label(t, 8) for t in row] for row in top_tokens]
    guesses = np.array([[token_label(t) for t in row] for row in top_tokens], dtype=object)
    after = _pairs(layer_labels, input_tokens)       # (layers, T, 2): layer, input token
    custom = np.concatenate([guesses[..., None], after[..., ::-1]], axis=-1)  # guess, input, layer
    fig = go.Figure(go.Heatmap(
        z=z, x=list(range(n)), y=list(range(n_layers)), text=cell_text, texttemplate="%{text}",
        customdata=custom, colorscale=PROB_COLORSCALE, zmin=0, zmax=1, xgap=1, ygap=1,
        hovertemplate="layer %{customdata[2]}, after %{customdata[1]}<br>guess %{customdata[0]}"
                      "<br>probability %{z:.3f}<extra></extra>",
        colorbar=dict(title=dict(text="prob")),
    ))
    fig.update_xaxes(title="input token (the guess is for the token after it)", **_token_axis(_labels(input_tokens)))
    fig.update_yaxes(title="layer", tickmode="array", tickvals=list(range(n_layers)), ticktext=layer_labels,
                     showgrid=False)
    fs = _font_size()
    fig.update_layout(title=title,
                      width=int(min(max(n * fs * 6, 400) + 260, 1600)),
                      height=int(min(max(n_layers * fs * 1.6, 250) + 240, 1400)))
    return fig


# --------------------------------------------------------------------------
# Stage 3: the next-token distribution and sampling
# --------------------------------------------------------------------------

@_fits_title
def distribution_chart(labels: Sequence[str], probs_before: Any, probs_after: Any,
                       chosen: int | str | None = None, top_p: float | None = None,
                       probs_scaled: Any | None = None,
                       title: str = "Next-token distribution") -> go.Figure:
    """Top-N candidate tokens: probability before and after the sampling filters.

    The caller passes the top N tokens sorted by `probs_before` (the plain
    softmax). `probs_after` is the distribution actually sampled from (after
    temperature / top-k / top-p / min-p); tokens it sets to 0 are drawn grey. The
    dotted line is the running total of `probs_before` (right axis), so one
    can read off where top-p cuts. `chosen` (an index into `labels`, or a
    label) gets a thick black outline and an arrow.

    Top-p measures the mass *after* temperature. When the temperature is not
    1, pass `probs_scaled` = softmax(logits / temperature) for the same tokens
    and the running total is drawn from it, so the line crosses `top_p`
    exactly where the grey bars begin.
    """
    before = _to_numpy(probs_before).reshape(-1)
    after = _to_numpy(probs_after).reshape(-1)
    n = len(labels)
    _check_len("probs_before", before, n)
    _check_len("probs_after", after, n)
    if isinstance(chosen, str):
        chosen = list(labels).index(chosen)
    cut = after == 0
    x = list(range(n))
    outline = [4 if i == chosen else 0 for i in x]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Bar(
        x=x, y=before, name="before: softmax(logits)",
        marker=dict(color=[GREY if c else BLUE for c in cut], line=dict(width=outline, color="black")),
        customdata=[token_label(t) for t in labels],
        hovertemplate="%{customdata}<br>before %{y:.4f}<extra></extra>",
    ), secondary_y=False)
    fig.add_trace(go.Bar(
        x=x, y=after, name="after: temperature / top-k / top-p",
        marker=dict(color=ORANGE, line=dict(width=outline, color="black")),
        customdata=[token_label(t) for t in labels],
        hovertemplate="%{customdata}<br>after %{y:.4f}<extra></extra>",
    ), secondary_y=False)
    running = before if probs_scaled is None else _to_numpy(probs_scaled).reshape(-1)
    _check_len("probs_scaled", running, n)
    fig.add_trace(go.Scatter(
        x=x, y=np.cumsum(running), mode="lines+markers",
        name="cumulative mass (before)" if probs_scaled is None else "cumulative mass (after temperature)",
        line=dict(color="black", dash="dot"),
        hovertemplate="cumulative %{y:.3f}<extra></extra>",
    ), secondary_y=True)
    if top_p is not None:
        fig.add_shape(type="line", xref="x domain", x0=0, x1=1, yref="y2", y0=top_p, y1=top_p,
                      line=dict(color=RED, dash="dash", width=2))
        fig.add_annotation(xref="x domain", x=0.5, yref="y2", y=top_p, text=f"top-p = {top_p:g}",
                           showarrow=False, yanchor="bottom", font=dict(color=RED), bgcolor="rgba(255,255,255,0.8)")
    if chosen is not None:
        top = max(before[chosen], after[chosen])
        fig.add_annotation(x=chosen, y=top, yref="y", text="chosen", showarrow=True, arrowhead=2, ay=-28,
                           bgcolor="rgba(255,255,255,0.8)")
    n_cut = int(cut.sum())
    fig.update_xaxes(title="candidate token (grey = cut by the filters)", **_token_axis(_labels(labels)))
    ymax = float(max(before.max(initial=0), after.max(initial=0)))
    fig.update_yaxes(title="probability", range=[0, ymax * 1.2 + 1e-9], secondary_y=False)
    # Fixed ticks: otherwise plotly lines them up with the left axis at odd values like 0.847.
    fig.update_yaxes(title="cumulative probability", range=[0, 1.05], showgrid=False, secondary_y=True,
                     tickmode="array", tickvals=[0, 0.2, 0.4, 0.6, 0.8, 1.0])
    fs = _font_size()
    # The legend goes above the plot, under the title: inside the plot it would
    # hide bars or the running total, and below it collides with slanted labels.
    height = int(fs * 42)
    fig.update_layout(title=title_text(title, f"top {n} tokens, {n_cut} cut"),
                      barmode="group", margin=dict(t=int(fs * 10)),
                      width=int(min(max(n * fs * 3, 500) + 260, 1500)), height=height,
                      legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0))
    return fig


# --------------------------------------------------------------------------
# The KV cache
# --------------------------------------------------------------------------

def kv_cache_bytes(n_layers: int, n_kv_heads: int, head_dim: int, seq_len: int,
                   bytes_per_value: int = 2, batch_size: int = 1) -> int:
    """Bytes of K and V for a sequence: 2 x layers x kv_heads x head_dim x bytes x seq_len
    (labkit.kv_cache.bytes_per_token x seq_len)."""
    return kv_cache.bytes_per_token(n_layers, n_kv_heads, head_dim, bytes_per_value, batch_size) * seq_len


@_fits_title
def kv_cache_chart(steps: Any, used_bytes: Any, allocated_bytes: Any | None = None,
                   per_layer: bool = False, n_layers: int | None = None,
                   title: str = "KV cache size during generation") -> go.Figure:
    """KV cache memory (MB) against decode step: what is used, what is reserved.

    The used line grows by the same amount every step (one K and one V
    vector per layer per KV head); a preallocated cache reserves its maximum
    from the start. `per_layer=True` divides by `n_layers` to show one layer.
    """
    x = _to_numpy(steps).reshape(-1)
    used = _to_numpy(used_bytes).reshape(-1)
    _check_len("used_bytes", used, len(x))
    alloc = None if allocated_bytes is None else np.broadcast_to(_to_numpy(allocated_bytes), used.shape)
    scale = MB
    if per_layer:
        if not n_layers:
            raise ValueError("per_layer=True needs n_layers")
        scale *= n_layers
    fig = go.Figure(go.Scatter(
        x=x, y=used / scale, mode="lines+markers", name="used", line=dict(color=BLUE),
        customdata=used, hovertemplate="step %{x}<br>%{y:.3f} MB (%{customdata:,.0f} bytes)<extra></extra>",
    ))
    if alloc is not None:
        fig.add_trace(go.Scatter(x=x, y=alloc / scale, mode="lines", name="allocated",
                                 line=dict(color=ORANGE, dash="dash"),
                                 hovertemplate="step %{x}<br>allocated %{y:.3f} MB<extra></extra>"))
    sub = None
    if len(x) > 1 and x[-1] != x[0]:
        per_step = (used[-1] - used[0]) / (x[-1] - x[0]) / (n_layers if per_layer else 1)
        sub = f"grows by {format_bytes(per_step)} per token"
    where = " (one layer)" if per_layer else ""
    fig.update_xaxes(title="decode step")
    _step_axis(fig, x)
    if not len(x):      # nothing generated yet: a plain empty frame, not ticks at 1e-9
        fig.update_xaxes(range=[-0.5, 9.5])
        fig.update_yaxes(range=[0, 1])
    fig.update_yaxes(title=f"KV cache{where} (MB)", rangemode="tozero")
    fig.update_layout(title=title_text(title + where, sub), **_size(800, 480))
    return fig


@_fits_title
def cache_size_comparison(n_layers: int, n_heads: int, n_kv_heads: int, head_dim: int,
                          seq_len: int, bytes_per_value: int = 2, batch_size: int = 1,
                          title: str = "KV cache size: MHA vs GQA vs MQA") -> go.Figure:
    """Bars of the KV cache size with all heads (MHA), `n_kv_heads` (GQA) and one (MQA).

    Size = 2 (K and V) x layers x kv_heads x head_dim x bytes_per_value x seq_len
    (x batch). The bar heights are MB; exact bytes are in `customdata`.
    The MHA and MQA bars are what a model of the same shape would store had it
    been trained with that many K/V heads: the number of K/V heads is fixed
    at training time (GQA, Ainslie et al. 2023), not a switch on a loaded model.
    """
    kinds = [("MHA", n_heads), ("GQA", n_kv_heads), ("MQA", 1)]
    sizes = [kv_cache_bytes(n_layers, kv, head_dim, seq_len, bytes_per_value, batch_size) for _, kv in kinds]
    fig = go.Figure(go.Bar(
        x=[f"{name}<br>{kv} KV head{'s' if kv > 1 else ''}" for name, kv in kinds],
        y=[s / MB for s in sizes], customdata=sizes, text=[format_bytes(s) for s in sizes],
        textposition="outside", marker_color=[RED, BLUE, GREEN], cliponaxis=False,
        hovertemplate="%{x}<br>%{customdata:,} bytes<extra></extra>",
    ))
    batch = f" x batch {batch_size}" if batch_size != 1 else ""
    formula = (f"2 x {n_layers} layers x kv_heads x {head_dim} dims x {bytes_per_value} bytes"
               f" x {seq_len} tokens{batch}")
    fig.update_yaxes(title="KV cache (MB)", range=[0, max(sizes) / MB * 1.2])
    fig.update_xaxes(title=f"{n_heads} query heads")
    fig.update_layout(title=title_text(title, formula), **_size(800, 520), showlegend=False)
    return fig


# --------------------------------------------------------------------------
# Timing: the prefill step and the decode steps
# --------------------------------------------------------------------------

@_fits_title
def timing_chart(step_seconds: Any, prefill_steps: int = 1,
                 title: str = "Time per step: prefill vs decode") -> go.Figure:
    """The work of every generation step, in milliseconds (Step.seconds).

    The first `prefill_steps` bars are the prefill (the prefill time, the
    largest part of TTFT; TTFT also counts tokenization, from the request);
    the rest are decode steps, whose mean is drawn as a dashed line. When the
    steps follow one another with no pause (generate), that mean is about the
    TPOT; a live view stepped by hand has pauses between steps, which the
    bars leave out. The subtitle adds the median, the noise-robust figure.
    """
    ms = _to_numpy(step_seconds).reshape(-1) * 1000
    n = len(ms)
    if not 0 <= prefill_steps <= n:
        raise ValueError(f"prefill_steps={prefill_steps} but there are {n} steps")
    colours = [ORANGE if i < prefill_steps else BLUE for i in range(n)]
    kinds = ["prefill" if i < prefill_steps else "decode" for i in range(n)]
    fig = go.Figure(go.Bar(
        x=list(range(n)), y=ms, marker_color=colours, customdata=kinds, showlegend=False,
        hovertemplate="step %{x} (%{customdata})<br>%{y:.2f} ms<extra></extra>",
    ))
    # Two empty traces only to explain the colours in the legend.
    fig.add_trace(go.Bar(x=[None], y=[None], marker_color=ORANGE, name="prefill"))
    fig.add_trace(go.Bar(x=[None], y=[None], marker_color=BLUE, name="decode"))
    parts = [f"prefill {ms[:prefill_steps].sum():.1f} ms"] if prefill_steps else []
    decode = ms[prefill_steps:]
    if len(decode):
        mean = float(decode.mean())
        # The line spans the decode steps only: it says nothing about the prefill.
        # Its label is in the legend: a label on the chart would sit on the bars.
        fig.add_trace(go.Scatter(x=[prefill_steps - 0.5, n - 0.5], y=[mean, mean], mode="lines",
                                 line=dict(color=GREEN, dash="dash", width=3),
                                 name=f"mean decode step {mean:.1f} ms", hoverinfo="name"))
        parts.append(f"mean decode step {mean:.1f} ms ({1000 / mean:.1f} tokens/s), "
                     f"median {median(decode):.1f} ms" if mean > 0 else "")
    fig.update_xaxes(title="step (0 = prefill)" if prefill_steps == 1 else "step")
    _step_axis(fig, range(n))
    fig.update_yaxes(title="time (ms)", rangemode="tozero")
    if not n:           # nothing generated yet: a plain empty frame, not ticks at 1e-9
        fig.update_xaxes(range=[-0.5, 9.5])
        fig.update_yaxes(range=[0, 100])
    fs = _font_size()
    fig.update_layout(title=title_text(title, ", ".join(p for p in parts if p)), **_size(800, 480),
                      bargap=0.1, barmode="overlay", margin=dict(t=int(fs * 8.5)),   # room for 2 legend rows
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, x=1, xanchor="right"))
    return fig


@_fits_title
def cache_speedup_chart(lengths: Any, with_cache_s: Any, without_cache_s: Any,
                        title: str = "Time for one more token, with and without the KV cache") -> go.Figure:
    """The time of ONE step (one more token) against the sequence length
    (labkit.measure.cache_speedup). Per step, the cached line is about flat
    (one token through the weights, plus attention over the cached positions,
    a small term that grows slowly) and the uncached one about linear (the
    whole sequence again). Summed over a generation of n tokens, these become
    about linear and about quadratic in n."""
    x = _to_numpy(lengths).reshape(-1)
    with_c = _to_numpy(with_cache_s).reshape(-1)
    without = _to_numpy(without_cache_s).reshape(-1)
    _check_len("with_cache_s", with_c, len(x))
    _check_len("without_cache_s", without, len(x))
    fig = go.Figure([
        go.Scatter(x=x, y=without, mode="lines+markers", name="without cache (recompute everything)",
                   line=dict(color=RED), hovertemplate="length %{x}<br>%{y:.3f} s<extra></extra>"),
        go.Scatter(x=x, y=with_c, mode="lines+markers", name="with KV cache",
                   line=dict(color=BLUE), hovertemplate="length %{x}<br>%{y:.3f} s<extra></extra>"),
    ])
    sub = None
    if len(x) and with_c[-1] > 0:
        sub = f"at {x[-1]:.0f} tokens the cache is {without[-1] / with_c[-1]:.1f}x faster"
    fig.update_xaxes(title="sequence length (tokens)")
    fig.update_yaxes(title="time for one more token (s)", rangemode="tozero")
    fig.update_layout(title=title_text(title, sub), **_size(800, 480),
                      legend=dict(x=0.02, y=0.98, bgcolor="rgba(255,255,255,0.7)"))
    return fig


# --------------------------------------------------------------------------
# Roofline
# --------------------------------------------------------------------------

@_fits_title
def roofline_chart(peak_flops: float, bandwidth_bytes_per_s: float,
                   points: Sequence[dict] = (), device_name: str = "device",
                   title: str = "Roofline") -> go.Figure:
    """Log-log roofline (Williams, Waterman and Patterson 2009): attainable
    FLOP/s = min(peak, bandwidth x intensity).

    Left of the ridge point (intensity = peak / bandwidth) a kernel is
    memory-bound, right of it compute-bound. Each point is a dict with
    `name`, `intensity` (FLOP/byte) and `flops_per_s` (measured).
    Decode at batch 1 lands far left; prefill of a long prompt far right.
    """
    if peak_flops <= 0 or bandwidth_bytes_per_s <= 0:
        raise ValueError("peak_flops and bandwidth_bytes_per_s must be positive")
    ridge = peak_flops / bandwidth_bytes_per_s
    xs = [p["intensity"] for p in points if p["intensity"] > 0]
    lo = min([ridge / 100] + [v / 3 for v in xs])
    hi = max([ridge * 100] + [v * 3 for v in xs])
    grid = np.geomspace(lo, hi, 200)
    # Include the ridge itself so the corner of the roof is drawn sharp.
    grid = np.sort(np.append(grid, ridge))
    roof = np.minimum(peak_flops, bandwidth_bytes_per_s * grid)
    fig = go.Figure(go.Scatter(
        x=grid, y=roof, mode="lines", name="roof: min(peak, bandwidth x intensity)",
        line=dict(color="black"), hovertemplate="intensity %{x:.3g}<br>attainable %{y:.3s}FLOP/s<extra></extra>",
    ))
    fig.add_trace(go.Scatter(
        x=[ridge], y=[peak_flops], mode="markers", name=f"ridge point: {ridge:.3g} FLOP/byte",
        marker=dict(symbol="diamond", size=14, color=RED),
        hovertemplate="ridge point<br>%{x:.3g} FLOP/byte<extra></extra>",
    ))
    colours = [c for c in PALETTE if c != RED]  # red is the ridge's colour
    for k, p in enumerate(points):
        fig.add_trace(go.Scatter(
            x=[p["intensity"]], y=[p["flops_per_s"]], mode="markers+text", name=p["name"],
            text=[p["name"]], textposition="bottom right", marker=dict(size=14, color=colours[k % len(colours)]),
            hovertemplate=f"{p['name']}<br>%{{x:.3g}} FLOP/byte<br>%{{y:.3s}}FLOP/s<extra></extra>",
        ))
    fig.add_vline(x=ridge, line=dict(color=RED, dash="dot", width=1))
    fig.add_annotation(x=math.log10(ridge) - 0.3, y=math.log10(peak_flops) + 0.25, text="← memory-bound",
                       showarrow=False, xanchor="right")
    fig.add_annotation(x=math.log10(ridge) + 0.3, y=math.log10(peak_flops) + 0.25, text="compute-bound →",
                       showarrow=False, xanchor="left")
    ymin = min([roof[0]] + [p["flops_per_s"] for p in points if p["flops_per_s"] > 0])
    y_lo, y_hi = math.log10(ymin) - 0.5, math.log10(peak_flops) + 0.6
    # Ticks only at powers of ten, written with SI prefixes (plotly stops at T and
    # would write 10^15 next to "100T").
    powers = [10.0**k for k in range(math.ceil(y_lo), math.floor(y_hi) + 1)]
    fig.update_xaxes(type="log", title="arithmetic intensity (FLOP/byte)", dtick=1)
    fig.update_yaxes(type="log", title="attainable FLOP/s", range=[y_lo, y_hi],
                     tickmode="array", tickvals=powers, ticktext=[_si(v) for v in powers])
    sub = f"{device_name}: peak {_si(peak_flops)}FLOP/s, memory bandwidth {_si(bandwidth_bytes_per_s)}B/s"
    fig.update_layout(title=title_text(title, sub), **_size(1000, 520))
    return fig


# --------------------------------------------------------------------------
# Measurements: prefill and batch sweeps (labkit.measure)
# --------------------------------------------------------------------------

@_fits_title
def prefill_chart(sweep: PrefillSweep, title: str = "Prefill time against prompt length") -> go.Figure:
    """Left: the prefill time (ms) against prompt length. Right: the same time
    per prompt token. A prefill sweep times the forward pass alone: TTFT, from
    the request, adds tokenization (and, on a server, queueing)."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=("prefill time", "time per prompt token"))
    fig.add_trace(go.Scatter(x=sweep.lengths, y=[s * 1e3 for s in sweep.seconds], mode="lines+markers",
                             name="prefill", line=dict(color=ORANGE),
                             hovertemplate="%{x} tokens<br>prefill %{y:.1f} ms<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=sweep.lengths, y=sweep.ms_per_token, mode="lines+markers",
                             name="per prompt token", line=dict(color=BLUE),
                             hovertemplate="%{x} tokens<br>%{y:.2f} ms per token<extra></extra>"), row=1, col=2)
    fig.update_xaxes(title="prompt length (tokens)", rangemode="tozero")
    fig.update_yaxes(title="prefill time (ms)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title="ms per prompt token", rangemode="tozero", row=1, col=2)
    fig.update_layout(title=title_text(title, f"measured on {sweep.device}, median of {sweep.repeats}"),
                      width=1000, height=460, showlegend=False)
    return fig


@_fits_title
def prefill_points_chart(seconds: dict[int, float], current: int | None = None, max_length: int | None = None,
                         device: str = "", title: str = "Prefill time against prompt length") -> go.Figure:
    """The prefill time (ms) of every prompt length measured so far (`seconds`:
    length -> seconds), one line; `current` (the length shown now) marked; the
    x axis runs to `max_length`. For lengths measured one at a time (a slider);
    a whole sweep is prefill_chart's."""
    lengths = sorted(seconds)
    fig = go.Figure(go.Scatter(x=lengths, y=[seconds[n] * 1e3 for n in lengths], mode="lines+markers",
                               name="measured", line=dict(color=BLUE),
                               hovertemplate="%{x} tokens<br>prefill %{y:.1f} ms<extra></extra>"))
    if current in seconds:
        fig.add_trace(go.Scatter(x=[current], y=[seconds[current] * 1e3], mode="markers", name="now",
                                 marker=dict(color=ORANGE, size=16)))
    fig.update_xaxes(title="prompt length (tokens)", range=[0, (max_length or max(lengths, default=1)) * 1.05])
    fig.update_yaxes(title="prefill time (ms)", rangemode="tozero")
    sub = f"{len(lengths)} lengths measured" + (f" on {device}" if device else "")
    if not lengths:
        sub = "move the slider"
    fig.update_layout(title=title_text(title, sub), width=800, height=480, showlegend=False)
    return fig


# The names these had when the prefill time was called TTFT.
ttft_chart, ttft_points_chart = prefill_chart, prefill_points_chart


@_fits_title
def batch_chart(sweep: BatchSweep, title: str = "Batch size: prefill vs decode") -> go.Figure:
    """Three panels against the batch size: prefill time per token (flat once
    the device is busy), decode throughput in tokens/s (rising with the batch),
    and the KV cache's share of the bytes each decode step reads."""
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.09,
                        subplot_titles=(f"prefill, {sweep.prompt_len} tokens each",
                                        f"decode, {sweep.context} cached each",
                                        "KV cache share of reads"))
    x = [str(b) for b in sweep.batch_sizes]   # categories: evenly spaced, labelled with the batch size
    fig.add_trace(go.Scatter(x=x, y=sweep.prefill_ms_per_token, mode="lines+markers", name="prefill",
                             line=dict(color=ORANGE),
                             hovertemplate="batch %{x}<br>%{y:.2f} ms per token<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=x, y=sweep.decode_tokens_per_s, mode="lines+markers", name="decode",
                             line=dict(color=BLUE),
                             hovertemplate="batch %{x}<br>%{y:.1f} tokens/s<extra></extra>"), row=1, col=2)
    fig.add_trace(go.Bar(x=x, y=[100 * f for f in sweep.kv_fraction], name="KV share", marker_color=GREEN,
                         text=[f"{100 * f:.0f}%" for f in sweep.kv_fraction], textposition="outside",
                         cliponaxis=False,
                         hovertemplate="batch %{x}<br>KV cache %{y:.0f}% of the bytes<extra></extra>"),
                  row=1, col=3)
    fig.update_xaxes(title="batch size", type="category")
    fig.update_yaxes(title="prefill time per token (ms)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title="decode throughput (tokens/s)", rangemode="tozero", row=1, col=2)
    fig.update_yaxes(title="KV cache / all bytes read (%)", range=[0, 110], row=1, col=3)
    fig.update_layout(title=title_text(title, f"measured on {sweep.device}, median of {sweep.repeats}"),
                      width=1050, height=460, showlegend=False)
    return fig


# --------------------------------------------------------------------------
# Optimisations: precision, tiled attention, speculative decoding
# --------------------------------------------------------------------------

@_fits_title
def precision_chart(results: list[PrecisionResult],
                    title: str = "Lower precision: bytes, speed and quality") -> go.Figure:
    """Three panels, one bar per model: weight bytes (MB), time per output token (ms),
    and mean KL divergence from the reference (nats; 0 = the same distribution)."""
    names = [r.name for r in results]
    panels = [("weights read per token (MB)", [r.weight_nbytes / 1e6 for r in results], "{:.0f}"),
              ("time per output token (ms)", [r.tpot_s * 1e3 for r in results], "{:.1f}"),
              ("KL from the reference (nats)", [r.kl_mean for r in results], "{:.2g}")]
    fig = make_subplots(rows=1, cols=3, subplot_titles=[p[0] for p in panels], horizontal_spacing=0.09)
    colours = [PALETTE[i % len(PALETTE)] for i in range(len(results))]
    for col, (label, values, fmt) in enumerate(panels, start=1):
        fig.add_trace(go.Bar(x=names, y=values, marker_color=colours, showlegend=False,
                             text=[fmt.format(v) for v in values], textposition="outside", cliponaxis=False,
                             hovertemplate=f"%{{x}}<br>{label}: %{{y:.4g}}<extra></extra>"), row=1, col=col)
        fig.update_yaxes(rangemode="tozero", range=[0, max(values + [1e-9]) * 1.25], row=1, col=col)
    agree = ", ".join(f"{r.name}: top-1 agreement {r.quality.top1_agreement:.0%}"
                      for r in results if r.quality)
    sub = f"measured on {results[0].device}" + (f"; {agree}" if agree else "")
    fig.update_layout(title=title_text(title, sub), width=1050, height=460)
    return fig


@_fits_title
def tiles_chart(n_queries: int, n_keys: int, block_size: int, causal: bool = True,
                title: str = "FlashAttention's tiles") -> go.Figure:
    """The (queries x keys) score matrix cut into block_size tiles: computed in
    full, computed with the causal mask inside (on the diagonal), or skipped.
    In labkit's loop only one tile's scores exist at any moment (per batch
    row and head); a GPU kernel works on many tiles at once, each in one
    thread block's on-chip memory, and never writes the whole matrix to HBM."""
    offset = n_keys - n_queries
    kinds = {"computed": BLUE, "on the diagonal (masked inside)": ORANGE, "skipped (all masked)": GREY}
    shapes, hover = {k: [] for k in kinds}, {k: [] for k in kinds}
    for q0 in range(0, n_queries, block_size):
        q1 = min(q0 + block_size, n_queries)
        for k0 in range(0, n_keys, block_size):
            k1 = min(k0 + block_size, n_keys)
            if causal and k0 > offset + q1 - 1:
                kind = "skipped (all masked)"
            elif causal and k1 - 1 > offset + q0:
                kind = "on the diagonal (masked inside)"
            else:
                kind = "computed"
            shapes[kind].append((k0, k1, q0, q1))
            hover[kind].append(f"queries {q0}-{q1 - 1}, keys {k0}-{k1 - 1}<br>{kind}")
    fig = go.Figure()
    for kind, colour in kinds.items():
        xs, ys = [], []
        for k0, k1, q0, q1 in shapes[kind]:
            xs += [k0, k1, k1, k0, k0, None]
            ys += [q0, q0, q1, q1, q0, None]
        fig.add_trace(go.Scatter(x=xs or [None], y=ys or [None], fill="toself", mode="lines", fillcolor=colour,
                                 line=dict(color="white", width=2), name=f"{kind}: {len(shapes[kind])}",
                                 hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=[(a + b) / 2 for a, b, _, _ in shapes[kind]],
                                 y=[(c + d) / 2 for _, _, c, d in shapes[kind]], mode="markers",
                                 marker=dict(size=1, opacity=0), hovertext=hover[kind], hoverinfo="text",
                                 showlegend=False))
    fig.update_xaxes(title="key position", range=[0, n_keys], constrain="domain")
    fig.update_yaxes(title="query position", range=[n_queries, 0], scaleanchor="x", scaleratio=1)
    held = min(block_size, n_queries) * min(block_size, n_keys)
    sub = (f"{n_queries} x {n_keys} scores = {n_queries * n_keys:,} per head; held at once: one "
           f"{min(block_size, n_queries)} x {min(block_size, n_keys)} tile = {held:,}")
    fig.update_layout(title=title_text(title, sub), width=900, height=620, margin=dict(t=110),
                      legend=dict(x=1.02, y=1, xanchor="left", yanchor="top"))
    return fig


@_fits_title
def rounds_chart(gen: SpeculativeGeneration, tokenizer=None,
                 title: str = "Speculative decoding: what each forward pass produced") -> go.Figure:
    """One stacked bar per forward pass: draft tokens accepted (green), the
    model's own token (blue), draft tokens rejected (grey, below zero).
    With a tokenizer, hovering shows the tokens."""
    def words(ids):
        return "".join(token_label(t) for t in tokenizer.convert_ids_to_tokens(ids)) if tokenizer and ids else ""

    x = list(range(len(gen.rounds)))
    accepted = [r.accepted for r in gen.rounds]
    own = [len(r.token_ids) - r.accepted for r in gen.rounds]
    rejected = [-len(r.rejected) for r in gen.rounds]
    kept_text = [words(r.token_ids) for r in gen.rounds]
    fig = go.Figure([
        go.Bar(x=x, y=accepted, name="draft accepted", marker_color=GREEN, customdata=kept_text,
               hovertemplate="pass %{x}: %{y} draft tokens accepted<br>%{customdata}<extra></extra>"),
        go.Bar(x=x, y=own, name="the model's own token", marker_color=BLUE, customdata=kept_text,
               hovertemplate="pass %{x}: + the model's token<br>%{customdata}<extra></extra>"),
        go.Bar(x=x, y=rejected, name="draft rejected (rolled back)", marker_color=GREY,
               customdata=[words(r.rejected) for r in gen.rounds],
               hovertemplate="pass %{x}: %{y} rejected<br>%{customdata}<extra></extra>"),
    ])
    fig.update_xaxes(title="forward pass (0 = prefill)")
    fig.update_yaxes(title="tokens (rejected below 0)")
    sub = (f"{len(gen.token_ids)} tokens in {gen.forward_passes} passes "
           f"({gen.tokens_per_pass:.2f} per pass); accepted {gen.accepted} of {gen.drafted} drafted")
    fig.update_layout(title=title_text(title, sub), barmode="relative", width=900, height=440,
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, x=1, xanchor="right"))
    return fig


# --------------------------------------------------------------------------
# Serving many users: static vs continuous batching (labkit.batching)
# --------------------------------------------------------------------------

@_fits_title
def timeline_chart(results: dict[str, BatchingResult] | list[BatchingResult],
                   title: str = "Static vs continuous batching: one row per request") -> go.Figure:
    """A Gantt chart per policy: each request waits (grey), then runs (colour) from its
    prefill to its last token; in a static batch its slot then idles (pale) until the
    batch's longest request is done. The bottom panel shows the useful slots per step."""
    results = list(results.values()) if isinstance(results, dict) else list(results)
    n = len(results)
    fig = make_subplots(rows=n + 1, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        row_heights=[1.0] * n + [0.6],
                        subplot_titles=[f"{r.policy} batching: {r.throughput:.1f} tokens/s, "
                                        f"mean latency {r.mean_latency_s:.2f} s" for r in results]
                        + ["sequences producing a token in each step"])
    colours = {"static": ORANGE, "continuous": BLUE}
    for row, r in enumerate(results, start=1):
        ids = [rec.request.id for rec in r.records]
        waits = [rec.queue_s for rec in r.records]
        runs = [rec.finish_s - rec.start_s for rec in r.records]
        fig.add_trace(go.Bar(y=ids, x=waits, base=[rec.request.arrival_s for rec in r.records], orientation="h",
                             marker_color=GREY, name="waiting", showlegend=row == 1, legendgroup="wait",
                             hovertemplate="request %{y}<br>waited %{x:.2f} s<extra></extra>"), row=row, col=1)
        fig.add_trace(go.Bar(y=ids, x=runs, base=[rec.start_s for rec in r.records], orientation="h",
                             marker_color=colours.get(r.policy, GREEN), name=f"{r.policy}: running",
                             customdata=[rec.request.output_len for rec in r.records],
                             hovertemplate="request %{y}: %{customdata} tokens<br>ran %{x:.2f} s<extra></extra>"),
                      row=row, col=1)
        if r.policy == "static":
            # A finished request's slot stays in the batch (as padding) until the batch's longest is done.
            batch_end: dict[float, float] = {}
            for rec in r.records:
                batch_end[rec.start_s] = max(batch_end.get(rec.start_s, 0.0), rec.finish_s)
            pad = [batch_end[rec.start_s] - rec.finish_s for rec in r.records]
            fig.add_trace(go.Bar(y=ids, x=pad, base=[rec.finish_s for rec in r.records], orientation="h",
                                 marker_color=colours["static"], opacity=0.3, name="static: slot kept as padding",
                                 hovertemplate="request %{y}: done, its slot idles %{x:.2f} s<extra></extra>"),
                          row=row, col=1)
        fig.update_yaxes(title="request", autorange="reversed", row=row, col=1)
        fig.add_trace(go.Scatter(x=[s.start_s for s in r.steps], y=[len(s.running) for s in r.steps],
                                 mode="lines", line=dict(shape="hv", color=colours.get(r.policy, GREEN)),
                                 name=f"{r.policy}: busy slots", showlegend=False,
                                 hovertemplate="t %{x:.2f} s<br>%{y} sequences<extra></extra>"),
                      row=n + 1, col=1)
    max_batch = max(r.max_batch for r in results)
    fig.update_yaxes(title="busy slots", range=[0, max_batch + 0.5], row=n + 1, col=1)
    fig.update_xaxes(title="time (s)", row=n + 1, col=1)
    fig.update_layout(title=title_text(title, f"max batch {max_batch}, {len(results[0].records)} requests"),
                      barmode="overlay", bargap=0.25, width=1000, height=260 * n + 340, margin=dict(t=140),
                      legend=dict(orientation="h", yanchor="bottom", y=1.04, x=1, xanchor="right"))
    return fig


@_fits_title
def summary_chart(results: dict[str, BatchingResult] | list[BatchingResult],
                  title: str = "Static vs continuous batching") -> go.Figure:
    """Side-by-side bars: throughput, p90 TTFT (from arrival, queueing
    included), p90 end-to-end latency, slot utilisation."""
    results = list(results.values()) if isinstance(results, dict) else list(results)
    panels = [("throughput (tokens/s)", lambda r: r.throughput),
              ("p90 TTFT (s)", lambda r: r.percentile(90, r.ttfts())),
              ("p90 e2e latency (s)", lambda r: r.percentile(90)),
              ("slot utilisation (%)", lambda r: 100 * r.slot_utilisation)]
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[p[0] for p in panels], horizontal_spacing=0.08)
    colours = {"static": ORANGE, "continuous": BLUE}
    for col, (name, fn) in enumerate(panels, start=1):
        values = [fn(r) for r in results]
        fig.add_trace(go.Bar(x=[r.policy for r in results], y=values, text=[f"{v:.3g}" for v in values],
                             textposition="outside", cliponaxis=False, showlegend=False,
                             marker_color=[colours.get(r.policy, GREEN) for r in results],
                             hovertemplate=f"%{{x}}<br>{name}: %{{y:.3g}}<extra></extra>"), row=1, col=col)
        fig.update_yaxes(rangemode="tozero", range=[0, max(values) * 1.25], row=1, col=col)
    fig.update_layout(title=title_text(title, "same requests, same step costs"), width=1050, height=420)
    return fig


@_fits_title
def itl_chart(itl_s: Any, device: str = "", title: str = "Inter-token latency (ITL)") -> go.Figure:
    """A histogram of the gaps between consecutive tokens (Generation.itl_s),
    in ms, with lines at their mean (the TPOT) and at the p50 / p90 / p99
    (nearest rank, labkit.timing.percentile). The mean sits right of the
    median when a few slow steps (a busy machine, a long prefill of another
    request) stretch the tail."""
    from .timing import percentile

    ms = _to_numpy(itl_s).reshape(-1) * 1000
    fig = go.Figure(go.Histogram(x=ms, nbinsx=max(10, min(40, len(ms))), marker_color=BLUE, name="gaps",
                                 hovertemplate="%{x} ms: %{y} gaps<extra></extra>", showlegend=False))
    sub = "no gaps yet" if not len(ms) else f"{len(ms)} gaps" + (f", measured on {device}" if device else "")
    if len(ms):
        marks = [(f"mean = TPOT {ms.mean():.1f} ms", float(ms.mean()), GREEN, "dash")]
        marks += [(f"p{q} {percentile(ms, q):.1f} ms", percentile(ms, q), colour, "dot")
                  for q, colour in ((50, ORANGE), (90, RED), (99, "black"))]
        for name, x, colour, dash in marks:
            # A line trace rather than add_vline, so each mark has a legend entry.
            fig.add_trace(go.Scatter(x=[x, x], y=[0, 1], yaxis="y2", mode="lines", name=name,
                                     line=dict(color=colour, dash=dash, width=3), hoverinfo="name"))
    fig.update_layout(yaxis2=dict(overlaying="y", range=[0, 1], visible=False))
    fig.update_xaxes(title="gap between consecutive tokens (ms)")
    fig.update_yaxes(title="gaps", rangemode="tozero")
    fig.update_layout(title=title_text(title, sub), **_size(800, 480), bargap=0.05,
                      legend=dict(x=0.98, xanchor="right", y=0.98, bgcolor="rgba(255,255,255,0.7)"))
    return fig


@_fits_title
def load_chart(load: dict[float, dict[str, BatchingResult]], ttft_slo_s: float | None = None,
               tpot_slo_s: float | None = None, title: str = "Serving under load") -> go.Figure:
    """What each batching policy does as requests arrive faster: throughput,
    p90 TTFT (queueing included) and, given both latency targets, goodput
    (requests per second that met them). `load`: arrival rate (requests/s) ->
    {policy: BatchingResult} (labkit.batching.compare at each rate)."""
    rates = sorted(load)
    panels = [("throughput (tokens/s)", lambda r: r.throughput),
              ("p90 TTFT (s)", lambda r: r.percentile(90, r.ttfts()))]
    if ttft_slo_s is not None and tpot_slo_s is not None:
        panels.append(("goodput (requests/s)", lambda r: r.goodput(ttft_slo_s, tpot_slo_s)))
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[p[0] for p in panels], horizontal_spacing=0.09)
    colours = {"static": ORANGE, "continuous": BLUE}
    policies = list(load[rates[0]]) if rates else []
    for col, (name, fn) in enumerate(panels, start=1):
        for policy in policies:
            fig.add_trace(go.Scatter(x=rates, y=[fn(load[r][policy]) for r in rates], mode="lines+markers",
                                     name=policy, legendgroup=policy, showlegend=col == 1,
                                     line=dict(color=colours.get(policy, GREEN)),
                                     hovertemplate=f"%{{x}} requests/s<br>{name}: %{{y:.3g}}<extra>{policy}</extra>"),
                          row=1, col=col)
        fig.update_xaxes(title="arrival rate (requests/s)", row=1, col=col)
        fig.update_yaxes(rangemode="tozero", row=1, col=col)
    if ttft_slo_s is not None and rates:
        fig.add_hline(y=ttft_slo_s, line=dict(color=RED, dash="dot"), row=1, col=2)
    sub = "same requests, same step costs"
    if ttft_slo_s is not None and tpot_slo_s is not None:
        sub += f"; targets TTFT <= {ttft_slo_s:g} s, TPOT <= {tpot_slo_s * 1e3:g} ms"
    # The legend under the axes: above them it would sit on the panel titles.
    fig.update_layout(title=title_text(title, sub), width=1100, height=480,
                      legend=dict(orientation="h", yanchor="top", y=-0.22, x=0.5, xanchor="center"),
                      margin=dict(t=int(_font_size() * 7), b=int(_font_size() * 8)))
    return fig


# --------------------------------------------------------------------------
# Theme and saving
# --------------------------------------------------------------------------

def _make_template(font: int, title: int, line: float, marker: float, grid: str, ink: str) -> go.layout.Template:
    """A copy of plotly_white with our colours, fonts and line widths."""
    t = go.layout.Template(pio.templates["plotly_white"])
    t.layout.font = dict(size=font, color=ink)
    # Titles hang from the top edge (pad: plotly measures it to the first line's
    # baseline, not its top), so a legend placed just above the plot never
    # runs into them, whatever the figure's height (charts are resized in views).
    t.layout.title = dict(font=dict(size=title), x=0.02, xanchor="left",
                          yref="container", y=1, yanchor="top", pad=dict(t=int(title * 1.4)))
    t.layout.colorway = PALETTE
    t.layout.hoverlabel = dict(font=dict(size=font))
    t.layout.legend = dict(font=dict(size=font))
    axis = dict(automargin=True, gridcolor=grid, linecolor=ink, showline=True, zerolinecolor=grid,
                tickfont=dict(size=font), title=dict(font=dict(size=font)))
    t.layout.xaxis = axis
    t.layout.yaxis = axis
    t.data.scatter = [go.Scatter(line=dict(width=line), marker=dict(size=marker))]
    t.data.bar = [go.Bar(marker=dict(line=dict(color=ink, width=0)))]
    return t


pio.templates["labkit"] = _make_template(font=14, title=20, line=2, marker=7, grid="#E5E5E5", ink="#222222")
# Projector: bigger text, black ink, darker grid, thicker lines.
pio.templates["labkit_lecture"] = _make_template(font=22, title=30, line=4.5, marker=12, grid="#AAAAAA", ink="#000000")
if pio.templates.default == "plotly":  # respect a template the user already chose
    pio.templates.default = "labkit"


def lecture_theme(on: bool = True) -> str:
    """Make every figure built from now on readable on a projector (or not).

    `lecture_theme()` switches the default template to "labkit_lecture"
    (22 px text, 30 px titles, thick lines); `lecture_theme(False)` goes back
    to "labkit". Figures already built keep their look. Returns the name of
    the template now in use.
    """
    pio.templates.default = "labkit_lecture" if on else "labkit"
    return pio.templates.default


def save_html(fig_or_figs: go.Figure | Sequence[go.Figure], path: str | Path,
              title: str = "LLM Inference Lab") -> Path:
    """Write one figure, or several on one page, to a standalone offline HTML file.

    plotly.js is embedded once (about 4.8 MB), never loaded from a CDN, so
    the file opens in a lecture hall without a network.
    """
    figs = [fig_or_figs] if isinstance(fig_or_figs, go.Figure) else list(fig_or_figs)
    if not figs:
        raise ValueError("no figures to save")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Only the first figure carries plotly.js; the others reuse it.
    parts = [f.to_html(full_html=False, include_plotlyjs=(i == 0), include_mathjax=False)
             for i, f in enumerate(figs)]
    page = ("<!DOCTYPE html>\n<html>\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n</head>\n<body>\n"
            + "\n".join(f"<div class=\"labkit-figure\">{p}</div>" for p in parts)
            + "\n</body>\n</html>\n")
    path.write_text(page, encoding="utf-8")
    return path
