#!/usr/bin/env bash
# The GPU check in one command, for a bare accelerator machine (docs/benchmarks.md, "GPU").
#
#   bash scripts/gpu_check.sh OUT_DIR [options of python -m labkit.gpu_check]
#   bash scripts/gpu_check.sh "$OUT"                          # on the lent GPU machine (< 8 min)
#   bash scripts/gpu_check.sh /tmp/gpu-check --device cpu --quick   # the CPU rehearsal (about a minute)
#
# Runs from the repository root with labkit taken from the working tree (nothing to
# install, nothing downloaded), writes OUT_DIR/gpu_check.{md,json,log}, and exits with
# the check's status: 0 all passed, 1 a parity check or a cuda test failed, 2 a stage
# could not run, 124 it ran past GPU_CHECK_TIMEOUT (default 570 s; what it finished is
# written already). PYTHON picks the interpreter (default: .venv/bin/python if there,
# else python3).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
out="${1:?usage: bash scripts/gpu_check.sh OUT_DIR [options of python -m labkit.gpu_check]}"
shift
mkdir -p "$out" || exit 2

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1 OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py="${PYTHON:-}"
if [ -z "$py" ]; then
    if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py="$(command -v python3 || command -v python)"; fi
fi

{
    echo "gpu_check.sh: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uname -srm), python: $py"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    "$py" -c 'from labkit.gpu_check import CARRY_LIMIT, carried_size
s = carried_size()
print("carried with the working tree: " + ("unknown here (no git)" if s is None else
      f"{s[0]} files, {s[1] / 2**20:.1f} MiB of the {CARRY_LIMIT >> 20} MiB limit"))'
} 2>&1 | tee "$out/gpu_check.log"

device=(--device "${GPU_CHECK_DEVICE:-cuda}")        # unless the options name one
for arg in "$@"; do case "$arg" in --device|--device=*) device=() ;; esac; done
timeout -k 10 "${GPU_CHECK_TIMEOUT:-570}" \
    "$py" -m labkit.gpu_check "${device[@]}" --out "$out" "$@" 2>&1 | tee -a "$out/gpu_check.log"
rc=${PIPESTATUS[0]}
echo "gpu_check.sh: exit $rc; results in $out: gpu_check.md, gpu_check.json, gpu_check.log" | tee -a "$out/gpu_check.log"
exit "$rc"
