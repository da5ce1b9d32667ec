"""Browser tests: JupyterLab and Voila driven by headless Chromium (Python playwright).

What runs, once per test session:

- one JupyterLab server on a free local port, no token, serving a *copy* of
  notebooks/ (so nothing the browser does can save outputs into the real
  notebooks), with its own temporary config, settings and workspaces: news,
  update checks and autosave are off, and every cell is kept in the page
  (windowing off) so that charts below the fold are counted too;
- one Voila server for the lecture dashboard, started when a test first needs it;
- one headless Chromium (Debian's /usr/bin/chromium, not a playwright download),
  whose every page blocks and records requests to any host but this machine.

The browser is found at $LABKIT_CHROMIUM or /usr/bin/chromium. Without it, or
without the playwright package, the tests are skipped, except under CI=true,
where they fail: CI must run them. Screenshots and server logs are written to
artifacts/browser/ (git-ignored) for a person to look at.

Timeouts are generous (this must work on a busy 2-core machine); scale them
all with LABKIT_BROWSER_SLOW=2 (or 0.5). One notebook only: -k 05_sampling
(each notebook runs when a test first asks for it). Voila starts from the
repository root, as `make dashboard` does; LABKIT_BROWSER_DASHBOARD=path
serves another notebook as the dashboard.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from servers import (ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, NOTEBOOKS, require, seconds,
                     start_jupyterlab, start_voila)

def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "browser: runs JupyterLab / Voila in headless Chromium (slow; skip with -m 'not browser')")


@pytest.fixture(scope="session")
def playwright_module():
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        require(False, "the Python package playwright is not installed (pip install -e '.[test]')")
    return playwright.sync_api


@pytest.fixture(scope="session")
def browser(playwright_module):
    """One headless Chromium for the session (Debian's, never a download)."""
    require(os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK),
            f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium; or set LABKIT_CHROMIUM)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.glob("*.png"):          # the screenshots are of this run only
        old.unlink()
    with playwright_module.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True,
                              timeout=seconds(120) * 1000)
        yield b
        b.close()


@pytest.fixture(scope="session")
def lab_server(browser, tmp_path_factory):
    """JupyterLab serving a copy of notebooks/ (at /lab/tree/notebooks/...)."""
    server = start_jupyterlab(tmp_path_factory.mktemp("jupyterlab"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def voila_server(browser, tmp_path_factory):
    """Voila serving the lecture dashboard (a copy of notebooks/11_dashboard.ipynb) at /.
    LABKIT_BROWSER_DASHBOARD=path serves another notebook instead."""
    nb = Path(os.environ.get("LABKIT_BROWSER_DASHBOARD", NOTEBOOKS / "11_dashboard.ipynb"))
    if not nb.exists():
        pytest.fail(f"{nb} is missing: the lecture dashboard is part of the course", pytrace=False)
    server = start_voila(tmp_path_factory.mktemp("voila"), nb)
    yield server
    server.stop()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """How long each page took, and where the screenshots are."""
    reports = {}
    for attr in ("_labkit_browser_reports", "_labkit_voila_reports"):
        reports.update(getattr(config, attr, {}) or {})
    if not reports:
        return
    tr = terminalreporter
    tr.section("browser tests")
    for name, r in sorted(reports.items()):
        interactions = ", ".join(f"{i.action} {'%.1f s' % i.seconds if i.ok else 'FAILED'}" for i in r.interactions)
        tr.write_line(f"{name:<22} {r.seconds:6.1f} s  {r.charts:3d} charts  {r.controls:3d} controls"
                      + (f"  {interactions}" if interactions else ""))
        ok = [t for u, status, t in r.responses if u.startswith("http") and 200 <= status < 300]
        kernel = sum(n for u, n in r.websockets.items() if "/api/kernels/" in u)
        tr.write_line(f"{'':<22} loaded: {len(ok)} local 2xx answers ({ok.count('script')} scripts), "
                      f"{kernel} kernel websocket frames"
                      + (f", {r.executed} of {r.code_cells} code cells ran" if r.code_cells else "")
                      + (f", {len(r.failed_requests)} local requests failed" if r.failed_requests else ""))
        for e in sorted(set(r.page_errors))[:3]:
            tr.write_line(f"{'':<22} JS error: {e[:150]}")
        for e in sorted(set(r.console_errors))[:3]:
            tr.write_line(f"{'':<22} console: {e[:150]}")
        if r.blank:
            tr.write_line(f"{'':<22} blank charts (plotly placeholder): {r.blank}")
    tr.write_line(f"screenshots and server logs: {ARTIFACTS}")
