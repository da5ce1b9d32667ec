"""Every notebook, run in JupyterLab in headless Chromium, as a student would.

For each notebooks/NN_name.ipynb: open it (no "Select Kernel" dialog may
appear), run all cells, wait until no cell shows [*], and check that

- no cell ended in an error and no traceback shows on the page;
- at least the expected number of plotly charts and of controls rendered;
- moving a slider or clicking a button changes a chart in the same view;
- the page asked nothing of any host but this machine (plotly.js, the widget
  JavaScript and the fonts come from the local install), checked only together
  with proof that the page loaded (its JavaScript and a kernel websocket answered,
  every cell ran, the charts rendered): a page that never loaded asks nothing too.

A screenshot of each notebook after the run (and of each view after the
interaction) is saved to artifacts/browser/ for a person to look at.

Each notebook runs once per session (the first test that needs it); the other
tests read the same report. EXPECT below lists, per notebook, what must render
and which interaction to try: a new notebook needs a line there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from servers import NOTEBOOKS
from labpage import Click, MustRender, PageReport, Slide, Type, offline_problems, run_in_jupyterlab

pytestmark = pytest.mark.browser


@dataclass(frozen=True)
class Expect:
    charts: int = 0                 # at least this many plotly charts
    controls: int = 0               # at least this many sliders / buttons / dropdowns / text boxes
    interactions: tuple = ()        # tried in order; each must change a chart in its view


EXPECT: dict[str, Expect] = {
    # LiveGeneration: a step redraws tokens, distribution, attention row and KV cache
    "00_overview": Expect(charts=7, controls=10, interactions=(Click("step", changes=4),)),
    # TokenizerView: typing redraws the token strip and the table
    "01_tokenization": Expect(charts=6, controls=2, interactions=(Type("text", " Berlin", changes=2),)),
    # PositionExplorer(rope=False): the position moves the mark on the sinusoidal table
    "02_embeddings_positions": Expect(charts=4, controls=2, interactions=(Slide("position", changes=1),)),
    # PositionExplorer (RoPE is taught here): the position moves the marks on both charts;
    # AttentionExplorer: the layer redraws the head pattern and the grid; the head, the pattern
    "03_attention": Expect(charts=13, controls=4, interactions=(Slide("position", changes=2),
                                                               Slide("layer", changes=2), Slide("head"))),
    "04_forward_pass": Expect(charts=2),
    # SamplingExplorer: temperature re-filters the distribution; sample marks a bar
    "05_sampling": Expect(charts=9, controls=16, interactions=(Slide("temperature"), Click("sample"))),
    # LiveGeneration, then PromptLengthExplorer (a shorter prompt: TTFT point and cache bars)
    "06_kv_cache": Expect(charts=10, controls=12, interactions=(Click("step", changes=4),
                                                              Slide("prompt length (tokens)", -4, changes=2))),
    "07_prefill_vs_decode": Expect(charts=5),
    "08_precision": Expect(charts=1),
    "09_faster_decoding": Expect(charts=2),
    "10_serving": Expect(charts=3),
    # the lecture dashboard: a step redraws all five charts
    "11_dashboard": Expect(charts=5, controls=13, interactions=(Click("step", changes=5),)),
}

NAMES = sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def code_cells(name: str) -> int:
    """Code cells with something in them in notebooks/<name>.ipynb: all must run."""
    cells = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())["cells"]
    return sum(c["cell_type"] == "code" and bool("".join(c["source"]).strip()) for c in cells)


def must_render(name: str) -> MustRender:
    """What the run of `name` must show (EXPECT, every code cell ran, a kernel answered)."""
    expect = EXPECT.get(name, Expect())
    return MustRender(charts=expect.charts, controls=expect.controls, cells=code_cells(name))


class LabRuns:
    """Runs each notebook once, when a test first asks for it."""

    def __init__(self, browser, server):
        self.browser, self.server = browser, server
        self.reports: dict[str, PageReport] = {}

    def __call__(self, name: str) -> PageReport:
        if name not in self.reports:
            expect = EXPECT.get(name, Expect())
            self.reports[name] = run_in_jupyterlab(self.browser, self.server, name, expect.interactions)
        return self.reports[name]


@pytest.fixture(scope="session")
def lab_run(browser, lab_server, request):
    runs = LabRuns(browser, lab_server)
    request.config._labkit_browser_reports = runs.reports        # for the timing summary
    return runs


def ran(report: PageReport) -> None:
    """Fail early (with the reason) when the notebook could not be run at all."""
    shots = ", ".join(str(p) for p in report.screenshots)
    if report.dialogs:
        pytest.fail(f"a dialog appeared in JupyterLab: {report.dialogs} (screenshot: {shots})", pytrace=False)
    if report.unfinished:
        pytest.fail(f"{report.unfinished} (screenshot: {shots})", pytrace=False)


def test_every_notebook_has_an_expectation():
    missing = [n for n in NAMES if n not in EXPECT]
    assert not missing, (f"add a line for {missing} to EXPECT in {__file__}: how many charts and controls "
                         "its run must show, and which slider or button to try")


@pytest.mark.parametrize("name", NAMES)
def test_runs_without_errors(lab_run, name):
    report = lab_run(name)
    ran(report)
    assert not report.errors, f"{name}: " + "\n".join(report.errors)


@pytest.mark.parametrize("name", NAMES)
def test_charts_and_controls_render(lab_run, name):
    report = lab_run(name)
    ran(report)
    expect = EXPECT.get(name, Expect())
    assert report.charts >= expect.charts, (
        f"{name}: {report.charts} plotly charts rendered, expected at least {expect.charts}; "
        f"titles: {report.titles}; JS errors: {report.page_errors[:5]}")
    assert not report.blank, (
        f"{name}: charts {report.blank} (of {report.charts}, counted from the top) show plotly's empty "
        f"placeholder: the figure never reached the page. JS errors: {sorted(set(report.page_errors))[:3]}")
    assert report.controls >= expect.controls, (
        f"{name}: {report.controls} controls rendered, expected at least {expect.controls}")


@pytest.mark.parametrize("name", [n for n in NAMES if EXPECT.get(n, Expect()).interactions])
def test_controls_change_the_charts(lab_run, name):
    report = lab_run(name)
    ran(report)
    failed = [f"{r.action}: {r.problem}" for r in report.interactions if not r.ok]
    hint = ""
    if any("Failed to initialize model" in e for e in report.page_errors):
        hint = ("\n(anywidget reported 'Failed to initialize model': a FigureWidget took more than "
                "anywidget's 2 s to start, and it then ignores every update from Python)")
    assert not failed, f"{name}: " + "\n".join(failed) + hint


@pytest.mark.parametrize("name", NAMES)
def test_makes_no_outside_requests(lab_run, name):
    """No request left this machine, from a page that did load: its JavaScript and
    every code cell ran, a kernel answered over its websocket, and the charts and
    controls of EXPECT rendered (a blank page leaves an empty request log too)."""
    problems = offline_problems(lab_run(name), must_render(name))
    assert not problems, f"{name}: " + "\n".join(problems)
