"""labkit.charts: the figures hold the numbers they were given, labelled with the right tokens.

Most tests feed made-up data (a softmax of random numbers is a valid
attention pattern); the last group feeds the default model's real output,
through the session `model` fixture in conftest.py. Expected values are
computed here independently, not with viz's own helpers.
"""

import math
import re

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import pytest
import torch

from labkit import charts

TOKENS = ["The", " capital", " of", " France", " is", " Paris"]
LABELS = ["The", "␣capital", "␣of", "␣France", "␣is", "␣Paris"]  # written out by hand on purpose
IDS = [504, 3575, 282, 4649, 314, 7042]


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def causal_softmax(rng, heads, t):
    scores = rng.normal(size=(heads, t, t)) * 2
    scores[:, np.triu_indices(t, 1)[0], np.triu_indices(t, 1)[1]] = -np.inf
    return softmax(scores)


def ticktext(axis):
    return list(axis.ticktext)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def normal_theme():
    """Run a test under the normal template and leave the default as it was."""
    before = pio.templates.default
    charts.lecture_theme(False)
    yield
    pio.templates.default = before


# --------------------------------------------------------------------------
# Tokens
# --------------------------------------------------------------------------

@pytest.mark.parametrize("token, shown", [
    (" Paris", "␣Paris"), ("\n", "↵"), ("\t x", "⇥␣x"), ("", "∅"), ("abc", "abc"),
    ("<|im_end|>", "&lt;|im_end|&gt;"),  # plotly reads HTML tags in text; escaped, it shows them
    ("\x00", "\\x00"),
])
def test_token_label_makes_whitespace_visible(token, shown):
    assert charts.token_label(token) == shown


def test_token_label_cuts_long_tokens():
    assert charts.token_label(" " * 20, max_chars=5) == "␣␣␣␣…"


def test_token_strip_one_box_per_token_with_ids_on_hover():
    fig = charts.token_strip(TOKENS, torch.tensor(IDS))
    text = fig.data[0]
    assert len(fig.layout.shapes) == len(TOKENS)
    assert list(text.text) == LABELS
    assert list(text.customdata) == IDS
    assert all(f"id {i}" in h for i, h in zip(IDS, text.hovertext))
    # No probabilities: neighbouring boxes differ in colour.
    fills = [s.fillcolor for s in fig.layout.shapes]
    assert all(a != b for a, b in zip(fills, fills[1:]))


def test_token_strip_wraps_long_text_into_rows():
    fig = charts.token_strip(TOKENS * 20, IDS * 20, chars_per_row=40)
    shapes = fig.layout.shapes
    assert len(shapes) == 120
    assert all(s.x1 <= 40 for s in shapes)
    assert len({s.y0 for s in shapes}) > 1


def test_token_strip_colours_by_probability():
    probs = [0.05, 0.2, 0.5, 0.7, 0.9, 0.99]
    fig = charts.token_strip(TOKENS, IDS, probs=probs)
    assert "colour = probability" in fig.layout.title.text          # the key, in the subtitle
    assert "colour" not in charts.token_strip(TOKENS, IDS).layout.title.text

    def darkness(colour):  # "rgb(r, g, b)" -> 765 - r - g - b
        return 765 - sum(int(v) for v in re.findall(r"\d+", colour)[:3])

    dark = [darkness(s.fillcolor) for s in fig.layout.shapes]
    assert dark == sorted(dark) and dark[0] < dark[-1]
    assert all(f"probability {p:.3f}" in h for p, h in zip(probs, fig.data[0].hovertext))


def test_token_strip_rejects_mismatched_lengths():
    with pytest.raises(ValueError):
        charts.token_strip(TOKENS, IDS[:-1])


def test_token_table_columns():
    fig = charts.token_table(TOKENS, IDS)
    table = fig.data[0]
    assert isinstance(table, go.Table)
    assert [re.sub("<.*?>", "", v) for v in table.header.values] == ["Token ID", "Token Text"]
    assert list(table.cells.values[0]) == IDS
    assert list(table.cells.values[1]) == LABELS


# --------------------------------------------------------------------------
# Embeddings and positions
# --------------------------------------------------------------------------

