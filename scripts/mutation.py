"""Mutation testing of labkit's engine core, with mutmut; writes docs/mutation.md.

    .venv/bin/python scripts/mutation.py            # (make mutation) about 30-60 min on 2 cores
    .venv/bin/python scripts/mutation.py --report   # rewrite the report from the last run

A mutant is labkit with one small change (`<` for `<=`, `+ 1` for `- 1`, a
dropped argument, a string changed...). mutmut builds them for the files
listed under [tool.mutmut] in pyproject.toml and runs, for each, the fast
unit tests that reach the changed function; a test failing "kills" it. A
surviving mutant is either a hole in the tests or an equivalent mutant (a
change that cannot alter behaviour): each survivor is listed in the report
with its diff and, where it has been looked at, the reason in SURVIVORS below.

The score is (killed + timed out) / mutants of a module: a mutant that makes
the tests hang is detected too.
"""

from __future__ import annotations

import argparse
import collections
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MUTMUT = [sys.executable, "-m", "mutmut"]
TARGETS = {"labkit/sampling.py": 0.85, "labkit/kv_cache.py": 0.85}   # others: DEFAULT_TARGET
DEFAULT_TARGET = 0.75

# Survivors that were looked at, as (function pattern, changed-line pattern,
# why it survives). The first rule whose two patterns match a survivor (its
# function name, the text of its diff) explains it; "equivalent" means no
# test can tell it from the original.
RULES: list[tuple[str, str, str]] = [
    (r"", r"raise \w+Error|^`- f\"|^`- \"[^\"]*\"\)?`", "message wording: the tests match the parameter "
     "name and the allowed values in a message, not every word"),
    (r"__repr__|__str__", r"", "display text only"),
    (r"Int4Linear\.(__init__|_unpack)", r"q\[:, ::2\]|q\[:, 1::2\]|unpackable = True|>> 4|& 15|n_rows, self.in_features|"
     r"dim=", "the non-CPU int4 layout (two values a byte in row order): not reached on a CPU-only run; "
     "the GPU check of the GPU-readiness issue runs it"),
    (r"", r"on_cpu|device.type|_aligned|data_ptr|INT8_KERNEL_MAX_ROWS|INT4_KERNEL_MAX_ROWS|in_features % 16|"
     r"_LAYOUT_OK|unpackable|key = ", "kernel choice: both branches compute the same product (each is tested "
     "against the rounding formula), so taking the other one changes speed, not results"),
    (r"", r"clamp_\(", "equivalent: w / scale already lies in the clamped range (scale is max abs(w) / 127, or the "
     "group's range / 15)"),
    (r"", r"requires_grad", "equivalent: labkit runs under torch.inference_mode; no gradient is taken"),
    (r"", r"\.to\(None\)|dtype=None\)", "equivalent here: the tensor already has that dtype"),
    (r"", r"device=None|device=device|, \)`|`- [^`]*device=[^`]*` / `\+ (?![^`]*device=)|"
     r"make_generator\([^`]*, None\)", "equivalent on a CPU-only machine: the default device is the CPU "
     "(a GPU run catches it)"),
    (r"kl_divergence", r"\(\+1\)", "equivalent for (positions, vocab) logits, where dim 1 is the last"),
    (r"", r"float\(\"-INF\"\)", "equivalent: float() reads \"-INF\" as -inf"),
    (r"", r"shape\[\+2\]", "equivalent: k is 4-D, so shape[2] is shape[-2]"),
    (r"", r"as_tensor\(previous_ids, (dtype=None, )?device", "equivalent: a list of ints becomes int64 anyway"),
    (r"eos_ids", r"", "equivalent for the models tested: the tokenizer and the generation config name the "
     "same EOS token, so either source alone gives the same set"),
    (r"^(prefill|recompute)$", r"last_only", "equivalent in results: only the last position's logits are "
     "returned either way; last_only skips the LM head for the others (speed)"),
    (r"", r"`- (def \w+\(|[a-z_]+: [\w\[\]\\| .]+ = )", "a default value: the tests pass this argument "
     "explicitly (a test of each default would catch it)"),
    (r"ModelConfig.from_hf|Model.__init__", r"name|theta|rope|head_dim|tiled_block_size|load_seconds|tokenizer|n_inner",
     "a fact kept for display or another path: the forward pass reads the loaded weights and the model's own "
     "rotary frequencies, so no parity test sees it; not covered by a direct test of the config"),
    (r"^linear$", r"x\.numel\(\)", "kernel choice: matrix-vector or matrix product, the same result (tested "
     "against transformers either way)"),
    (r"^linear$", r"layer\.bias", "not covered: a 16-bit one-token step of a model with biases (Qwen2 in bf16)"),
    (r"run_blocks", r"perf_counter|seconds", "per-layer timings kept in a Trace: shown, not asserted (time)"),
    (r"rope_cos_sin", r"scale|dim=\+1", "equivalent for the models tested: attention_scaling is 1, and the "
     "angles are 2-D, so dim 1 is the last"),
    (r"_gpt2_block", r"reshape\(T", "not covered: a batched (B > 1) GPT-2 forward"),
    (r"unembed", r"norm_eps, None|, None\)", "not caught: the final norm's eps (1e-5 against the default) "
     "moves the logits by less than the parity tolerance"),
    (r"Int4Linear.forward", r"dequantize\(None\)", "equivalent for fp32 activations (the default dtype)"),
    (r"recompute|_next_logits", r"trace", "not covered: record=True with use_cache=False (the attention row of "
     "the recompute path) has no test"),
]


