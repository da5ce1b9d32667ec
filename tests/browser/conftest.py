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
all with LABKIT_BROWSER_SLOW=2 (or 0.5).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import pytest

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
ARTIFACTS = REPO / "artifacts" / "browser"
CHROMIUM = os.environ.get("LABKIT_CHROMIUM", "/usr/bin/chromium")
SLOW = float(os.environ.get("LABKIT_BROWSER_SLOW", "1"))

# Everything that would make Chromium talk to Google or anyone else on its own.
CHROMIUM_ARGS = [
    "--no-sandbox",                     # we may run as root (CI containers)
    "--disable-gpu",
    "--disable-dev-shm-usage",          # small /dev/shm in containers
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-breakpad",
    "--disable-domain-reliability",
    "--metrics-recording-only",
    "--disable-features=Translate,OptimizationHints,MediaRouter,InterestFeedContentSuggestions,"
    "CalculateNativeWinOcclusion,AutofillServerCommunication",
]

LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}

# JupyterLab user settings for the test server (a fresh folder per session).
LAB_SETTINGS = {
    # no "would you like to receive news?" toast, no news or update fetches
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    # nothing the tests do is ever written back (the notebooks are copies anyway)
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    # keep every cell in the page, so charts below the fold exist and can be counted
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
}


def seconds(s: float) -> float:
    """A timeout, scaled by LABKIT_BROWSER_SLOW."""
    return s * SLOW


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "browser: runs JupyterLab / Voila in headless Chromium (slow; skip with -m 'not browser')")


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() == "true"


def require(ok: bool, reason: str) -> None:
    """Skip with `reason`, or fail under CI=true, where the browser tests must run."""
    if ok:
        return
    if in_ci():
        pytest.fail(f"{reason} (CI=true: the browser tests must run here; `make system-deps` "
                    "installs chromium)", pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def is_local(url: str) -> bool:
    if url.startswith(("data:", "blob:", "about:")):
        return True
    return urlparse(url).hostname in LOCAL_HOSTS


def python_module(name: str) -> list[str]:
    """Run a module with the Python running pytest (the project's .venv)."""
    return [sys.executable, "-m", name]


# ----------------------------------------------------------------------------
# Servers
# ----------------------------------------------------------------------------

class Server:
    """A local server in its own process group; its output goes to a log file."""

    def __init__(self, name: str, cmd: list[str], port: int, ready_path: str, env: dict, cwd: Path,
                 log: Path):
        self.name, self.port, self.log = name, port, log
        self.url = f"http://127.0.0.1:{port}"
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(log, "w")
        self.proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=self._log_file, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self._wait(ready_path, seconds(180))

    def _wait(self, path: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; log:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + path, timeout=10) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer {path} within {timeout:.0f} s; log:\n{self.log_tail()}")

    def get_json(self, path: str):
        with urllib.request.urlopen(self.url + path, timeout=30) as r:
            return json.load(r)

    def delete(self, path: str) -> None:
        req = urllib.request.Request(self.url + path, method="DELETE")
        try:
            urllib.request.urlopen(req, timeout=30).close()
        except OSError:
            pass

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)      # the server and the kernels it started
                self.proc.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=30)
        self._log_file.close()


def jupyter_env(home: Path) -> dict:
    """Environment for a test server: private config / data / runtime folders,
    offline model hubs, the venv's bin first on PATH (so kernels use its Python)."""
    env = dict(os.environ)
    for sub in ("config", "data", "runtime"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    env.update(
        JUPYTER_CONFIG_DIR=str(home / "config"),
        JUPYTER_DATA_DIR=str(home / "data"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
        IPYTHONDIR=str(home / "ipython"),
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
        PATH=str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""),
        PYTHONUNBUFFERED="1",
    )
    return env


def copy_notebooks(dest: Path, source: Path = NOTEBOOKS) -> Path:
    """`source` copied to dest/notebooks (what the browser changes stays in the copy)."""
    target = dest / "notebooks"
    if source.is_dir():
        shutil.copytree(source, target, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    else:
        target.mkdir(parents=True)
    return target


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


def start_jupyterlab(home: Path, notebooks: Path = NOTEBOOKS) -> Server:
    """JupyterLab serving a copy of `notebooks` at /lab/tree/notebooks/..., with its
    own settings (LAB_SETTINGS), workspaces and Jupyter folders under `home`."""
    root = home / "root"
    root.mkdir(parents=True)
    copy_notebooks(root, notebooks)
    settings = home / "settings"
    for name, values in LAB_SETTINGS.items():
        f = settings / f"{name}.jupyterlab-settings"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(values))
    (home / "workspaces").mkdir()
    port = free_port()
    cmd = [*python_module("jupyterlab"), "--no-browser", "--allow-root", f"--port={port}", "--ip=127.0.0.1",
           "--ServerApp.port_retries=0",
           "--ServerApp.token=", "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True",
           f"--ServerApp.root_dir={root}",
           "--LabApp.news_url=None",
           "--LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate",
           f"--LabApp.user_settings_dir={settings}",
           f"--LabApp.workspaces_dir={home / 'workspaces'}",
           "--LabApp.expose_app_in_browser=True",       # window.jupyterapp: run commands, read cells
           "--MappingKernelManager.cull_idle_timeout=0"]
    return Server("JupyterLab", cmd, port, "/api/status", jupyter_env(home), root, ARTIFACTS / "jupyterlab.log")


def start_voila(home: Path, notebook: Path) -> Server:
    """Voila showing a copy of `notebook` (its folder copied alongside) at /."""
    root = copy_notebooks(home, notebook.parent)
    cmd = [*python_module("voila"), "--no-browser", f"--port={(port := free_port())}", "--Voila.ip=127.0.0.1",
           "--Voila.port_retries=0", "--show_tracebacks=True", str(root / notebook.name)]
    return Server("Voila", cmd, port, "/voila/static/voila.js", jupyter_env(home), root, ARTIFACTS / "voila.log")


@pytest.fixture(scope="session")
def lab_server(browser, tmp_path_factory):
    """JupyterLab serving a copy of notebooks/ (at /lab/tree/notebooks/...)."""
    server = start_jupyterlab(tmp_path_factory.mktemp("jupyterlab"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def voila_server(browser, tmp_path_factory):
    """Voila serving the lecture dashboard (a copy of notebooks/09_dashboard.ipynb) at /.
    LABKIT_BROWSER_DASHBOARD=path serves another notebook instead."""
    nb = Path(os.environ.get("LABKIT_BROWSER_DASHBOARD", NOTEBOOKS / "09_dashboard.ipynb"))
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
        for e in sorted(set(r.page_errors))[:3]:
            tr.write_line(f"{'':<22} JS error: {e[:150]}")
        for e in sorted(set(r.console_errors))[:3]:
            tr.write_line(f"{'':<22} console: {e[:150]}")
        if r.blank:
            tr.write_line(f"{'':<22} blank charts (plotly placeholder): {r.blank}")
    tr.write_line(f"screenshots and server logs: {ARTIFACTS}")