def test_embedding_heatmap_shows_first_dims(rng):
    vectors = torch.tensor(rng.normal(size=(6, 100)), dtype=torch.float16)
    fig = charts.embedding_heatmap(vectors, TOKENS, max_dims=64)
    hm = fig.data[0]
    assert isinstance(hm, go.Heatmap)
    assert np.asarray(hm.z).shape == (6, 64)
    np.testing.assert_allclose(hm.z, vectors[:, :64].float().numpy())
    assert ticktext(fig.layout.yaxis) == LABELS
    assert hm.zmid == 0 and hm.zmin == -hm.zmax


def test_cosine_similarity_matches_torch(rng):
    vectors = rng.normal(size=(6, 32))
    fig = charts.cosine_similarity_heatmap(vectors, TOKENS)
    z = np.asarray(fig.data[0].z)
    t = torch.tensor(vectors)
    expected = torch.nn.functional.cosine_similarity(t[:, None, :], t[None, :, :], dim=-1).numpy()
    np.testing.assert_allclose(z, expected, atol=1e-9)
    np.testing.assert_allclose(np.diag(z), 1.0)
    np.testing.assert_allclose(z, z.T)
    assert (fig.data[0].zmin, fig.data[0].zmax) == (-1, 1)
    assert ticktext(fig.layout.xaxis) == LABELS == ticktext(fig.layout.yaxis)


def test_sinusoidal_heatmap_position_by_dimension():
    p = np.arange(50)[:, None]
    freq = 10000 ** (-np.arange(0, 16, 2) / 16)
    pe = np.zeros((50, 16))
    pe[:, 0::2], pe[:, 1::2] = np.sin(p * freq), np.cos(p * freq)
    fig = charts.sinusoidal_heatmap(pe)
    assert np.asarray(fig.data[0].z).shape == (50, 16)
    assert fig.layout.yaxis.title.text == "position" and fig.layout.xaxis.title.text == "dimension"


def test_rope_angles_chart_subset_and_wrap():
    angles = np.arange(40)[:, None] * 10000 ** (-np.arange(0, 64, 2) / 64)  # (40, 32)
    fig = charts.rope_angles_chart(angles, max_lines=8)
    assert [t.name.split(" (")[0] for t in fig.data] == [f"pair {i}" for i in range(0, 32, 4)]
    np.testing.assert_allclose(fig.data[1].y, angles[:, 4])

    wrapped = charts.rope_angles_chart(angles, wrap=True, pairs=[0])
    y = np.asarray(wrapped.data[0].y, dtype=float)
    finite = y[~np.isnan(y)]
    assert finite.min() >= 0 and finite.max() < 2 * math.pi
    np.testing.assert_allclose(finite, np.mod(angles[:, 0], 2 * math.pi))
    # Pair 0 turns 1 rad per position: it wraps 6 times in 40 positions, each a break in the line.
    assert np.isnan(y).sum() == 6


# --------------------------------------------------------------------------
# Attention
# --------------------------------------------------------------------------

def test_attention_heatmap_of_a_softmax(rng):
    pattern = causal_softmax(rng, 1, 6)[0]
    fig = charts.attention_heatmap(torch.tensor(pattern), TOKENS, TOKENS, layer=2, head=5)
    hm = fig.data[0]
    z = np.asarray(hm.z)
    assert z.shape == (6, 6)
    np.testing.assert_allclose(z.sum(axis=1), 1.0)
    assert (hm.zmin, hm.zmax) == (0, 1)
    assert ticktext(fig.layout.xaxis) == LABELS == ticktext(fig.layout.yaxis)
    assert fig.layout.yaxis.autorange == "reversed"  # query 0 on top
    assert "layer 2" in fig.layout.title.text and "head 5" in fig.layout.title.text


def test_attention_heatmap_keeps_repeated_tokens(rng):
    # Categorical axes would merge the two " the" rows; numeric ones must not.
    tokens = ["A", " the", " cat", " and", " the", " dog"]
    fig = charts.attention_heatmap(causal_softmax(rng, 1, 6)[0], tokens, tokens)
    assert list(fig.data[0].y) == list(range(6))
    assert ticktext(fig.layout.yaxis).count("␣the") == 2


