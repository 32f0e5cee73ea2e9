"""The stability thresholds' false-block rate, measured: two servers of the same weights
(an A/A pair), the recipe's stability probes run against both N times, each round judged
by the recipe's stability gates as a run would judge it.

    .venv/bin/python scripts/aa_stability.py [--recipe recipes/gptq-w4a16.yaml] [--rounds 20]
        [--out aa-stability.md] [--json aa-stability.json] [--journal rounds.jsonl] [--log-dir DIR]

The two servers are separate vLLM processes of the recipe's unquantized model, started
once with the recipe's engine arguments and dtype, each on cores of its own; the rounds
probe them both at once (as the stage does with `concurrent_roles`), so what differs between the two is batch
composition and timing, which is what changes greedy outputs on a CPU build. Rounds on
one pair of processes share their warm state (prefix cache, compiled graphs): they
measure the probes' own variation, not the spread between server starts, which the
whole-run A/A runs (`scripts/run_aa.py --checks stability`) sample.

Prints (and writes with --out / --json) per gate: its limit, the value in each round,
how many rounds it failed, and an exact (Clopper-Pearson) 95% upper bound on its
false-block rate from that count.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def upper_bound(failures: int, n: int, confidence: float = 0.95) -> float:
    """One-sided Clopper-Pearson upper bound on a rate from `failures` of `n`."""
    from scipy.stats import beta

    return 1.0 if failures >= n else float(beta.ppf(confidence, failures + 1, n - failures))


def start_pair(recipe, model: Path, log_dir: Path):
    from quantlab.serving.cpu_cores import engine_bind
    from quantlab.serving.plan import EngineTarget, plan_serving
    from quantlab.serving.vllm_probe import probe_for
    from quantlab.serving.vllm_server import prepare_engine, start_together

    spec = recipe.serve
    targets = [EngineTarget("baseline", model, "aa-baseline"), EngineTarget("candidate", model, "aa-candidate")]
    plan = plan_serving(spec, targets, dtype=recipe.model.dtype, probe=probe_for(spec))
    # each on cores of its own, as a side-by-side run places them (two unbound engines on
    # 2 cores took about 180 s a round, each one's threads preempting the other's)
    servers = [prepare_engine(plan, role, log_dir=log_dir, progress=print, cpu_bind=engine_bind(plan.device, slot, 2))
               for slot, role in enumerate(("baseline", "candidate"))]
    start_together(servers, print)
    return plan, dict(zip(("baseline", "candidate"), servers, strict=True))


def rounds(recipe, servers, plan, n: int, journal: Path | None = None) -> list[dict]:
    from quantlab.core.together import run_together
    from quantlab.models.tokenizer import load_tokenizer
    from quantlab.stability.gates import verdicts
    from quantlab.stability.probe_run import probe_prompts
    from quantlab.stability.stage import probe_server

    spec = recipe.stability
    tok = load_tokenizer(plan.target("baseline").model_dir, trust_remote_code=recipe.model.trust_remote_code)
    prompts, pool = probe_prompts(tok, spec.prompts)
    max_len = int(plan.engine_args["max_model_len"])
    out = []
    for i in range(1, n + 1):
        started = time.monotonic()
        stab = run_together({role: (lambda _stop, s=server: probe_server(s, spec, prompts, pool, max_len, len(tok)))
                             for role, server in servers.items()})
        gates = [{"gate": g.gate, "scope": g.scope, "value": g.value, "limit": g.limit, "verdict": g.verdict,
                  "evidence": g.evidence} for g in verdicts(stab, spec)]
        out.append({"round": i, "seconds": round(time.monotonic() - started, 1), "gates": gates})
        if journal is not None:  # one line a round, appended as it ends: a deadline loses no round
            with journal.open("a") as f:
                f.write(json.dumps(out[-1], default=str) + "\n")
        failed = [f"{g['gate']}@{g['scope']}" for g in gates if g["verdict"] != "pass"]
        values = ", ".join(f"{g['gate']} {g['value']}" for g in gates)
        print(f"round {i}/{n}: {out[-1]['seconds']} s, not passed: {failed or 'none'}; {values}", flush=True)
    return out


def table(results: list[dict], header: str) -> str:
    n = len(results)
    names = sorted({(g["gate"], g["scope"]) for r in results for g in r["gates"]})
    lines = [header, "", "| gate | limit | value per round (distinct values: count) | not passed | 95% upper bound |",
             "|---|---|---|---|---|"]
    for gate, scope in names:
        rows = [g for r in results for g in r["gates"] if (g["gate"], g["scope"]) == (gate, scope)]
        values: dict[str, int] = {}
        for g in rows:
            key = "-" if g["value"] is None else f"{g['value']:.4g}" if isinstance(g["value"], float) else str(g["value"])
            values[key] = values.get(key, 0) + 1
        bad = sum(1 for g in rows if g["verdict"] != "pass")
        shown = ", ".join(f"{v}: {c}" for v, c in sorted(values.items()))
        lines.append(f"| {gate}@{scope} | {rows[0]['limit']} | {shown} | {bad} of {len(rows)} | "
                     f"{upper_bound(bad, len(rows)):.3f} |")
    blocked = sum(1 for r in results if any(g["verdict"] == "fail" for g in r["gates"]))
    lines += ["", f"rounds with any stability gate failed: {blocked} of {n} "
              f"(95% upper bound {upper_bound(blocked, n):.3f}); median round "
              f"{sorted(r['seconds'] for r in results)[n // 2]} s"]
    return "\n".join(lines) + "\n"


def main() -> int:
    from quantlab.recipe.file import load_recipe
    from scripts.run_aa import baseline_dir

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", type=Path, default=REPO / "recipes" / "gptq-w4a16.yaml")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--log-dir", type=Path)
    ap.add_argument("--journal", type=Path, help="append each round's gates here as a JSON line when it ends")
    args = ap.parse_args()
    recipe = load_recipe(args.recipe).recipe
    if recipe.stability is None:
        print(f"{args.recipe}: no stability section to measure", file=sys.stderr)
        return 2
    model = baseline_dir(args.recipe)
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = args.log_dir or Path(tmp)
        plan, servers = start_pair(recipe, model, log_dir)
        try:
            results = rounds(recipe, servers, plan, args.rounds, args.journal)
        finally:
            for server in servers.values():
                server.stop()
    header = (f"Stability A/A: {args.recipe.name}, {model.name} against itself on two servers "
              f"(dtype {plan.engine_args.get('dtype')}), {args.rounds} rounds; "
              f"{platform.processor() or platform.machine()}")
    text = table(results, header)
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.json:
        args.json.write_text(json.dumps({"header": header, "rounds": results}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
