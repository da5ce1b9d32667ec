"""The "no outside requests" check must not pass for a page that never loaded.

A page that never loaded (a server that answers nothing useful, a bundle that
failed, a kernel that never connected) asks nothing of other hosts either, so an
empty log of outside requests alone proves nothing. `offline_problems` (what
test_jupyterlab.py and test_voila.py assert) also asks for proof that the page
loaded and rendered. Here it is shown to reject reports of empty pages: built by
hand (no browser needed), and recorded by the real browser from a local server
that serves a page with nothing in it.
"""

from __future__ import annotations

import http.server
import threading
from dataclasses import replace

import pytest

from labpage import MustRender, PageReport, new_page, offline_problems, run_in_voila

MUST = MustRender(charts=5, controls=10, cells=4)

KERNEL_WS = "ws://127.0.0.1:8888/api/kernels/0d5c/channels?session_id=1"


def loaded_report() -> PageReport:
    """What a page that loaded and rendered leaves (the shape of a real run's report)."""
    return PageReport(
        "loaded", charts=5, controls=10, code_cells=4, executed=4,
        responses=[("http://127.0.0.1:8888/lab/tree/notebooks/x.ipynb", 200, "document"),
                   ("http://127.0.0.1:8888/static/lab/main.js", 200, "script"),
                   ("http://127.0.0.1:8888/api/kernels", 200, "fetch")],
        websockets={KERNEL_WS: 42})


def test_a_loaded_page_passes():
    assert offline_problems(loaded_report(), MUST) == []


def test_an_empty_page_fails():
    empty = PageReport("empty")
    assert not empty.outside_requests          # what the old check looked at: it passed
    problems = offline_problems(empty, MUST)
    text = "\n".join(problems)
    for missing in ("no page came from the local server", "no JavaScript", "no kernel websocket",
                    "0 plotly charts", "0 controls", "0 of 0 code cells ran"):
        assert missing in text, text
    assert all("proves nothing" in p for p in problems)


@pytest.mark.parametrize("broken, expect", [
    (dict(unfinished="the Voila page did not finish rendering within 900 s"), "did not finish"),
    (dict(dialogs=["Select Kernel"]), "dialog"),
    (dict(responses=[("http://127.0.0.1:8888/", 404, "document"),
                     ("http://127.0.0.1:8888/static/lab/main.js", 200, "script")]), "no page came"),
    (dict(responses=[("http://127.0.0.1:8888/", 200, "document")]), "no JavaScript"),
    (dict(responses=[("http://127.0.0.1:8888/", 200, "document"),
                     ("http://127.0.0.1:8888/static/lab/main.js", 500, "script")]), "no JavaScript"),
    (dict(websockets={}), "no kernel websocket"),
    (dict(websockets={KERNEL_WS: 0}), "no kernel websocket"),          # connected, never answered
    (dict(websockets={"ws://127.0.0.1:8888/api/events/subscribe": 9}), "no kernel websocket"),
    (dict(charts=4), "4 plotly charts"),
    (dict(controls=9), "9 controls"),
    (dict(executed=3), "3 of 4 code cells ran"),
    (dict(outside_requests=["https://cdn.plot.ly/plotly-2.35.2.min.js"]), "cdn.plot.ly"),
])
def test_each_missing_proof_fails(broken, expect):
    problems = offline_problems(replace(loaded_report(), **broken), MUST)
    assert len(problems) == 1 and expect in problems[0], problems


def test_a_page_without_a_kernel_need_not_have_one():
    report = replace(loaded_report(), websockets={})
    assert offline_problems(report, replace(MUST, kernel=False)) == []


# ----------------------------------------------------------------------------
# The same, recorded by the browser: a local server that serves a page with
# nothing in it (a title, one script, no notebook, no kernel).
# ----------------------------------------------------------------------------

EMPTY_PAGE = b"<!doctype html><html><head><title>nothing</title><script src='/app.js'></script></head><body></body></html>"


class EmptySite(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body, kind = {"/": (EMPTY_PAGE, "text/html"),
                      "/app.js": (b"document.title = 'still nothing';", "text/javascript")}.get(
            self.path, (b"not here", "text/plain"))
        self.send_response(200 if body != b"not here" else 404)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture()
def empty_site():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), EmptySite)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    class Site:
        url = f"http://127.0.0.1:{server.server_address[1]}"

    yield Site
    server.shutdown()
    server.server_close()


@pytest.mark.browser
def test_an_empty_voila_page_fails_in_the_browser(browser, empty_site):
    """run_in_voila pointed at a server with nothing on it: the old check (no outside
    requests) passes, offline_problems does not."""
    report = run_in_voila(browser, empty_site, "empty-site", timeout=5)
    assert report.unfinished
    assert not report.outside_requests
    assert any(t == "document" and s == 200 for _, s, t in report.responses), report.responses
    problems = offline_problems(report, MustRender(charts=5, controls=10))
    text = "\n".join(problems)
    for missing in ("did not finish", "no kernel websocket", "0 plotly charts", "0 controls"):
        assert missing in text, text


@pytest.mark.browser
@pytest.mark.parametrize("path, missing", [("/", "no kernel websocket"), ("/missing", "no page came")])
def test_an_empty_page_recorded_by_the_browser_fails(browser, empty_site, path, missing):
    report = PageReport(f"empty-site{path}")
    context, page = new_page(browser, report)
    try:
        page.goto(empty_site.url + path)
        page.wait_for_timeout(500)
    finally:
        context.close()
    assert not report.outside_requests
    problems = offline_problems(report, MustRender(charts=1, controls=1))
    assert any(missing in p for p in problems), problems
    if path == "/":     # the recording works: the page and its script were seen, with 200
        assert not any("no page came" in p or "no JavaScript" in p for p in problems), (problems, report.responses)
