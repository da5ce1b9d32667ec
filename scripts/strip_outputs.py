"""Strip outputs and run-time metadata from .ipynb files, in place.

Usage: python scripts/strip_outputs.py notebooks/*.ipynb

Notebooks are committed without outputs: CI runs them (nbval), so stored
outputs would only go stale. This removes cell outputs and execution counts,
per-cell timing metadata, and saved widget state, and makes sure the notebook
names the `python3` kernel. A file is rewritten only when something changed,
so its modification time (which `jupytext --sync` reads) stays put otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
CELL_RUNTIME_KEYS = ("execution", "ExecuteTime", "collapsed", "scrolled", "autoscroll")


def strip(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        for key in CELL_RUNTIME_KEYS:
            cell.metadata.pop(key, None)
    nb.metadata.pop("widgets", None)  # ipywidgets state: large and machine-specific
    if nb.metadata.get("kernelspec", {}).get("name") != "python3":
        nb.metadata["kernelspec"] = dict(KERNELSPEC)
    return nb


def main(paths: list[str]) -> int:
    for name in paths:
        path = Path(name)
        before = path.read_text(encoding="utf-8")
        nb = strip(nbformat.reads(before, as_version=4))
        after = nbformat.writes(nb) + "\n"
        if after != before:
            path.write_text(after, encoding="utf-8")
            print(f"stripped {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
