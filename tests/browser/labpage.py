"""Driving pages in the browser: run a notebook in JupyterLab, move a slider or
click a button and wait for a chart to change, screenshots, the offline log.

Used by test_jupyterlab.py and test_voila.py; the servers and the browser are
fixtures in conftest.py.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from servers import ARTIFACTS, is_local, seconds

VIEWPORT = {"width": 1280, "height": 800}     # a common projector resolution
MAX_SHOT_HEIGHT = 12000                        # Chromium's limit is 16384 px; pieces beyond this

# ----------------------------------------------------------------------------
# What the tests ask of a page
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Slide:
    """Focus the `index`-th slider labelled `label` and press ArrowRight `presses` times
    (ArrowLeft when presses < 0); a chart in the same view must change."""
    label: str
    presses: int = 3
    index: int = 0
    changes: int = 1        # at least this many charts in the view must change

    def __str__(self) -> str:
        return f"slide '{self.label}'"


@dataclass(frozen=True)
class Click:
    """Click the `index`-th button labelled `label`; a chart in the same view must change."""
    label: str
    index: int = 0
    changes: int = 1

    def __str__(self) -> str:
        return f"click '{self.label}'"


@dataclass(frozen=True)
class Type:
    """Type `text` at the end of the `index`-th text box labelled `label`; a chart in
    the same view must change."""
    label: str
    text: str
    index: int = 0
    changes: int = 1

    def __str__(self) -> str:
        return f"type {self.text!r} into '{self.label}'"


@dataclass
class Interaction:
    action: Slide | Click | Type
    ok: bool = False
    seconds: float = 0.0
    before: list[str] = field(default_factory=list)      # chart titles
    after: list[str] = field(default_factory=list)
    charts_before: list[dict] = field(default_factory=list)   # chart_state(): title, sig, text
    charts_after: list[dict] = field(default_factory=list)
    problem: str = ""


@dataclass
class PageReport:
    """What a test learned from one page."""
    name: str
    seconds: float = 0.0                  # open + run (JupyterLab) or load (Voila)
    errors: list[str] = field(default_factory=list)        # failed cells, tracebacks on the page
    dialogs: list[str] = field(default_factory=list)       # e.g. "Select Kernel"
    charts: int = 0                       # rendered plotly charts
    blank: list[int] = field(default_factory=list)   # charts that show plotly's empty placeholder
    controls: int = 0                     # sliders, buttons, dropdowns, text boxes, checkboxes
    titles: list[str] = field(default_factory=list)
    interactions: list[Interaction] = field(default_factory=list)
    outside_requests: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)    # uncaught JS errors
    console_errors: list[str] = field(default_factory=list)  # console.error lines (diagnostics only)
    screenshots: list[Path] = field(default_factory=list)
    unfinished: str = ""                  # why the run did not finish (timeout, ...)
    # What the page got from this machine: proof that it loaded at all (a page that
    # never loaded also leaves `outside_requests` empty).
    responses: list[tuple[str, int, str]] = field(default_factory=list)  # local (url, status, resource type)
    failed_requests: list[str] = field(default_factory=list)   # local requests that got no answer
    websockets: dict[str, int] = field(default_factory=dict)    # local websocket url -> frames received
    code_cells: int = 0                   # code cells in the notebook (JupyterLab only)
    executed: int = 0                     # of those, the ones with an execution count


@dataclass(frozen=True)
class MustRender:
    """What a page must have shown before its request log means anything."""
    charts: int = 0                       # at least this many plotly charts
    controls: int = 0                     # at least this many controls
    cells: int = 0                        # at least this many code cells ran (JupyterLab)
    kernel: bool = True                   # a kernel websocket connected and sent frames


def is_http(url: str) -> bool:
    return url.startswith(("http://", "https://"))


def load_problems(report: PageReport, must: MustRender) -> list[str]:
    """Why `report` is not of a page that loaded and rendered what `must` asks ([] when it is):
    the run finished, the page itself and some JavaScript came from this machine with
    2xx, a kernel websocket answered, and the charts, controls and executed cells are
    at least what `must` says."""
    problems = []
    if report.unfinished:
        problems.append(f"the run did not finish: {report.unfinished}")
    if report.dialogs:
        problems.append(f"a dialog blocked the page: {report.dialogs}")
    ok = [(u, t) for u, status, t in report.responses if is_http(u) and 200 <= status < 300]
    if not any(t == "document" for _, t in ok):
        pages = [(u, status) for u, status, t in report.responses if t == "document"]
        problems.append(f"no page came from the local server with a 2xx answer (documents: {pages[:3]}; "
                        f"failed: {report.failed_requests[:3]})")
    scripts = [u for u, t in ok if t == "script"]
    if not scripts:
        problems.append("no JavaScript came from the local server (the page's bundle never loaded)")
    if must.kernel:
        kernel = {u: n for u, n in report.websockets.items() if "/api/kernels/" in u}
        if not any(kernel.values()):
            problems.append(f"no kernel websocket connected and answered (local websockets and their "
                            f"frames received: {report.websockets or 'none'})")
    if report.charts < must.charts:
        problems.append(f"{report.charts} plotly charts rendered, expected at least {must.charts}")
    if report.controls < must.controls:
        problems.append(f"{report.controls} controls rendered, expected at least {must.controls}")
    if report.executed < must.cells:
        problems.append(f"{report.executed} of {report.code_cells} code cells ran, expected at least {must.cells}")
    return problems


def offline_problems(report: PageReport, must: MustRender) -> list[str]:
    """Why `report` does not show a page that rendered what it should while asking
    nothing of any host but this machine ([] when it does). An empty log of outside
    requests is only evidence when the page demonstrably loaded (load_problems)."""
    problems = []
    if report.outside_requests:
        problems.append(f"the page asked hosts other than this machine for: {sorted(set(report.outside_requests))}")
    problems += [f"{p} -- so its empty log of outside requests proves nothing" if not report.outside_requests
                 else p for p in load_problems(report, must)]
    return problems


# ----------------------------------------------------------------------------
# JavaScript run in the page
# ----------------------------------------------------------------------------

# A fingerprint of every plotly chart under `root`: title text and a hash of its
# SVG (hover labels left out, so a mouse passing over does not count as a change).
JS_CHARTS = r"""
(root) => {
  root = root || document;
  const hash = (s) => { let h = 5381; for (let i = 0; i < s.length; i++) h = ((h * 33) ^ s.charCodeAt(i)) >>> 0;
                        return h.toString(36) + ':' + s.length; };
  return [...root.querySelectorAll('.js-plotly-plot')].map((p) => {
    const svg = [...p.querySelectorAll('svg.main-svg')].map((s) => {
      const c = s.cloneNode(true);
      c.querySelectorAll('.hoverlayer').forEach((e) => e.remove());
      return c.innerHTML;
    }).join('|');
    const t = p.querySelector('.gtitle');
    // text drawn in the plot area and annotations (token labels, not axes)
    const text = [...p.querySelectorAll('.textpoint text, text.bartext, .annotation-text-g text')]
      .map((e) => e.textContent).join(' ');
    const title = t ? t.textContent.replace(/\u200b/g, ' ').trim() : '';
    // blank: plotly's empty placeholder (no title, no trace): the figure never reached the page
    const blank = !title && !(p.data && p.data.length) && !p.querySelector('.trace, .annotation, .shapelayer path');
    return {title, sig: hash(svg), text, blank, w: p.offsetWidth, h: p.offsetHeight};
  });
}
"""

CONTROLS = ("input[type=range], .widget-slider, .jupyter-widgets.widget-dropdown, button.jupyter-button, "
            ".widget-text, .widget-textarea, .widget-checkbox, .widget-toggle-buttons")
JS_COUNT_CONTROLS = f"() => document.querySelectorAll({CONTROLS!r}).length"

# Text in an output that means something went wrong where a student would see it.
ERROR_PATTERNS = [
    r"Traceback \(most recent call last\)",
    r"There was an error when executing cell",            # Voila without --show_tracebacks
    r"Error displaying widget",                           # ipywidgets: a view could not render
    r"Failed to (load|create) (model|view) class",
]

# The text of every output under `root`, and the error lines of labkit views (an
# HTML widget with a <details><summary>traceback</summary> block).
JS_OUTPUT_TEXT = r"""
(root) => {
  root = root || document;
  const outputs = [...root.querySelectorAll('.jp-OutputArea-output')];
  if (root.matches && root.matches('.jp-OutputArea-output')) outputs.push(root);
  const viewErrors = [...root.querySelectorAll('.widget-html details > summary')]
    .filter((s) => s.textContent.trim() === 'traceback')
    .map((s) => 'labkit view error: ' + s.closest('.widget-html').innerText.slice(0, 600));
  return outputs.map((o) => o.innerText).join('\n') + '\n' + viewErrors.join('\n');
}
"""

# Marks the `index`-th control of a kind with a label, and returns the output area around it.
JS_MARK_TARGET = r"""
([kind, label, index]) => {
  document.querySelectorAll('[data-labkit-target]').forEach((e) => e.removeAttribute('data-labkit-target'));
  let found = [];
  if (kind === 'slider') {
    found = [...document.querySelectorAll('.widget-slider')].filter((s) => {
      const l = s.querySelector('.widget-label');
      return l && l.textContent.trim() === label;
    }).map((s) => s.querySelector('.noUi-handle') || s.querySelector('input[type=range]'));
  } else if (kind === 'text') {
    found = [...document.querySelectorAll('.widget-textarea, .widget-text')].filter((s) => {
      const l = s.querySelector('.widget-label');
      return l && l.textContent.trim() === label;
    }).map((s) => s.querySelector('textarea, input'));
  } else {
    found = [...document.querySelectorAll('button')].filter((b) => b.textContent.trim() === label);
  }
  const el = found[index];
  if (!el) return {found: found.length};
  el.setAttribute('data-labkit-target', 'control');
  const scope = el.closest('.jp-OutputArea-output') || el.closest('.jp-Cell') || document.body;
  scope.setAttribute('data-labkit-target', 'scope');
  const readout = el.closest('.widget-slider') && el.closest('.widget-slider').querySelector('.widget-readout');
  return {found: found.length, readout: readout ? readout.textContent.trim() : null};
}
"""

JS_READOUT = r"""
() => {
  const c = document.querySelector('[data-labkit-target="control"]');
  const r = c && c.closest('.widget-slider') && c.closest('.widget-slider').querySelector('.widget-readout');
  return r ? r.textContent.trim() : null;
}
"""


def chart_state(page, scope=None) -> list[dict]:
    if scope is None:
        return page.evaluate(JS_CHARTS)
    return scope.evaluate(JS_CHARTS)


def count_what_rendered(page, report) -> None:
    """Errors shown in outputs, the charts (blank ones and titles) and the controls on the page."""
    report.errors += output_errors(page)
    charts = chart_state(page)
    report.charts = len(charts)
    report.blank = [i for i, c in enumerate(charts) if c["blank"]]
    report.titles = [c["title"] for c in charts]
    report.controls = page.evaluate(JS_COUNT_CONTROLS)


def output_errors(page, root=None) -> list[str]:
    """Errors shown in the outputs under `root` (the whole page by default)."""
    text = page.evaluate(JS_OUTPUT_TEXT) if root is None else root.evaluate(JS_OUTPUT_TEXT)
    return page_text_errors(text)


def page_text_errors(text: str) -> list[str]:
    found = [line for line in text.splitlines() if line.startswith("labkit view error: ")]
    for pat in ERROR_PATTERNS:
        for m in re.finditer(pat, text):
            start = text.rfind("\n", 0, m.start()) + 1        # from the start of its line
            found.append(text[start:m.end() + 800].strip())
            break
    return found


# ----------------------------------------------------------------------------
# Pages and interactions
# ----------------------------------------------------------------------------

def new_page(browser, report: PageReport, viewport=None):
    """A fresh browser context whose requests to other hosts are blocked and recorded."""
    context = browser.new_context(viewport=viewport or VIEWPORT, device_scale_factor=1,
                                  service_workers="block")

    def route(r):
        url = r.request.url
        if is_local(url):
            r.continue_()
        else:
            report.outside_requests.append(url)
            r.abort()

    context.route("**/*", route)
    page = context.new_page()

    def websocket(ws):
        if not is_local(ws.url):
            report.outside_requests.append(ws.url)
            return
        report.websockets.setdefault(ws.url, 0)

        def frame(_payload, url=ws.url):
            report.websockets[url] += 1

        ws.on("framereceived", frame)

    def response(r):
        if is_local(r.url):
            report.responses.append((r.url, r.status, r.request.resource_type))

    def failed(r):
        if is_local(r.url):
            report.failed_requests.append(f"{r.url} ({r.failure})")

    page.on("websocket", websocket)
    page.on("response", response)
    page.on("requestfailed", failed)
    page.on("pageerror", lambda e: report.page_errors.append(f"{e.name}: {e.message}"))
    page.on("console", lambda m: report.console_errors.append(m.text[:500]) if m.type == "error" else None)
    page.set_default_timeout(seconds(60) * 1000)
    return context, page


def interact(page, action: Slide | Click | Type, timeout: float | None = None) -> Interaction:
    """Do `action` and wait until a chart in the same view changes."""
    timeout = seconds(90) if timeout is None else timeout
    result = Interaction(action)
    kind = {Slide: "slider", Click: "button", Type: "text"}[type(action)]
    info = page.evaluate(JS_MARK_TARGET, [kind, action.label, action.index])
    if "readout" not in info:
        result.problem = f"no {kind} labelled '{action.label}' (found {info['found']}, wanted #{action.index + 1})"
        return result
    scope = page.locator('[data-labkit-target="scope"]')
    control = page.locator('[data-labkit-target="control"]')
    before = chart_state(page, scope.element_handle())
    result.before, result.charts_before = [c["title"] for c in before], before
    if not before:
        result.problem = f"no chart in the view around the {kind} '{action.label}'"
        return result
    control.scroll_into_view_if_needed()
    start = time.monotonic()
    if isinstance(action, Slide):
        control.focus()
        keys = ["ArrowRight", "ArrowLeft"] if action.presses >= 0 else ["ArrowLeft", "ArrowRight"]
        for key in keys:            # the other way when the slider starts at its end
            for _ in range(abs(action.presses)):
                page.keyboard.press(key)
                page.wait_for_timeout(100)
            readout = page.evaluate(JS_READOUT)
            if readout != info["readout"]:
                break
        else:
            result.problem = f"the slider '{action.label}' did not move (readout stays {readout})"
            return result
    elif isinstance(action, Type):
        control.click()
        page.keyboard.press("Control+End")
        page.keyboard.type(action.text, delay=50)
    else:
        control.click()
    deadline = start + timeout
    want = min(action.changes, len(before))
    changed: set[int] = set()
    first = None
    while time.monotonic() < deadline:
        now = chart_state(page, scope.element_handle())
        changed |= {i for i, (b, a) in enumerate(zip(before, now)) if b["sig"] != a["sig"]}
        if changed and first is None:
            first = time.monotonic() - start
        if len(changed) >= want:
            # Let the rest of the redraw land, then read the titles it ended with.
            page.wait_for_timeout(1000)
            now = chart_state(page, scope.element_handle())
            result.ok, result.seconds = True, first
            result.after, result.charts_after = [c["title"] for c in now], now
            break
        page.wait_for_timeout(250)
    else:
        result.seconds = time.monotonic() - start
        now = chart_state(page, scope.element_handle())
        result.after, result.charts_after = [c["title"] for c in now], now
        stuck = [c["title"] or "(blank chart)" for i, c in enumerate(now) if i not in changed]
        result.problem = (f"{len(changed)} of the {len(before)} charts in the view changed within "
                          f"{timeout:.0f} s of {action} (wanted {want}); unchanged: {stuck}")
    errors = output_errors(page, scope.element_handle())
    if errors:
        result.ok = False
        result.problem = (result.problem + "; " if result.problem else "") + "error shown in the view: " + errors[0]
    return result


def shoot(page, name: str, element=None) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    (element or page).screenshot(path=str(path))
    return path


def shoot_tall(page, name: str, scroller_js: str) -> list[Path]:
    """Screenshot everything in a scrolling panel: the viewport is made as tall as the
    content (in pieces of MAX_SHOT_HEIGHT px), then put back."""
    height = int(page.evaluate(f"() => ({scroller_js}).scrollHeight"))
    client = int(page.evaluate(f"() => ({scroller_js}).clientHeight"))
    chrome = VIEWPORT["height"] - client                 # menus, toolbars around the panel
    paths = []
    n = max(1, -(-height // MAX_SHOT_HEIGHT))
    piece = -(-height // n)                              # n equal pieces
    page.set_viewport_size({"width": VIEWPORT["width"], "height": piece + chrome})
    page.wait_for_timeout(1500)                          # relayout of responsive charts
    for i in range(n):
        page.evaluate(f"() => {{ ({scroller_js}).scrollTop = {i * piece}; }}")
        page.wait_for_timeout(300)
        paths.append(shoot(page, name if n == 1 else f"{name}-{i + 1}"))
    page.evaluate(f"() => {{ ({scroller_js}).scrollTop = 0; }}")
    page.set_viewport_size(VIEWPORT)
    page.wait_for_timeout(500)
    return paths


# ----------------------------------------------------------------------------
# A notebook in JupyterLab
# ----------------------------------------------------------------------------

# The notebook panel of the open document, or null while JupyterLab starts.
JS_PANEL = r"""
(path) => {
  const app = window.jupyterapp;
  if (!app || !app.shell) return null;
  const w = app.shell.currentWidget;
  if (!w || !w.context || w.context.path !== path || !w.sessionContext || !w.content) return null;
  return w;
}
"""

JS_STATE = r"""
(path) => {
  const w = (%s)(path);
  const dialogs = [...document.querySelectorAll('.jp-Dialog')].map((d) => d.innerText.trim().slice(0, 300));
  if (!w) return {ready: false, dialogs};
  const s = w.sessionContext;
  const k = s.session && s.session.kernel;
  const prompts = [...w.content.node.querySelectorAll('.jp-InputPrompt')];
  return {ready: s.isReady && !!k, kernel: k ? k.status : 'none',
          connection: k ? k.connectionStatus : 'none', dialogs,
          busy: prompts.filter((e) => e.textContent.includes('*')).length};
}
""" % JS_PANEL

# Every code cell: its number, whether it ran, its errors (from the notebook model).
JS_CELLS = r"""
(path) => {
  const w = (%s)(path);
  const cells = w.content.model.cells;
  const out = [];
  for (let i = 0; i < cells.length; i++) {
    const c = cells.get(i);
    if (c.type !== 'code') continue;
    const outputs = c.outputs.toJSON();
    out.push({index: i, count: c.executionCount, source: c.sharedModel.getSource().split('\n')[0].slice(0, 100),
              errors: outputs.filter((o) => o.output_type === 'error')
                             .map((o) => o.ename + ': ' + String(o.evalue).slice(0, 500))});
  }
  return out;
}
""" % JS_PANEL

# The element that scrolls the notebook (JupyterLab 4: the windowed panel's outer box).
SCROLLER = ("(() => { const n = window.jupyterapp.shell.currentWidget.content.node; "
            "return n.querySelector('.jp-WindowedPanel-outer') || n; })()")


def open_notebook(page, base_url: str, path: str, report: PageReport, timeout: float) -> bool:
    """Open `path` in its own workspace and wait for an idle kernel; False (and
    report.dialogs / report.unfinished) when that does not happen."""
    workspace = re.sub(r"[^A-Za-z0-9_-]", "-", path)
    page.goto(f"{base_url}/lab/workspaces/{workspace}/tree/{path}?reset", timeout=timeout * 1000)
    deadline = time.monotonic() + timeout
    state = {}
    while time.monotonic() < deadline:
        state = page.evaluate(JS_STATE, path)
        if state["dialogs"]:
            report.dialogs = state["dialogs"]
            return False
        if state.get("ready") and state.get("kernel") == "idle" and state.get("connection") == "connected":
            return True
        page.wait_for_timeout(500)
    report.unfinished = f"the notebook or its kernel was not ready within {timeout:.0f} s (last state {state})"
    return False


def run_all(page, path: str, report: PageReport, timeout: float) -> bool:
    """Run all cells; wait until the kernel is idle and no cell shows [*]."""
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_timeout(1000)
    deadline = time.monotonic() + timeout
    quiet = 0
    state = {}
    while time.monotonic() < deadline:
        state = page.evaluate(JS_STATE, path)
        if state["dialogs"]:
            report.dialogs = state["dialogs"]
            return False
        quiet = quiet + 1 if state.get("kernel") == "idle" and state.get("busy") == 0 else 0
        if quiet >= 3:
            return True
        page.wait_for_timeout(1000)
    report.unfinished = f"cells still running after {timeout:.0f} s (last state {state})"
    return False


def wait_for_charts(page, timeout: float) -> None:
    """Widgets render a moment after their cell finishes: wait until the count of
    charts and controls stops changing."""
    last, stable = None, 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and stable < 3:
        now = (page.evaluate("() => document.querySelectorAll('.js-plotly-plot').length"),
               page.evaluate(JS_COUNT_CONTROLS))
        stable = stable + 1 if now == last else 0
        last = now
        page.wait_for_timeout(1000)


def run_in_jupyterlab(browser, server, name: str, interactions=(), timeout: float | None = None) -> PageReport:
    """Open notebooks/<name>.ipynb in JupyterLab, run all cells, count what rendered,
    take a screenshot, try the interactions, shut the kernel down."""
    timeout = seconds(900) if timeout is None else timeout
    path = f"notebooks/{name}.ipynb"
    report = PageReport(name)
    context, page = new_page(browser, report)
    start = time.monotonic()
    try:
        if not open_notebook(page, server.url, path, report, seconds(180)):
            report.screenshots.append(shoot(page, f"lab-{name}-not-ready"))
            return report
        # The file browser off, so the notebook gets the width a lecturer gives it.
        page.evaluate("() => window.jupyterapp.shell.collapseLeft()")
        if not run_all(page, path, report, timeout):
            report.screenshots.append(shoot(page, f"lab-{name}-unfinished"))
            return report
        report.seconds = time.monotonic() - start
        wait_for_charts(page, seconds(60))
        cells = page.evaluate(JS_CELLS, path)
        report.code_cells = len(cells)
        report.executed = sum(c["count"] is not None for c in cells)
        for c in cells:
            for e in c["errors"]:
                report.errors.append(f"cell {c['index'] + 1} ({c['source']!r}): {e}")
        if not report.errors:
            never = [c for c in cells if c["count"] is None]
            if never:
                report.errors.append(f"{len(never)} code cell(s) never ran, first: cell {never[0]['index'] + 1} "
                                     f"({never[0]['source']!r})")
        count_what_rendered(page, report)
        report.screenshots += shoot_tall(page, f"lab-{name}", SCROLLER)
        for k, action in enumerate(interactions, 1):
            result = interact(page, action)
            report.interactions.append(result)
            if page.locator('[data-labkit-target="scope"]').count():
                label = f"{k}-" + re.sub(r"[^A-Za-z0-9]+", "-", str(action)).strip("-")
                page.set_viewport_size({"width": VIEWPORT["width"], "height": 3000})
                page.wait_for_timeout(1000)
                report.screenshots.append(
                    shoot(page, f"lab-{name}-after-{label}", page.locator('[data-labkit-target="scope"]')))
                page.set_viewport_size(VIEWPORT)
        return report
    finally:
        report.seconds = report.seconds or time.monotonic() - start
        try:
            page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.shutdown()")
        except Exception:
            pass
        context.close()
        for s in server.get_json("/api/sessions"):
            server.delete(f"/api/sessions/{s['id']}")


# ----------------------------------------------------------------------------
# A notebook as a Voila page
# ----------------------------------------------------------------------------

# The element that scrolls the page: the tallest scrollable box, else the document.
PAGE_SCROLLER = ("(() => { const c = [...document.querySelectorAll('*')].filter((e) => "
                 "e.scrollHeight > e.clientHeight + 4 && /auto|scroll/.test(getComputedStyle(e).overflowY)); "
                 "c.sort((a, b) => b.scrollHeight - a.scrollHeight); "
                 "return c[0] || document.scrollingElement; })()")

JS_VOILA_DONE = r"""
() => {
  const cells = document.querySelector('#rendered_cells');
  const loading = document.querySelector('#loading');
  const shown = (e) => e && getComputedStyle(e).display !== 'none' && e.offsetParent !== null;
  return !!document.querySelector('.jp-OutputArea') && !shown(loading) && (!cells || shown(cells)
         || getComputedStyle(cells).display !== 'none');
}
"""


def run_in_voila(browser, server, name: str, interactions=(), timeout: float | None = None) -> PageReport:
    """Open the Voila page at server.url, wait for it to render, count what rendered,
    take screenshots, try the interactions."""
    timeout = seconds(900) if timeout is None else timeout
    report = PageReport(name)
    context, page = new_page(browser, report)
    start = time.monotonic()
    try:
        # Voila runs the notebook while it sends the page: wait for the first bytes only.
        page.goto(server.url + "/", wait_until="commit", timeout=timeout * 1000)
        try:
            page.wait_for_function(JS_VOILA_DONE, timeout=timeout * 1000, polling=1000)
        except Exception as exc:  # playwright's TimeoutError
            report.unfinished = f"the Voila page did not finish rendering within {timeout:.0f} s ({exc})"
            report.screenshots.append(shoot(page, f"voila-{name}-unfinished"))
            return report
        report.seconds = time.monotonic() - start
        wait_for_charts(page, seconds(60))
        count_what_rendered(page, report)
        report.screenshots += shoot_tall(page, f"voila-{name}", PAGE_SCROLLER)
        for action in interactions:
            result = interact(page, action)
            report.interactions.append(result)
        report.screenshots.append(shoot(page, f"voila-{name}-after-interaction"))
        report.screenshots += shoot_tall(page, f"voila-{name}-after-interaction-full", PAGE_SCROLLER)
        report.errors = list(dict.fromkeys(report.errors + output_errors(page)))
        return report
    finally:
        report.seconds = report.seconds or time.monotonic() - start
        context.close()
