"""Run the test suite against each broken variant of labkit; every one must fail.

    python scripts/check_broken_variants.py                 # every variant
    python scripts/check_broken_variants.py mv_returns_zeros kl_is_three_times_reverse

For each variant in tests/broken_variants.py this runs
`pytest <the test files named for it> --broken <variant> -x` and prints
whether a test failed (caught) and which one. A variant that passes every
test is a hole in the suite: the script then exits 1. It takes a few
minutes (each run loads the default model once).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from broken_variants import VARIANTS  # noqa: E402


def run(name: str) -> tuple[bool, str, float]:
    """(caught, first failing test or why not, seconds)."""
    v = VARIANTS[name]
    cmd = [sys.executable, "-m", "pytest", *v.tests, "--broken", name, "-x", "-q", "-p", "no:cacheprovider",
           "-m", "not browser"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    text = out.stdout + out.stderr
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", text, flags=re.M)
    if out.returncode == 1 and failed:
        return True, failed[0], seconds
    if out.returncode == 0:
        return False, "every test passed", seconds
    # Exit codes other than 1 (usage error, nothing collected) are not a catch.
    return False, f"pytest exited {out.returncode}: {text.strip().splitlines()[-1] if text.strip() else ''}", seconds


def main(argv: list[str]) -> int:
    names = argv or list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        print(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    holes = 0
    print("| variant | broken on purpose | caught by | seconds |")
    print("| --- | --- | --- | --- |")
    for name in names:
        caught, where, seconds = run(name)
        holes += not caught
        mark = where if caught else f"**NOT CAUGHT** ({where})"
        print(f"| `{name}` | {VARIANTS[name].what} | {mark} | {seconds:.0f} |", flush=True)
    print(f"\n{len(names) - holes} of {len(names)} variants caught")
    return 1 if holes else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
