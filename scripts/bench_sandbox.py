#!/usr/bin/env python3
"""What the code sandbox costs on the standard suite's code task: HumanEval's programs
(prompt + canonical solution + tests, as `std_humaneval` scores a perfect model's answers)
run through the real scorer (`score_humaneval`) one at a time, as lm-eval calls it, in each
sandbox this host has (bwrap, unshare) and without one (`unsandboxed`: the same child
Python, limits and deadline, no namespaces). The kinds alternate round by round on the same
items; the table gives each kind's median items/s over the rounds and its ratio to
unsandboxed, and every canonical solution must pass in every kind.

    .venv/bin/python scripts/bench_sandbox.py [--rounds 5] [--items 164]

Reads the standard suite's HumanEval data from the user cache (make setup builds it:
quantlab.core.shipped.built_suites_dir(), quality/standard_suite.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from bench_tests import cpu_kind  # noqa: E402

from quantlab.quality.sandbox import ENV_VAR, ISOLATING, probe  # noqa: E402
from quantlab.quality.standard_suite import built_copy  # noqa: E402
from quantlab.quality.suites import SHIPPED  # noqa: E402


def lscpu() -> tuple[str, str]:
    """lscpu's model name and flags."""
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    return fields.get("Model name", "?").strip(), fields.get("Flags", "?").strip()


def scorer():
    """The standard suite's utils.py, imported as lm-eval imports it."""
    spec = importlib.util.spec_from_file_location("standard_utils", SHIPPED / "standard" / "utils.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def one_pass(utils, problems: list[dict], kind: str) -> tuple[float, int]:
    """(items/s, how many passed) for the problems scored in `kind`."""
    os.environ[ENV_VAR] = kind
    started = time.perf_counter()
    passed = sum(utils.score_humaneval(p, [p["canonical_solution"]])["pass_at_1"] for p in problems)
    return len(problems) / (time.perf_counter() - started), passed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds (each kind scores every item once)")
    ap.add_argument("--items", type=int, default=164, help="the first N HumanEval problems (164: all of them)")
    args = ap.parse_args()
    data = built_copy(SHIPPED / "standard") / "data" / "humaneval.jsonl"
    if not data.is_file():
        print(f"the standard suite's HumanEval data is not built ({data} is absent): run make setup, or "
              "python scripts/build_standard_suite.py", file=sys.stderr)
        return 3
    problems = [json.loads(x) for x in data.read_text().splitlines() if x.strip()][:args.items]
    model, flags = lscpu()
    print(f"host: {cpu_kind()}\nlscpu model: {model}\nlscpu flags: {flags}\n"
          f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    kinds = [k for k in ISOLATING if probe(k) is None] + ["unsandboxed"]
    for k in ISOLATING:
        if probe(k) is not None:
            print(f"{k}: not measured here ({probe(k)})")
    utils = scorer()
    rates: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        order = kinds if r % 2 == 0 else kinds[::-1]  # alternating: no kind always goes first
        for kind in order:
            rate, passed = one_pass(utils, problems, kind)
            if passed != len(problems):
                print(f"{kind}: only {passed} of {len(problems)} canonical solutions passed", file=sys.stderr)
                return 1
            rates[kind].append(rate)
        print(f"round {r + 1}: " + ", ".join(f"{k} {rates[k][-1]:.1f} items/s" for k in kinds), flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    base = statistics.median(rates["unsandboxed"])
    print(f"\nHumanEval canonical solutions, {len(problems)} items x {args.rounds} rounds, one at a time "
          f"(all passed in every kind)\n{'kind':<12} {'median items/s':>15} {'min-max':>13} {'vs unsandboxed':>15}")
    for kind in kinds:
        med = statistics.median(rates[kind])
        print(f"{kind:<12} {med:>15.1f} {min(rates[kind]):>6.1f}-{max(rates[kind]):<6.1f} {med / base:>15.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
