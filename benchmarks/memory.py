"""Measure every notebook's peak memory, and two notebooks' kernels side by side.

    python benchmarks/memory.py                        # every notebook, then the pair; prints the table
    python benchmarks/memory.py --write                # ... and writes it into docs/memory.md
    python benchmarks/memory.py notebooks/08_*.ipynb   # some notebooks only (no pair)
    python benchmarks/memory.py --pair 07_prefill_vs_decode,08_precision
    python benchmarks/memory.py --share                # two processes loading the model: is it shared?

Each notebook runs top to bottom in a fresh kernel (nbclient, as nbval and
`jupyter nbconvert --execute` run it) while a thread reads /proc every 50 ms
(labkit.memory.Sampler):

    peak RSS      the kernel's VmHWM (kept by Linux, exact): what the notebook
                  costs when it runs alone, the mapped weights counted in full
    peak private  its largest anonymous memory (sampled): what it costs on
                  top of what other kernels share with it
    peak PSS      its largest PSS (sampled): shared pages divided among the
                  processes sharing them

The pair case keeps the first notebook's kernel alive (as JupyterLab does
when a student opens the next notebook without shutting it down), runs the
second one, and samples the PSS of both kernels plus a JupyterLab server
started for the purpose: PSS sums to what the processes cost together, the
number a container's memory limit is about.

Run it on a quiet machine where no other process maps the same weights file
(another user's kernels would take a share of it, lowering PSS): pass
`--private-cache` to copy labkit's converted model to a temporary cache folder
first.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from labkit import memory  # noqa: E402

MB = 1e6
BUDGET_MB = 900          # one notebook alone, RSS (the target; mybinder.org guarantees 1 GB)
PRIVATE_BUDGET_MB = 600  # one notebook's peak private memory: benchmarks/nbval_memory.py checks it in CI
PAIR_BUDGET_MB = 2000    # two kernels + JupyterLab (mybinder.org's limit: 2 GB)
DEFAULT_PAIR = ("07_prefill_vs_decode", "08_precision")
TABLE_START, TABLE_END = "<!-- memory table: start -->", "<!-- memory table: end -->"


def _client(path: Path):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    # allow_errors: a failing cell (nbval reports it) does not stop the measurement;
    # the table shows how many cells failed, as their memory was not all used.
    return nb, NotebookClient(nb, timeout=1800, kernel_name="python3", allow_errors=True,
                              resources={"metadata": {"path": str(path.parent)}})


def _errors(nb) -> int:
    return sum(any(o.get("output_type") == "error" for o in cell.get("outputs", [])) for cell in nb.cells)


def _kernel_pid(client) -> int:
    provisioner = getattr(client.km, "provisioner", None)
    process = getattr(provisioner, "process", None) or getattr(client.km, "kernel", None)
    return process.pid


def _run_cells(nb, client, sampler=None) -> list[dict]:
    """Run every cell; with a sampler, each code cell's peak private memory and
    how much it grew (what the cell allocated and kept, or held at its peak)."""
    cells = []
    if sampler:
        sampler.new_window()
    for index, cell in enumerate(nb.cells):
        before = sampler.sample() if sampler else None
        client.execute_cell(cell, index)
        if sampler and cell.cell_type == "code":
            peak = sampler.new_window()
            after = sampler.sample()
            cells.append({"cell": index, "peak_private": peak.anon, "before": before.anon if before else 0,
                          "after": after.anon if after else 0,
                          "source": cell.source.strip().splitlines()[0][:70] if cell.source.strip() else ""})
    return cells


def measure_notebook(path: Path) -> dict:
    """Run one notebook in a fresh kernel; its peaks, in bytes."""
    nb, client = _client(path)
    start = time.perf_counter()
    with client.setup_kernel():
        pid = _kernel_pid(client)
        with memory.Sampler([pid]) as sampler:
            cells = _run_cells(nb, client, sampler)
            end = memory.tree_memory(pid)
    return {"notebook": path.stem, "peak_rss": sampler.peak.peak_rss, "peak_pss": sampler.peak.pss,
            "peak_private": sampler.peak.anon, "end_private": end.anon if end else 0,
            "seconds": time.perf_counter() - start,
            "samples": sampler.samples, "errors": _errors(nb), "cells": cells}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_lab() -> subprocess.Popen:
    port = _free_port()
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}", "--ServerApp.token=",
           "--ServerApp.password=", f"--ServerApp.root_dir={ROOT}"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    lab = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import urllib.request

    for _ in range(240):                  # up to 2 minutes on a busy machine
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/lab", timeout=2).read()
            break
        except OSError:
            time.sleep(0.5)
    return lab


def measure_pair(first: Path, second: Path) -> dict:
    """first runs to its end and its kernel stays; second runs beside it; the
    peak of (both kernels + a JupyterLab server), by PSS."""
    lab = _start_lab()
    try:
        nb1, c1 = _client(first)
        with c1.setup_kernel():
            pid1 = _kernel_pid(c1)
            sampler = memory.Sampler([lab.pid, pid1], charge_every=5)
            with sampler:
                _run_cells(nb1, c1)
                nb2, c2 = _client(second)
                with c2.setup_kernel():
                    pid2 = _kernel_pid(c2)
                    sampler.pids.append(pid2)
                    with memory.Sampler([pid2]) as second_alone:
                        _run_cells(nb2, c2)
                    server = memory.tree_memory(lab.pid)
                    kept = memory.tree_memory(pid1)
    finally:
        lab.terminate()
        lab.wait(30)
    return {"first": first.stem, "second": second.stem, "peak_pss": sampler.peak.pss,
            "peak_charge": sampler.peak_charge,
            "peak_private": sampler.peak.anon, "peak_rss_sum": sampler.peak.peak_rss,
            "server_pss": server.pss if server else 0, "server_private": server.anon if server else 0,
            "first_kept_private": kept.anon if kept else 0, "second_peak_private": second_alone.peak.anon}


def measure_share() -> dict:
    """Two processes load the default model and generate; their RSS and PSS."""
    code = ("import labkit, sys; m = labkit.load_model(progress=False); "
            "labkit.generate(m, 'The capital of France is', 4); print('ready', flush=True); sys.stdin.read()")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) for _ in range(2)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        mems = [memory.process_memory(p.pid) for p in procs]
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(60)
    return {"rss": [m.rss for m in mems], "pss": [m.pss for m in mems], "private": [m.anon for m in mems]}


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch
    import transformers

    total = memory._kb_fields("/proc/meminfo").get("MemTotal", 0)
    return (f"{cpu}, {os.cpu_count()} cores, {total / 2**30:.0f} GiB; Python {platform.python_version()}, "
            f"torch {torch.__version__}, transformers {transformers.__version__}")


def table(results: list[dict], pairs: list[dict]) -> str:
    lines = [f"Measured {time.strftime('%Y-%m-%d')} on {machine()}.", ""]
    if results:
        lines += [f"| notebook | peak RSS (alone) | peak private | private kept at the end | "
                  f"CI budget: private <= {PRIVATE_BUDGET_MB} MB | "
                  f"RSS <= {BUDGET_MB} MB | run time |",
                  "| --- | ---: | ---: | ---: | --- | --- | ---: |"]
    for r in results:
        name = r["notebook"] + (f" ({r['errors']} cells failed)" if r.get("errors") else "")
        ci = r["peak_private"] <= PRIVATE_BUDGET_MB * MB
        lines.append(f"| {name} | {r['peak_rss'] / MB:.0f} MB | {r['peak_private'] / MB:.0f} MB | "
                     f"{r.get('end_private', 0) / MB:.0f} MB | {_yes(ci)} | "
                     f"{_yes(r['peak_rss'] <= BUDGET_MB * MB)} | {r['seconds']:.0f} s |")
    if pairs:
        lines += ["", "| pair: first kernel kept, second run beside it, + JupyterLab | peak PSS (all) | "
                      "peak private (all) | first kernel's private, kept | second's peak private | "
                      "JupyterLab server (PSS) | private + each file once | under 2 GB |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for pair in pairs:
        lines += [f"| {pair['first']} + {pair['second']} | {pair['peak_pss'] / MB:.0f} MB | "
                  f"{pair['peak_private'] / MB:.0f} MB | {pair['first_kept_private'] / MB:.0f} MB | "
                  f"{pair['second_peak_private'] / MB:.0f} MB | {pair['server_pss'] / MB:.0f} MB | "
                  f"{_charge(pair)} | {_yes(max(pair['peak_pss'], pair.get('peak_charge', 0)) <= PAIR_BUDGET_MB * MB)} |"]
    return "\n".join(lines)


def _charge(pair: dict) -> str:
    return f"{pair['peak_charge'] / MB:.0f} MB" if pair.get("peak_charge") else "not measured"


def _yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


def write_table(text: str, doc: Path = ROOT / "docs" / "memory.md") -> None:
    body = doc.read_text()
    head, _, rest = body.partition(TABLE_START)
    _, _, tail = rest.partition(TABLE_END)
    doc.write_text(f"{head}{TABLE_START}\n{text}\n{TABLE_END}{tail}")


def _notebook(name: str) -> Path:
    if name.endswith(".ipynb"):
        return Path(name).resolve()
    matches = sorted((ROOT / "notebooks").glob(f"{name}*.ipynb"))
    if not matches:
        raise SystemExit(f"no notebook matches {name!r}")
    return matches[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("notebooks", nargs="*", help="notebooks to measure (default: all, then the pair)")
    ap.add_argument("--pair", action="append",
                    help="two notebook names, comma-separated; may be repeated (default: %s and the reverse)"
                         % ",".join(DEFAULT_PAIR))
    ap.add_argument("--no-pair", action="store_true")
    ap.add_argument("--cells", type=int, default=0, metavar="N",
                    help="also print each notebook's N cells with the highest peak private memory")
    ap.add_argument("--share", action="store_true", help="only: do two processes share the weights?")
    ap.add_argument("--write", action="store_true", help="write the table into docs/memory.md")
    ap.add_argument("--json", metavar="PATH", help="also write the numbers to this JSON file")
    ap.add_argument("--from-json", metavar="PATH", help="only make the table from a --json file of an earlier run")
    ap.add_argument("--labkit", metavar="DIR", help="the kernels import labkit from DIR (another checkout, to "
                                                    "compare before and after a change); default: this one")
    ap.add_argument("--private-cache", action="store_true",
                    help="copy the converted model to a fresh cache folder first (PSS unaffected by other users)")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [args.labkit or str(ROOT), os.environ.get("PYTHONPATH")]))
    if args.private_cache:
        import labkit

        labkit.load_model(progress=False)          # converts once if needed
        tmp = Path(tempfile.mkdtemp(prefix="labkit-cache-"))
        shutil.copytree(labkit.loading.cache_dir() / "models", tmp / "models")
        os.environ["LABKIT_CACHE"] = str(tmp)

    if args.from_json:
        data = json.loads(Path(args.from_json).read_text())
        text = table(data["notebooks"], data["pairs"])
        print(text)
        if args.write:
            write_table(text)
        return 0

    if args.share:
        r = measure_share()
        print(f"two processes, each loaded the default model and generated 4 tokens:")
        for i in range(2):
            print(f"  process {i + 1}: RSS {r['rss'][i] / MB:.0f} MB, PSS {r['pss'][i] / MB:.0f} MB, "
                  f"private {r['private'][i] / MB:.0f} MB")
        print(f"  sum of PSS {sum(r['pss']) / MB:.0f} MB vs sum of RSS {sum(r['rss']) / MB:.0f} MB")
        return 0

    paths = [Path(p) for p in args.notebooks]
    if not paths and not args.pair:
        paths = sorted((ROOT / "notebooks").glob("*.ipynb"))
    results = []
    for path in paths:
        r = measure_notebook(path.resolve())
        results.append(r)
        print(f"{r['notebook']}: peak RSS {r['peak_rss'] / MB:.0f} MB, private {r['peak_private'] / MB:.0f} MB, "
              f"PSS {r['peak_pss'] / MB:.0f} MB ({r['seconds']:.0f} s, {r['errors']} cells failed)", flush=True)
        for c in sorted(r["cells"], key=lambda c: -c["peak_private"])[:args.cells]:
            print(f"    cell {c['cell']:3d}: peak private {c['peak_private'] / MB:5.0f} MB "
                  f"(+{(c['peak_private'] - c['before']) / MB:4.0f} at its peak, kept "
                  f"{(c['after'] - c['before']) / MB:+4.0f}): {c['source']}", flush=True)
    pairs = []
    if args.pair or not (args.notebooks or args.no_pair):
        for spec in args.pair or [",".join(DEFAULT_PAIR), ",".join(reversed(DEFAULT_PAIR))]:
            first, second = spec.split(",")
            pairs.append(measure_pair(_notebook(first), _notebook(second)))
            p = pairs[-1]
            print(f"pair {p['first']} + {p['second']}: peak PSS {p['peak_pss'] / MB:.0f} MB, private + files "
                  f"once {p['peak_charge'] / MB:.0f} MB", flush=True)
    text = table(results, pairs)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"notebooks": results, "pairs": pairs}, indent=1))
    if args.write:
        write_table(text)
    over = [r["notebook"] for r in results if r["peak_private"] > PRIVATE_BUDGET_MB * MB]
    over += [f"{p['first']}+{p['second']}" for p in pairs
             if max(p["peak_pss"], p["peak_charge"]) > PAIR_BUDGET_MB * MB]
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