def test_attention_heatmap_thins_labels_of_long_sequences(rng):
    t = 200
    tokens = [f" w{i}" for i in range(t)]
    fig = charts.attention_heatmap(softmax(rng.normal(size=(t, t))), tokens, tokens)
    assert np.asarray(fig.data[0].z).shape == (t, t)
    assert 10 <= len(fig.layout.xaxis.tickvals) <= charts.MAX_TICKS
    assert all(fig.layout.xaxis.ticktext[k] == f"␣w{v}" for k, v in enumerate(fig.layout.xaxis.tickvals))


def test_attention_grid_one_panel_per_head(rng):
    patterns = causal_softmax(rng, 9, 6)
    fig = charts.attention_grid(patterns, TOKENS, layer=4)
    heatmaps = [t for t in fig.data if isinstance(t, go.Heatmap)]
    assert len(heatmaps) == 9
    for h, hm in enumerate(heatmaps):
        np.testing.assert_allclose(hm.z, patterns[h])
        assert hm.coloraxis == "coloraxis"
    assert (fig.layout.coloraxis.cmin, fig.layout.coloraxis.cmax) == (0, 1)
    assert [a.text for a in fig.layout.annotations] == [f"head {h}" for h in range(9)]
    assert "layer 4" in fig.layout.title.text


def test_attention_grid_during_decode_has_one_query(rng):
    patterns = softmax(rng.normal(size=(3, 1, 6)))
    fig = charts.attention_grid(patterns, TOKENS, layer=0)
    assert ticktext(fig.layout.yaxis) == ["␣Paris"]  # the newest token is the query


def test_attention_row_is_a_bar_per_cached_key(rng):
    row = softmax(rng.normal(size=6))
    fig = charts.attention_row(row, TOKENS, layer=1, head=2)
    bar = fig.data[0]
    assert isinstance(bar, go.Bar)
    np.testing.assert_allclose(bar.y, row)
    assert ticktext(fig.layout.xaxis) == LABELS
    top = int(np.argmax(row))
    assert [c == charts.ORANGE for c in bar.marker.color] == [i == top for i in range(6)]


