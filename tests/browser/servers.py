"""The servers and settings behind the browser tests: JupyterLab and Voila on
free local ports with private Jupyter folders, Chromium's flags, the paths.

A plain module (conftest.py holds the fixtures), so labpage.py and the test
files import from it by a name no other folder uses."""

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
    """Voila showing a copy of `notebook` (its folder copied alongside) at /, started
    from the repository root as `make dashboard` is, so a voila.json there and
    templates under share/jupyter/ apply here too."""
    root = copy_notebooks(home, notebook.parent)
    env = jupyter_env(home)
    if (REPO / "share" / "jupyter").is_dir():
        env["JUPYTER_PATH"] = os.pathsep.join(p for p in (str(REPO / "share" / "jupyter"),
                                                          env.get("JUPYTER_PATH")) if p)
    cmd = [*python_module("voila"), "--no-browser", f"--port={(port := free_port())}", "--Voila.ip=127.0.0.1",
           "--Voila.port_retries=0", "--show_tracebacks=True", str(root / notebook.name)]
    return Server("Voila", cmd, port, "/voila/static/voila.js", env, REPO, ARTIFACTS / "voila.log")
