#!/usr/bin/env bash
# Keep every notebook pair in notebooks/ in sync and free of outputs.
#
#   make sync            (or: PATH=.venv/bin:$PATH bash scripts/sync_notebooks.sh)
#
# For each notebook, NN_name.py (jupytext percent format) and NN_name.ipynb:
#   1. `jupytext --sync`: the file modified last is the source of the cells;
#      a missing twin is created (the pairing comes from jupytext.toml);
#      the kernel is set to python3 in both.
#   2. outputs, execution counts and widget state are stripped from the .ipynb.
# tests/test_notebook_files.py checks the result.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v jupytext >/dev/null || { echo "jupytext not found: run 'make sync' (it installs .venv first)" >&2; exit 1; }

shopt -s nullglob
declare -A seen=()
stems=()
for f in notebooks/[!_.]*.py notebooks/[!_.]*.ipynb; do
    stem="${f%.*}"
    if [ -z "${seen[$stem]:-}" ]; then seen[$stem]=1; stems+=("$stem"); fi
done
if [ ${#stems[@]} -eq 0 ]; then echo "no notebooks in notebooks/"; exit 0; fi

for stem in "${stems[@]}"; do
    # Either twin will do: jupytext finds the other through the pairing.
    if [ -e "$stem.py" ]; then src="$stem.py"; else src="$stem.ipynb"; fi
    jupytext --quiet --sync --set-kernel python3 "$src"
done
python scripts/strip_outputs.py notebooks/[!_.]*.ipynb
echo "synced ${#stems[@]} notebook pair(s)"