@pytest.mark.parametrize("n_heads, n_kv, head_dim", [(9, 3, 64), (32, 8, 128), (8, 8, 64), (8, 1, 64)])
def test_gqa_diagram_links_each_query_head_to_its_kv_head(n_heads, n_kv, head_dim):
    fig = charts.gqa_diagram(n_heads, n_kv, head_dim)
    group = n_heads // n_kv
    links = {t.name: [x for x in t.x[0::3]] for t in fig.data if t.mode == "lines"}
    assert len(links) == n_kv
    for j in range(n_kv):
        assert links[f"KV head {j}"] == [q for q in range(n_heads) if q // group == j]
    assert f"group size {group}" in fig.layout.title.text
    assert f"head size {head_dim}" in fig.layout.title.text
    kind = "MHA" if n_kv == n_heads else "MQA" if n_kv == 1 else "GQA"
    assert fig.layout.title.text.startswith(kind)


def test_gqa_diagram_rejects_uneven_groups():
    with pytest.raises(ValueError):
        charts.gqa_diagram(9, 4, 64)


# --------------------------------------------------------------------------
# Logit lens and sampling
# --------------------------------------------------------------------------

def test_logit_lens_chart_writes_the_guess_in_each_cell(rng):
    top_tokens = [[" Paris", " the", "\n", " a", " is", "x"] for _ in range(4)]
    top_probs = rng.uniform(size=(4, 6))
    fig = charts.logit_lens_chart(top_tokens, top_probs, TOKENS, layer_labels=["emb", "1", "2", "3"])
    hm = fig.data[0]
    np.testing.assert_allclose(hm.z, top_probs)
    assert [list(r) for r in hm.text] == [["␣Paris", "␣the", "↵", "␣a", "␣is", "x"]] * 4
    assert ticktext(fig.layout.xaxis) == LABELS
    assert list(fig.layout.yaxis.ticktext) == ["emb", "1", "2", "3"]
    assert (hm.zmin, hm.zmax) == (0, 1)


def test_distribution_chart_greys_exactly_the_cut_tokens():
    labels = [" Paris", " the", " a", " located", " known", " home"]
    before = np.array([0.5, 0.2, 0.1, 0.08, 0.05, 0.03])
    after = np.array([0.625, 0.25, 0.125, 0.0, 0.0, 0.0])
    fig = charts.distribution_chart(labels, before, after, chosen=1, top_p=0.75)
    bars = [t for t in fig.data if isinstance(t, go.Bar)]
    np.testing.assert_allclose(bars[0].y, before)
    np.testing.assert_allclose(bars[1].y, after)
    assert [c == charts.GREY for c in bars[0].marker.color] == [False, False, False, True, True, True]
    # The chosen token, and only it, is outlined in both bars.
    for bar in bars:
        assert [w > 0 for w in bar.marker.line.width] == [i == 1 for i in range(6)]
    line = [t for t in fig.data if isinstance(t, go.Scatter)][0]
    np.testing.assert_allclose(line.y, np.cumsum(before))
    assert line.yaxis == "y2"
    assert [s.y0 for s in fig.layout.shapes] == [0.75] and fig.layout.shapes[0].yref == "y2"
    assert ticktext(fig.layout.xaxis) == ["␣Paris", "␣the", "␣a", "␣located", "␣known", "␣home"]


def test_distribution_chart_chosen_by_label():
    fig = charts.distribution_chart(["a", "b", "c"], [0.6, 0.3, 0.1], [0.6, 0.3, 0.1], chosen="c")
    assert list(fig.data[0].marker.line.width)[2] > 0
    assert len(fig.layout.shapes) == 0  # no top_p, no marker line


# --------------------------------------------------------------------------
# KV cache
# --------------------------------------------------------------------------

def test_kv_cache_chart_in_megabytes():
    steps = np.arange(10)
    per_token = 2 * 30 * 3 * 64 * 4
    used = (steps + 5) * per_token
    fig = charts.kv_cache_chart(steps, used, allocated_bytes=64 * per_token)
    np.testing.assert_allclose(fig.data[0].y, used / 1e6)
    np.testing.assert_allclose(fig.data[1].y, np.full(10, 64 * per_token / 1e6))
    assert "MB" in fig.layout.yaxis.title.text
    assert "46.1 kB per token" in fig.layout.title.text

    one_layer = charts.kv_cache_chart(steps, used, per_layer=True, n_layers=30)
    np.testing.assert_allclose(one_layer.data[0].y, used / 30 / 1e6)
    with pytest.raises(ValueError):
        charts.kv_cache_chart(steps, used, per_layer=True)


@pytest.mark.parametrize("layers, heads, kv, dim, seq, nbytes", [
    (30, 9, 3, 64, 8192, 2),     # the default model, SmolLM2-135M
    (32, 32, 8, 128, 4096, 2),   # the course's example: 32 heads, 8 KV heads, size 128
])
def test_cache_size_comparison_matches_the_formula(layers, heads, kv, dim, seq, nbytes):
    fig = charts.cache_size_comparison(layers, heads, kv, dim, seq, bytes_per_value=nbytes)
    bar = fig.data[0]
    expected = [2 * layers * h * dim * nbytes * seq for h in (heads, kv, 1)]
    assert list(bar.customdata) == expected
    np.testing.assert_allclose(bar.y, np.array(expected) / 1e6)
    assert [x.split("<br>")[0] for x in bar.x] == ["MHA", "GQA", "MQA"]
    assert expected[0] / expected[1] == heads / kv


def test_course_example_sizes():
    # 2 x 32 x 8 x 128 x 2 bytes = 128 KiB per token; at 4096 tokens 512 MiB.
    fig = charts.cache_size_comparison(32, 32, 8, 128, 4096)
    assert fig.data[0].customdata[1] == 512 * 2**20


# --------------------------------------------------------------------------
# Timing and roofline
# --------------------------------------------------------------------------

def test_timing_chart_prefill_and_mean_decode_step():
    seconds = [0.25, 0.030, 0.034, 0.031, 0.040, 0.030]
    fig = charts.timing_chart(seconds, prefill_steps=1)
    bar = fig.data[0]
    np.testing.assert_allclose(bar.y, np.array(seconds) * 1000)
    assert list(bar.marker.color) == [charts.ORANGE] + [charts.BLUE] * 5
    line = next(t for t in fig.data if (t.name or "").startswith("mean decode step"))
    # By hand: (30 + 34 + 31 + 40 + 30) / 5 = 33 ms; the median of the five is 31 ms.
    assert list(line.y) == pytest.approx([33.0, 33.0])
    assert line.x[0] == 0.5 and line.x[1] == 5.5        # over the decode steps only
    assert "33.0 ms" in line.name                        # labelled in the legend, not on the bars
    assert "prefill 250.0 ms" in fig.layout.title.text and "median 31.0 ms" in fig.layout.title.text
    assert fig.layout.xaxis.dtick == 1                   # 6 steps: no tick at step 0.5


def test_step_axes_never_show_fractional_steps():
    assert charts.kv_cache_chart([0, 1], [100, 200]).layout.xaxis.dtick == 1
    long = charts.timing_chart([0.01] * 40)
    assert long.layout.xaxis.dtick is None and long.layout.xaxis.tickformat == "d"


def test_cache_speedup_chart_two_lines():
    fig = charts.cache_speedup_chart([16, 32, 64], [0.1, 0.2, 0.4], [0.1, 0.4, 1.6])
    assert len(fig.data) == 2 and all(t.mode == "lines+markers" for t in fig.data)
    assert {t.name for t in fig.data} == {"with KV cache", "without cache (recompute everything)"}
    assert "4.0x faster" in fig.layout.title.text


def test_roofline_chart():
    peak, bw = 989e12, 4.8e12
    points = [dict(name="decode", intensity=1.0, flops_per_s=4e12),
              dict(name="prefill", intensity=600.0, flops_per_s=7e14)]
    fig = charts.roofline_chart(peak, bw, points, device_name="H200")
    roof, ridge = fig.data[0], fig.data[1]
    x, y = np.asarray(roof.x), np.asarray(roof.y)
    np.testing.assert_allclose(y, np.minimum(peak, bw * x))
    assert ridge.x[0] == pytest.approx(peak / bw) and ridge.y[0] == pytest.approx(peak)
    assert any(v == pytest.approx(peak / bw) for v in x)  # the corner itself is on the roof
    assert [(t.name, t.x[0], t.y[0]) for t in fig.data[2:]] == [("decode", 1.0, 4e12), ("prefill", 600.0, 7e14)]
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    assert "H200" in fig.layout.title.text


def test_prefill_points_chart_marks_the_current_length():
    fig = charts.prefill_points_chart({64: 0.02, 8: 0.005}, current=64, max_length=100, device="cpu")
    line, now = fig.data
    assert list(line.x) == [8, 64] and list(line.y) == pytest.approx([5.0, 20.0])   # sorted, in ms
    assert (now.x[0], now.y[0]) == (64, pytest.approx(20.0))
    assert fig.layout.xaxis.range[1] == pytest.approx(105) and "2 lengths measured on cpu" in fig.layout.title.text
    assert len(charts.prefill_points_chart({}).data) == 1                                 # nothing measured yet


@pytest.mark.parametrize("n_queries, n_keys, block, counts", [
    (8, 8, 4, (1, 2, 1)),        # below, on and above the diagonal
    (2, 10, 4, (2, 1, 0)),       # decode-like: 2 new queries see every earlier key
])
def test_tiles_chart_counts_tiles_by_the_causal_mask(n_queries, n_keys, block, counts):
    fig = charts.tiles_chart(n_queries, n_keys, block)
    legend = [t.name for t in fig.data if t.showlegend is not False]
    assert [int(name.rsplit(": ", 1)[1]) for name in legend] == list(counts)
    assert f"{n_queries} x {n_keys} scores" in fig.layout.title.text


def test_rounds_chart_one_bar_per_forward_pass():
    from types import SimpleNamespace as NS
    rounds = [NS(token_ids=[5], accepted=0, rejected=[]),                  # the prefill
              NS(token_ids=[6, 7, 8], accepted=2, rejected=[9])]          # 2 drafts kept, 1 rolled back
    gen = NS(rounds=rounds, token_ids=[5, 6, 7, 8], forward_passes=2, tokens_per_pass=2.0, accepted=2, drafted=3)
    accepted, own, rejected = charts.rounds_chart(gen).data
    assert list(accepted.y) == [0, 2] and list(own.y) == [1, 1] and list(rejected.y) == [0, -1]
    assert "accepted 2 of 3 drafted" in charts.rounds_chart(gen).layout.title.text


def test_title_text_puts_the_subtitle_on_a_smaller_line():
    assert charts.title_text("Main") == charts.title_text("Main", "") == "Main"
    assert charts.title_text("Main", "sub") == "Main<br><sup>sub</sup>"


# --------------------------------------------------------------------------
# Theme and saving
# --------------------------------------------------------------------------

def test_lecture_theme_switches_and_restores(normal_theme, rng):
    normal = pio.templates[pio.templates.default].layout.font.size
    assert normal < 20
    assert charts.lecture_theme() == "labkit_lecture"
    fig = charts.attention_heatmap(causal_softmax(rng, 1, 6)[0], TOKENS, TOKENS)
    assert fig.layout.template.layout.font.size >= 20          # the figure built now is large
    assert fig.layout.template.layout.title.font.size > fig.layout.template.layout.font.size
    assert fig.layout.template.data.scatter[0].line.width >= 4
    charts.lecture_theme(False)
    assert pio.templates.default == "labkit"
    assert charts.timing_chart([0.1, 0.02]).layout.template.layout.font.size == normal


def test_lecture_theme_makes_figures_bigger(normal_theme, rng):
    small = charts.attention_heatmap(causal_softmax(rng, 1, 6)[0], TOKENS, TOKENS).layout
    charts.lecture_theme()
    big = charts.attention_heatmap(causal_softmax(rng, 1, 6)[0], TOKENS, TOKENS).layout
    assert big.width > small.width and big.height > small.height


def offline_checks(html_text):
    scripts = re.findall(r"<script[^>]*>", html_text)
    assert not [s for s in scripts if "src=" in s], scripts  # nothing fetched: no <script src=...>
    assert "cdn.plot.ly/plotly" not in html_text and "https://cdn" not in html_text.split("*/", 1)[0]
    assert html_text.count("plotly.js v") == 1  # the library's own banner, embedded once


def test_save_html_one_figure(tmp_path):
    path = charts.save_html(charts.gqa_diagram(9, 3, 64), tmp_path / "out" / "gqa.html")
    assert path.exists()
    text = path.read_text(encoding="utf-8")
    offline_checks(text)
    assert text.count('class="plotly-graph-div"') == 1


def test_save_html_several_figures_share_one_plotly(tmp_path):
    figs = [charts.gqa_diagram(9, 3, 64), charts.timing_chart([0.2, 0.03, 0.03]), charts.token_table(TOKENS, IDS)]
    text = charts.save_html(figs, tmp_path / "all.html").read_text(encoding="utf-8")
    offline_checks(text)
    assert text.count('class="plotly-graph-div"') == 3
    assert len(text) > 3_000_000  # plotly.js itself is a few MB


def test_empty_inputs_give_empty_figures():
    # The live views draw their charts before the first token exists.
    figs = [charts.token_strip([], []), charts.token_strip([], [], probs=[]), charts.token_table([], []),
            charts.distribution_chart([], [], [], top_p=0.9), charts.attention_row([], [], 0, 0),
            charts.kv_cache_chart([], [], allocated_bytes=100), charts.timing_chart([], prefill_steps=0)]
    for fig in figs:
        assert isinstance(fig, go.Figure)
        fig.to_json()  # plotly accepts what was built


# --------------------------------------------------------------------------
# Fed by the default model (SmolLM2-135M, fp32 CPU), loaded once per session
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def paris(model):
    import labkit

    enc = labkit.encode(model, "The capital of France is")
    trace = labkit.Trace()
    logits = model.forward(enc.ids, trace=trace)
    return enc, logits, trace


def test_real_tokens_strip_and_table(paris):
    enc, _, _ = paris
    assert enc.tokens == ["The", " capital", " of", " France", " is"]
    fig = charts.token_strip(enc.tokens, enc.ids)
    assert list(fig.data[0].text) == LABELS[:5]
    assert list(fig.data[0].customdata) == enc.ids.tolist()
    assert list(charts.token_table(enc.tokens, enc.ids).data[0].cells.values[0]) == enc.ids.tolist()


def test_real_attention_heatmap_and_grid(model, paris):
    enc, _, trace = paris
    layer = trace.attentions[3]                          # (heads, T, T)
    assert layer.shape == (model.config.n_heads, 5, 5)
    fig = charts.attention_heatmap(layer[0], enc.tokens, enc.tokens, layer=3, head=0)
    z = np.asarray(fig.data[0].z)
    np.testing.assert_allclose(z.sum(axis=1), 1.0, atol=1e-6)   # fp32: measured 1.2e-7 off at most
    assert np.all(z[np.triu_indices(5, 1)] == 0)         # causal: no token sees the future
    assert ticktext(fig.layout.xaxis) == LABELS[:5]
    grid = charts.attention_grid(layer, enc.tokens, layer=3)
    assert len(grid.data) == 9
    np.testing.assert_array_equal(grid.data[8].z, layer[8].numpy())   # passed through unchanged


def test_real_embeddings(paris, model):
    import labkit

    enc, _, trace = paris
    vectors = labkit.embed(model, enc.ids)               # (T, 576)
    fig = charts.embedding_heatmap(vectors, enc.tokens)
    np.testing.assert_array_equal(fig.data[0].z, vectors[:, :64].numpy())
    sim = np.asarray(charts.cosine_similarity_heatmap(trace.hidden[0], enc.tokens).data[0].z)
    assert sim.shape == (5, 5) and np.allclose(np.diag(sim), 1, rtol=0, atol=2e-6)   # measured 2.4e-7 off


def test_real_logit_lens_ends_on_paris(model, paris):
    import labkit

    enc, _, trace = paris
    top_ids, top_probs = labkit.logit_lens(model, trace, k=1)   # (L+1, T, 1) each
    words = [[model.tokenizer.decode([int(i)]) for i in row[:, 0]] for row in top_ids]
    fig = charts.logit_lens_chart(words, top_probs[..., 0], enc.tokens)
    hm = fig.data[0]
    assert np.asarray(hm.z).shape == (model.config.n_layers + 1, 5)
    assert hm.text[-1][-1] == "␣Paris"                   # the last layer's guess after " is"


def test_real_distribution_chart(paris):
    import labkit

    _, logits, _ = paris
    before = torch.softmax(logits[-1].float(), -1)
    after = labkit.distribution(logits[-1], "top_p", temperature=0.8, top_p=0.5)
    order = before.argsort(descending=True)[:15]
    labels = [f"t{int(i)}" for i in order]
    fig = charts.distribution_chart(labels, before[order], after[order], chosen=0, top_p=0.5)
    greyed = [c == charts.GREY for c in fig.data[0].marker.color]
    assert greyed == (after[order] == 0).tolist()
    assert 0 < sum(greyed) < 15                          # top-p 0.5 keeps a few, cuts the rest


def test_real_top_p_cut_is_where_the_scaled_running_total_crosses_top_p(paris):
    import labkit

    _, logits, _ = paris
    temperature, top_p = 1.1, 0.8   # keeps 8 tokens
    before = torch.softmax(logits[-1].float(), -1)
    scaled = torch.softmax(logits[-1].float() / temperature, -1)
    after = labkit.distribution(logits[-1], "top_p", temperature=temperature, top_p=top_p)
    order = before.argsort(descending=True)[:50]
    fig = charts.distribution_chart([str(int(i)) for i in order], before[order], after[order],
                                 top_p=top_p, probs_scaled=scaled[order])
    greyed = np.array([c == charts.GREY for c in fig.data[0].marker.color])
    running = np.asarray(fig.data[2].y)
    n_kept = int((~greyed).sum())
    assert 2 <= n_kept < 50 and not greyed[:n_kept].any()      # a prefix is kept, the rest cut
    assert running[n_kept - 2] < top_p <= running[n_kept - 1]   # the smallest set reaching top_p


def test_real_generation_timing_and_cache(model):
    import labkit

    gen = labkit.generate(model, "The capital of France is", max_new_tokens=3, method="greedy")
    steps = gen.steps
    fig = charts.timing_chart([s.seconds for s in steps], prefill_steps=1)
    line = next(t for t in fig.data if (t.name or "").startswith("mean decode step"))
    decode_ms = [s.seconds * 1000 for s in steps[1:]]
    assert line.y[0] == pytest.approx(sum(decode_ms) / 2)                 # the mean of the 2 decode steps
    cache = charts.kv_cache_chart([s.index for s in steps], [s.cache_nbytes for s in steps])
    y = np.asarray(cache.data[0].y) * 1e6
    # SmolLM2-135M, by hand: 2 (K, V) x 30 layers x 3 KV heads x 64 x 4 bytes (fp32) per token.
    per_token = 46_080
    np.testing.assert_allclose(np.diff(y), per_token)
    assert steps[-1].cache_len == 5 + 3 - 1                 # 5 prompt tokens, the last token not yet fed
    assert steps[-1].cache_nbytes == 7 * per_token
    cfg = model.config
    bars = charts.cache_size_comparison(cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, 7,
                                     bytes_per_value=4)
    # 9 (MHA), 3 (GQA) and 1 (MQA) KV heads
    assert list(bars.data[0].customdata) == [3 * 7 * per_token, 7 * per_token, 7 * per_token // 3]


def test_long_titles_wrap_to_the_figure_width():
    title = "One query vector at positions 0-15, rotated by RoPE: cosine similarity"
    fig = charts.cosine_similarity_heatmap(np.eye(16), [f"p{i}" for i in range(16)], title=title)
    lines = fig.layout.title.text.split("<br>")
    assert len(lines) >= 2 and " ".join(lines) == title          # wrapped, nothing lost
    assert fig.layout.margin.t > 100                              # and given room
    short = charts.cosine_similarity_heatmap(np.eye(3), ["a", "b", "c"], title="Similarity")
    assert short.layout.title.text == "Similarity"


def test_itl_chart_marks_mean_and_percentiles_by_hand():
    # 10 gaps: 1..9 ms and one 100 ms stall. Mean 14.5 ms; nearest rank p50 = 5th = 5,
    # p90 = 9th = 9, p99 = 10th = 100.
    gaps = [g / 1000 for g in (3, 1, 2, 4, 5, 6, 7, 8, 9, 100)]
    fig = charts.itl_chart(gaps, device="cpu")
    hist = fig.data[0]
    np.testing.assert_allclose(sorted(hist.x), [1, 2, 3, 4, 5, 6, 7, 8, 9, 100])
    marks = {t.name.split(" ")[0]: t.x[0] for t in fig.data[1:]}
    assert marks == pytest.approx({"mean": 14.5, "p50": 5.0, "p90": 9.0, "p99": 100.0})
    assert "10 gaps" in fig.layout.title.text and "cpu" in fig.layout.title.text
    assert len(charts.itl_chart([]).data) == 1                 # nothing to mark yet


def test_load_chart_one_line_per_policy_and_panel():
    from labkit import batching

    cost = batching.CostModel()
    load = {rate: batching.compare(batching.make_requests(n=12, rate_per_s=rate, seed=1), 4, cost)
            for rate in (1.0, 4.0)}
    fig = charts.load_chart(load, ttft_slo_s=1.0, tpot_slo_s=0.05)
    assert len(fig.data) == 3 * 2                               # three panels x two policies
    by = {(t.name, t.xaxis): t for t in fig.data}
    static_ttft = by[("static", "x2")]
    assert list(static_ttft.x) == [1.0, 4.0]
    res = load[4.0]["static"]
    assert static_ttft.y[1] == pytest.approx(res.percentile(90, res.ttfts()))
    assert by[("continuous", "x3")].y[0] == pytest.approx(load[1.0]["continuous"].goodput(1.0, 0.05))
    assert len(charts.load_chart(load).data) == 2 * 2           # no targets: no goodput panel
