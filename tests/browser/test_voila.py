"""The lecture dashboard (notebooks/11_dashboard.ipynb) as a Voila page in headless Chromium.

What a lecturer sees after `make dashboard`: the controls render, "step"
produces a token and the charts follow, no traceback anywhere on the page, and
nothing is fetched from outside this machine. Screenshots before and after the
step are saved to artifacts/browser/.
"""

from __future__ import annotations

import pytest

from labpage import Click, MustRender, PageReport, offline_problems, run_in_voila

pytestmark = pytest.mark.browser

MIN_CHARTS = 5          # tokens, distribution, attention row, KV cache, time per step
MIN_CONTROLS = 10       # prompt, chat box, max tokens, step / run / reset, method + 4 sampling sliders
STEPS = (Click("step", changes=MIN_CHARTS), Click("step", changes=MIN_CHARTS))


@pytest.fixture(scope="session")
def dashboard(browser, voila_server, request) -> PageReport:
    report = run_in_voila(browser, voila_server, "11_dashboard", STEPS)
    request.config._labkit_voila_reports = {"11_dashboard (Voila)": report}
    return report


def loaded(report: PageReport) -> None:
    if report.unfinished:
        pytest.fail(f"{report.unfinished} (screenshot: {report.screenshots})", pytrace=False)


def test_dashboard_renders_controls_and_charts(dashboard):
    loaded(dashboard)
    assert dashboard.charts >= MIN_CHARTS, (f"{dashboard.charts} plotly charts, expected {MIN_CHARTS}: "
                                            f"{dashboard.titles}; JS errors: {dashboard.page_errors[:5]}")
    assert not dashboard.blank, (f"charts {dashboard.blank} show plotly's empty placeholder; "
                                 f"JS errors: {sorted(set(dashboard.page_errors))[:3]}")
    assert dashboard.controls >= MIN_CONTROLS, f"{dashboard.controls} controls, expected {MIN_CONTROLS}"


def test_dashboard_step_produces_a_token_and_the_charts_follow(dashboard):
    loaded(dashboard)
    for r in dashboard.interactions:
        hint = " (anywidget: 'Failed to initialize model')" if any(
            "Failed to initialize model" in e for e in dashboard.page_errors) else ""
        assert r.ok, f"{r.action}: {r.problem}{hint}"
        pairs = list(zip(r.charts_before, r.charts_after))
        strips = ([(b, a) for b, a in pairs if "generated" in b["title"].lower()]
                  or [(b, a) for b, a in pairs if "token" in b["title"].lower()])
        assert strips, f"no token chart among {r.before}"
        before, after = strips[0]
        assert len(after["text"].strip()) > len(before["text"].strip()), (
            f"{r.action}: the token chart shows no new token ({before['text']!r} -> {after['text']!r})")
    changed = {i for r in dashboard.interactions
               for i, (b, a) in enumerate(zip(r.charts_before, r.charts_after)) if b["sig"] != a["sig"]}
    assert len(changed) >= MIN_CHARTS - 1, (
        f"after {len(dashboard.interactions)} steps only charts {sorted(changed)} of "
        f"{dashboard.titles} changed")


def test_dashboard_shows_no_traceback(dashboard):
    loaded(dashboard)
    assert not dashboard.errors, "\n".join(dashboard.errors)


def test_dashboard_makes_no_outside_requests(dashboard):
    """No request left this machine, from a page that did load: Voila's JavaScript came
    from the local server, the kernel answered over its websocket, and the charts and
    controls rendered (a page that never loaded leaves an empty request log too)."""
    problems = offline_problems(dashboard, MustRender(charts=MIN_CHARTS, controls=MIN_CONTROLS))
    assert not problems, "the dashboard: " + "\n".join(problems)