def run_mutmut(max_children: int) -> float:
    shutil.rmtree(ROOT / "mutants", ignore_errors=True)      # a fresh run: no stale results
    # One torch thread per child: mutmut runs one child per core.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE",
           "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    log = ROOT / "mutants-run.log"
    with open(log, "w") as out:
        done = subprocess.run([*MUTMUT, "run", "--max-children", str(max_children)], cwd=ROOT, env=env,
                              stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode:
        tail = log.read_text(errors="replace").replace("\r", "\n").strip().splitlines()[-15:]
        sys.exit(f"mutmut run failed (exit {done.returncode}); the end of {log}:\n" + "\n".join(tail))
    return time.perf_counter() - t0


def results() -> dict[str, str]:
    """Mutant name -> status ("killed", "survived", "timeout", "no tests", ...)."""
    out = subprocess.run([*MUTMUT, "results", "--all", "true"], cwd=ROOT, capture_output=True, text=True).stdout
    pairs = (line.strip().rsplit(": ", 1) for line in out.splitlines() if ": " in line)
    return {name: status for name, status in pairs if name.startswith("labkit.")}


_MODULES: dict = {}


def diff_of(name: str) -> str:
    """The changed line(s) of a mutant, as '- old / + new' (read from mutmut's
    mutants/ folder in this process: one `mutmut show` per mutant is slow)."""
    import difflib

    import libcst as cst
    from mutmut.mutation.diff_apply import read_mutant_function, read_original_function

    path = ROOT / "mutants" / module_of(name)
    if path not in _MODULES:
        _MODULES[path] = cst.parse_module(path.read_text(encoding="utf-8"))
    module = _MODULES[path]
    old, new = (cst.Module([f]).code.strip().split("\n")
                for f in (read_original_function(module, name), read_mutant_function(module, name)))
    lines = [line for line in difflib.unified_diff(old, new, lineterm="")
             if line[:1] in "-+" and not line.startswith(("---", "+++"))]
    return " / ".join(f"`{line[0]} {line[1:].strip()}`" for line in lines[:4]).replace("|", "\\|")


def why(function: str, diff: str) -> str:
    for fn_pattern, diff_pattern, reason in RULES:
        if re.search(fn_pattern, function) and re.search(diff_pattern, diff):
            return reason
    return "not yet looked at"


def module_of(name: str) -> str:
    return "labkit/" + name.split(".")[1] + ".py"


def function_of(name: str) -> str:
    base = name.split(".", 2)[2].split("__mutmut_")[0]
    return base.replace("xǁ", "").replace("ǁ", ".").removeprefix("x_")


def report(status: dict[str, str], seconds: float | None) -> tuple[str, bool]:
    by_module: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for name, s in status.items():
        by_module[module_of(name)][s] += 1
    ok = True
    lines = ["# Mutation testing of the engine core", "",
             "Generated by `python scripts/mutation.py` (mutmut "
             f"{_mutmut_version()}, {platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} cores{f', {seconds / 60:.0f} min' if seconds else ''}). "
             "Mutated files and the tests run against them: `[tool.mutmut]` in pyproject.toml.", "",
             "Score = (killed + timed out) / mutants. Targets: 85 % for sampling and the KV cache, "
             "75 % for the rest.", "",
             "| module | mutants | killed | timed out | survived | other | score | target |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for module in sorted(by_module):
        c = by_module[module]
        total = sum(c.values())
        caught = c["killed"] + c["timeout"]
        other = total - caught - c["survived"]
        score = caught / total
        target = TARGETS.get(module, DEFAULT_TARGET)
        ok &= score >= target
        lines.append(f"| {module} | {total} | {c['killed']} | {c['timeout']} | {c['survived']} | {other} | "
                     f"{score:.1%} | {target:.0%}{'' if score >= target else ' **missed**'} |")
    lines += ["", "## Survivors", "",
              "Each mutant that no test killed, with its change and, where looked at, why it survives "
              "(equivalent: no test can tell it from the original).", ""]
    for module in sorted(by_module):
        names = sorted((n for n, s in status.items()
                        if module_of(n) == module and s not in ("killed", "timeout", "not checked")),
                       key=lambda n: (function_of(n), int(n.rsplit("_", 1)[1])))
        if not names:
            continue
        lines += [f"### {module}", "", "| mutant | function | change | status | why |", "| --- | --- | --- | --- | --- |"]
        for n in names:
            diff = diff_of(n)
            lines.append(f"| {n.rsplit('__mutmut_', 1)[1]} | `{function_of(n)}` | {diff} | {status[n]} | "
                         f"{why(function_of(n), diff)} |")
        lines.append("")
    return "\n".join(lines) + "\n", ok


def _mutmut_version() -> str:
    from importlib.metadata import version
    return version("mutmut")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--report", action="store_true", help="only rewrite the report from the last run")
    p.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    p.add_argument("--out", default=str(ROOT / "docs" / "mutation.md"))
    args = p.parse_args()
    seconds = None if args.report else run_mutmut(args.max_children)
    status = results()
    if not status:
        print("no mutmut results found (run without --report first)", file=sys.stderr)
        return 2
    text, ok = report(status, seconds)
    Path(args.out).write_text(text, encoding="utf-8")
    print(text.split("## Survivors")[0])
    print(f"report written to {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
