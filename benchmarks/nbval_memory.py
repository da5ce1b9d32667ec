"""A pytest plugin: each notebook's peak memory, measured during the nbval run, checked against a budget.

    python -m pytest notebooks/*.ipynb --nbval-lax -p benchmarks.nbval_memory

The notebooks are executed once, by nbval, as they already are in `make
test`; this plugin only watches. When a notebook's kernel starts, a thread
samples its process tree every 100 ms (labkit.memory.Sampler); after the
notebook's last cell, before nbval shuts the kernel down, it reads:

    peak RSS      the kernel's VmHWM (exact, kept by Linux): the notebook alone,
                  memory-mapped weights counted in full
    peak private  its largest anonymous memory (sampled): what it cannot share
                  with another kernel or drop under pressure

and the last cell's teardown fails ("ERROR at teardown of ...") when a peak
is over its budget, so a notebook that starts using more memory fails CI
without running it a second time. The terminal summary prints every
notebook's numbers; LABKIT_MEMORY_JSON=path also writes them to a file.

Budgets, in MB, from the environment (docs/memory.md says why these):

    LABKIT_MEMORY_BUDGET_PRIVATE_MB   default 600: private memory is what can
                                      get a kernel killed; mapped weights are
                                      page cache, shared and reclaimable
    LABKIT_MEMORY_BUDGET_RSS_MB       default: not checked (reported)
    LABKIT_MEMORY_BUDGET=0            measure and report, never fail

Linux only: elsewhere (no /proc) it measures nothing and checks nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

MB = 1e6
DEFAULT_PRIVATE_MB = 600
DEFAULT_RSS_MB = 0          # 0: not checked

_samplers: dict[str, object] = {}      # notebook path -> Sampler
_results: dict[str, dict] = {}


def _budget(name: str, default: int) -> int:
    """The budget in bytes; 0 means none."""
    return int(os.environ.get(name, default)) * 10**6


def _kernel_pid(nbfile) -> int | None:
    kernel = getattr(nbfile, "kernel", None)
    km = getattr(kernel, "km", None)
    process = getattr(getattr(km, "provisioner", None), "process", None) or getattr(km, "kernel", None)
    return getattr(process, "pid", None)


def _is_cell(item) -> bool:
    return type(item).__name__ == "IPyNbCell"


@pytest.hookimpl(trylast=True)
def pytest_runtest_setup(item):
    """After nbval's setup (the kernel is running): watch it."""
    if not _is_cell(item) or not os.path.exists("/proc/self/smaps_rollup"):
        return
    from labkit.memory import Sampler

    key = str(item.parent.path)
    pid = _kernel_pid(item.parent)
    sampler = _samplers.get(key)
    if sampler is None and pid is not None:
        sampler = _samplers[key] = Sampler([pid], interval=0.1).__enter__()
    elif sampler is not None and pid is not None and sampler.pids != [pid]:
        sampler.pids = [pid]               # nbval restarted the kernel


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    last = _is_cell(item) and (nextitem is None or nextitem.parent is not item.parent)
    key = str(item.parent.path) if _is_cell(item) else None
    sampler = _samplers.pop(key, None) if last else None
    if sampler is not None:
        sampler.__exit__(None, None, None)      # a last sample while the kernel still runs
        peak = sampler.peak
        _results[item.parent.path.stem] = {"peak_rss": peak.peak_rss, "peak_private": peak.anon,
                                           "peak_pss": peak.pss}
    result = yield                              # nbval's teardown: the kernel stops
    if sampler is not None and os.environ.get("LABKIT_MEMORY_BUDGET", "1") != "0":
        over = []
        for what, value, budget in (
                ("peak private", peak.anon, _budget("LABKIT_MEMORY_BUDGET_PRIVATE_MB", DEFAULT_PRIVATE_MB)),
                ("peak RSS", peak.peak_rss, _budget("LABKIT_MEMORY_BUDGET_RSS_MB", DEFAULT_RSS_MB))):
            if budget and value > budget:
                over.append(f"{what} {value / MB:.0f} MB > budget {budget / MB:.0f} MB")
        if over:
            raise AssertionError(f"{item.parent.path.name} is over its memory budget: {'; '.join(over)} "
                                 "(docs/memory.md; benchmarks/memory.py --cells 5 shows which cells)")
    return result


def pytest_terminal_summary(terminalreporter):
    if not _results:
        return
    tr = terminalreporter
    tr.section("notebook memory (benchmarks/nbval_memory.py)")
    for name, r in _results.items():
        tr.write_line(f"{name:28s} peak RSS {r['peak_rss'] / MB:5.0f} MB   peak private "
                      f"{r['peak_private'] / MB:5.0f} MB   peak PSS {r['peak_pss'] / MB:5.0f} MB")
    path = os.environ.get("LABKIT_MEMORY_JSON")
    if path:
        Path(path).write_text(json.dumps(_results, indent=1))
