"""What `make test` costs on this machine: the suite's wall time, set-up apart, its counts and
its ten slowest tests, with the CPU kind named (the figures differ by kind: docs/testing.md).

    .venv/bin/python scripts/bench_tests.py [--clone] [--out bench-tests.md] [--junit junit.xml] [-- PYTEST ARGS...]

--clone runs it as CI does: `git clone` of this checkout's HEAD into a temporary folder,
then `make setup` and the tests there (the user cache and pip cache are this machine's).
Without it, it runs in this checkout. The set-up and the tests are timed apart; pytest's
JUnit XML gives each test's time (setup, call and teardown of the test together).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cpu_kind() -> str:
    """'AMD EPYC, 2 CPUs, AVX-512 with BF16' and the like, from /proc/cpuinfo."""
    model, flags = platform.processor() or "CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    isa = ("AMX, " if "amx_tile" in flags else "") + (
        "AVX-512 with BF16" if "avx512_bf16" in flags else "AVX-512 without BF16" if "avx512f" in flags
        else "AVX2 only" if "avx2" in flags else "no AVX2")
    emulated = os.environ.get("QUANTLAB_EMULATE_CPU", "").strip().lower()
    if emulated not in ("", "0", "none", "native"):
        isa += f", emulating QUANTLAB_EMULATE_CPU={emulated} (its kernel choices, not its speed)"
    return f"{model}, {os.cpu_count()} CPUs, {isa}"


def slowest(junit: Path, n: int = 10) -> tuple[dict[str, int], list[tuple[float, str]]]:
    """(counts by outcome, the n slowest tests as (seconds, id))."""
    root = ET.parse(junit).getroot()
    counts = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
    times = []
    for case in root.iter("testcase"):
        outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        counts[{"failure": "failed"}.get(outcome, outcome)] += 1
        times.append((float(case.get("time", 0)), f"{case.get('classname')}::{case.get('name')}"))
    return counts, sorted(times, reverse=True)[:n]


def run(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, float]:
    t = time.perf_counter()
    rc = subprocess.run(cmd, cwd=cwd, env=env).returncode
    return rc, time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clone", action="store_true", help="run in a fresh clone of HEAD, as CI does")
    ap.add_argument("--out", type=Path, help="also write the Markdown here")
    ap.add_argument("--junit", type=Path, help="keep pytest's JUnit XML here (every test's time)")
    ap.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    with tempfile.TemporaryDirectory(prefix="quantlab-bench-tests-") as tmp:
        where = REPO
        if args.clone:
            where = Path(tmp) / "quantlab"
            subprocess.run(["git", "clone", "-q", str(REPO), str(where)], check=True)
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=where, capture_output=True,
                              text=True).stdout.strip()
        setup_rc, setup_s = run(["make", "setup"], where, env)
        if setup_rc != 0:
            print(f"make setup failed (exit {setup_rc})", file=sys.stderr)
            return setup_rc
        junit = Path(tmp) / "junit.xml"
        test_rc, test_s = run([str(where / ".venv/bin/python"), "-m", "pytest", f"--junitxml={junit}",
                               *args.pytest_args], where, env)
        counts, top = slowest(junit) if junit.is_file() else ({}, [])
        if args.junit and junit.is_file():
            args.junit.write_bytes(junit.read_bytes())
    lines = [f"`make test` at {head} on {cpu_kind()}" + (" (a fresh clone)" if args.clone else ""), "",
             f"- wall time: **{(setup_s + test_s) / 60:.1f} min** (set-up {setup_s:.0f} s, tests {test_s / 60:.1f} min), "
             f"pytest exit {test_rc}",
             "- " + ", ".join(f"{v} {k}" for k, v in counts.items() if v), "", "| test | s |", "|---|---|"]
    lines += [f"| `{re.sub(r'^tests[.]', '', name)}` | {s:.0f} |" for s, name in top]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return test_rc


if __name__ == "__main__":
    sys.exit(main())
