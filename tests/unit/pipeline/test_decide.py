"""`quantlab decide` as users call it, on real lm-eval logs and benchmark files
(tests/data/imported/): the decision, its records and the release over a checkpoint, and
each bad input refused before any work (exit 2, naming the file and the field)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from quantlab.core.fsutil import sha256_file

DATA = REPO / "tests" / "data" / "imported"
BASE_EVALS, CAND_EVALS = DATA / "lmeval" / "baseline", DATA / "lmeval" / "candidate"
BENCH = DATA / "bench"
BASE_BENCH, CAND_BENCH = BENCH / "vllm-bench-baseline.json", BENCH / "vllm-bench-candidate.json"
REPEATS = ((BASE_BENCH, BENCH / "vllm-bench-baseline-2.json"), (CAND_BENCH, BENCH / "vllm-bench-candidate-2.json"))
TASKS = ["ql_knowledge_mc", "ql_lastword", "ql_arithmetic"]


def recipe(tmp_path: Path, **changes) -> Path:
    # the lm-eval logs name the baseline by its folder, the benchmark files by the name it was served under
    doc = {"name": "decide-test", "model": {"source": "tiny-llama-seed0"}, "serve": {"served_model_name": "tiny-llama"},
           "quantization": {"method": "rtn", "scheme": "W4A16", "group_size": 64},
           "quality": {"tasks": TASKS, "limit": 12, "kl": {"enabled": False},
                       "gates": {"min_samples": 10}},
           "performance": {"workloads": [{"name": "chat", "concurrency": [4], "num_requests": 24}]}}
    for section, value in changes.items():
        doc[section] = value
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def decide(tmp_path: Path, recipe_path: Path, *args, evals=(BASE_EVALS, CAND_EVALS),
           bench=REPEATS) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "quantlab", "decide", str(recipe_path), "--runs-dir", str(tmp_path / "runs")]
    if evals:
        cmd += ["--baseline-evals", str(evals[0]), "--candidate-evals", str(evals[1])]
    for option, files in zip(("--baseline-bench", "--candidate-bench"), bench or ()):
        for f in files:
            cmd += [option, str(f)]
    env = {**os.environ, "QUANTLAB_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run(cmd + [str(a) for a in args], capture_output=True, text=True, timeout=120, env=env)


def only_run(tmp_path: Path) -> Path:
    (run,) = (tmp_path / "runs" / "decide-test").iterdir()
    return run


def test_a_decision_on_imported_logs_and_benchmarks_is_recorded_unsigned(tmp_path):
    r = decide(tmp_path, recipe(tmp_path))
    assert r.returncode == 1, r.stderr[-3000:]  # 12 items a task show no non-inferiority: not shown
    assert "release not shown" in r.stderr and "nothing signed" in r.stderr
    run = only_run(tmp_path)
    record = json.loads((run / "run.json").read_text())
    assert list(record["stages"]) == ["evidence", "quality", "performance", "release"]
    q = record["stages"]["quality"]["result"]
    assert sorted(t["task"] for t in q["tasks"]) == sorted(TASKS) and all(t["n"] == 12 for t in q["tasks"])
    mc = next(t for t in q["tasks"] if t["task"] == "ql_knowledge_mc")
    # the logs' own aggregate: lm-eval's acc of each role over the same 12 documents
    results = {role: json.loads(next((DATA / "lmeval" / role).rglob("results_*.json")).read_text())
               for role in ("baseline", "candidate")}
    assert mc["baseline"] == pytest.approx(results["baseline"]["results"]["ql_knowledge_mc"]["acc,none"])
    assert mc["candidate"] == pytest.approx(results["candidate"]["results"]["ql_knowledge_mc"]["acc,none"])
    assert any("imported lm-eval sample logs" in n for n in q["notes"])
    perf = record["stages"]["performance"]["result"]
    assert not perf["interleaved"] and [p["point"] for p in perf["points"]] == ["c4"]
    assert perf["points"][0]["baseline"]["requests"] == 24 and any("did not interleave" in n for n in perf["notes"])
    manifest = json.loads((run / "quantlab-manifest.json").read_text())
    assert manifest["checkpoint_files"] == {} and manifest["model"]["kind"] == "named"
    files = manifest["evidence"]["files"]
    assert {f["sha256"] for f in files if f["kind"] == "benchmark"} == {sha256_file(p) for r in REPEATS for p in r}
    assert len(files) == 12  # the results file and the 3 judged tasks' samples files a role (not ql_chat's), 4 repeats
    assert {f["source"] for f in files if f["kind"] == "lm-eval" and f["role"] == "baseline"} == \
        {str(p) for p in BASE_EVALS.rglob("*") if p.name.startswith("results_") or
         any(p.name.startswith(f"samples_{t}_") for t in TASKS)}
    assert manifest["hardware"]["imported"] and manifest["runtime"]["baseline"]["lm-eval"][0]["lm_eval"] == "0.4.13"
    assert not (run / "quantlab-manifest.sig").exists()
    assert record["stages"]["release"]["result"]["signed"] is False


def test_a_release_over_a_named_checkpoint_is_signed_and_verifies_with_its_evidence(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    (ckpt / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    r = decide(tmp_path, recipe(tmp_path), "--checkpoint", ckpt)
    assert r.returncode == 1, r.stderr[-3000:]
    released = only_run(tmp_path) / "checkpoint"
    manifest = json.loads((released / "quantlab-manifest.json").read_text())
    assert "model.safetensors" in manifest["checkpoint_files"] and "user's statement" in manifest["evidence"]["checkpoint"]
    from quantlab.release.signing_key import local_public_key

    verify = [sys.executable, "-m", "quantlab", "verify", str(released), "--allow-blocked", "--allow-dev-key",
              "--public-key", str(local_public_key())]
    ok = subprocess.run(verify + ["--evidence", str(CAND_BENCH), "--evidence", str(CAND_EVALS)],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # the candidate's 4 recorded lm-eval files (given as its folder), one of its 2 benchmark repeats, and any
    # baseline file with the same bytes (the two tiny models answer ql_arithmetic alike)
    given = {sha256_file(CAND_BENCH)} | {sha256_file(p) for p in CAND_EVALS.rglob("*.json*")}
    matched = sum(f["sha256"] in given for f in manifest["evidence"]["files"])
    assert matched >= 5 and f"evidence: {matched} of the 12 recorded file(s) matched" in ok.stdout, ok.stdout
    other = tmp_path / "other.json"
    other.write_text(CAND_BENCH.read_text().replace('"completed"', '"completed" ', 1))
    bad = subprocess.run(verify + ["--evidence", str(other)], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "none of the 12 files" in bad.stderr


@pytest.mark.parametrize("case, field", [
    ("kl gate", "quality.kl"),
    ("one role's evals", "--candidate-evals"),
    ("another model's baseline", "config.model_args"),
    ("a task the logs lack", None),
    ("a point the recipe lacks", "--baseline-bench"),
    ("unequal repeats", "--candidate-bench"),
    ("one file as two repeats", "--baseline-bench"),
    ("the baseline's files as the candidate's", "--candidate-evals"),
    ("two tools at one point", "--candidate-bench"),
    ("another model's benchmark", "--baseline-bench"),
    ("a benchmark without per-request rows", "--save-detailed"),
    ("an empty benchmark file", "empty"),
    ("logs of another limit", "limit"),
    ("quality at load", "load_quality"),
])
def test_bad_input_is_refused_before_any_work(tmp_path, case, field):
    path, kw = recipe(tmp_path), {}
    if case == "kl gate":
        path = recipe(tmp_path, quality={"tasks": TASKS, "kl": {"max_mean_kl": 0.01}})
    elif case == "one role's evals":
        kw["evals"] = None
        r = subprocess.run([sys.executable, "-m", "quantlab", "decide", str(path), "--baseline-evals", str(BASE_EVALS),
                            "--runs-dir", str(tmp_path / "runs")], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and field in r.stderr and not (tmp_path / "runs").exists()
        return
    elif case == "another model's baseline":
        path = recipe(tmp_path, model={"source": "org/some-other-model"})
    elif case == "a task the logs lack":
        path = recipe(tmp_path, quality={"tasks": [*TASKS, "ql_code"], "kl": {"enabled": False},
                                         "allow_code_execution": True, "code_sandbox": "unsandboxed"})
    elif case == "a point the recipe lacks":
        path = recipe(tmp_path, performance={"workloads": [{"name": "chat", "concurrency": [8]}]})
    elif case == "unequal repeats":
        kw["bench"] = (REPEATS[0], REPEATS[1][:1])
    elif case == "one file as two repeats":
        kw["bench"] = ((BASE_BENCH, BASE_BENCH), REPEATS[1])
    elif case == "the baseline's files as the candidate's":
        kw["evals"] = (BASE_EVALS, BASE_EVALS)
    elif case == "two tools at one point":
        kw["bench"] = (REPEATS[0], (CAND_BENCH, BENCH / "guidellm-concurrent4.json"))
    elif case == "another model's benchmark":
        path = recipe(tmp_path, serve={"served_model_name": "another-model"})
    elif case == "a benchmark without per-request rows":
        kw["bench"] = (REPEATS[0], (CAND_BENCH, BENCH / "vllm-bench-without-detailed.json"))
    elif case == "an empty benchmark file":
        (tmp_path / "empty.json").write_text("")
        kw["bench"] = (REPEATS[0], (CAND_BENCH, tmp_path / "empty.json"))
    elif case == "quality at load":  # answers at a load need a served model
        path = recipe(tmp_path, load_quality={"items": 40})
    elif case == "logs of another limit":  # the candidate's log cut to fewer documents by its own --limit
        cand = tmp_path / "cand"
        shutil.copytree(CAND_EVALS, cand)
        (results,) = cand.rglob("results_*.json")
        doc = json.loads(results.read_text())
        doc["config"]["limit"] = 10
        results.write_text(json.dumps(doc))
        kw["evals"] = (BASE_EVALS, cand)
    r = decide(tmp_path, path, **kw)
    assert r.returncode == 2, r.stderr[-2000:]
    assert field is None or field in r.stderr, r.stderr[-2000:]
    if case == "a task the logs lack":
        assert "ql_code" in r.stderr
    # refused in the preflight: no stage ran, nothing was judged
    for run in (tmp_path / "runs").glob("*/*"):
        assert not json.loads((run / "run.json").read_text())["stages"]


def test_a_metric_the_logs_do_not_hold_is_refused_before_any_work(tmp_path):
    path = recipe(tmp_path, quality={"suites": [], "hub_tasks": [
        {"task": "ql_knowledge_mc", "metric": "exact_match", "slice": "knowledge", "higher_is_better": True}],
        "kl": {"enabled": False}})
    r = decide(tmp_path, path)
    assert r.returncode == 2 and "metric 'exact_match'" in r.stderr and "acc" in r.stderr, r.stderr[-2000:]


def test_the_shipped_decide_recipe_holds_only_what_imported_files_can_show():
    """The recipe docs/decide.md and its GPU workflow use: no check that needs a served model."""
    from quantlab.recipe.file import load_recipe

    r = load_recipe(REPO / "recipes" / "decide-gpu-w4a16.yaml").recipe
    assert r.stability is None and not r.serve.targets and not r.quality.traffic and r.quality.samples == "all"
    assert r.quality.kl.max_mean_kl is None and r.quality.kl.min_same_top_rate is None
    assert r.performance.repeats == 4 and [w.concurrency for w in r.performance.workloads] == [[8]]


def test_one_roles_tasks_in_two_lm_eval_runs_are_judged_as_one(tmp_path):
    """lm-eval runs chat tasks apart (local-chat-completions): a role may give two outputs."""
    runs = DATA / "lmeval" / "baseline-two-runs"
    cmd = ["--baseline-evals", str(runs / "run-1"), "--baseline-evals", str(runs / "run-2")]
    r = decide(tmp_path, recipe(tmp_path), "--candidate-evals", str(CAND_EVALS), *cmd, evals=None)
    assert r.returncode == 1, r.stderr[-3000:]
    record = json.loads((only_run(tmp_path) / "run.json").read_text())
    q = record["stages"]["quality"]["result"]
    assert sorted(t["task"] for t in q["tasks"]) == sorted(TASKS) and all(t["n"] == 12 for t in q["tasks"])
    # the same model's answers as its one-run log: the same scores
    for sub in ("one", "both"):
        (tmp_path / sub).mkdir()
    one = decide(tmp_path / "one", recipe(tmp_path / "one"))
    assert one.returncode == 1
    (single,) = (tmp_path / "one" / "runs" / "decide-test").iterdir()
    again = {t["task"]: t["baseline"] for t in
             json.loads((single / "run.json").read_text())["stages"]["quality"]["result"]["tasks"]}
    assert {t["task"]: t["baseline"] for t in q["tasks"]} == again
    assert len(record["stages"]["evidence"]["result"]["evals"]["baseline"]) == 2
    # a task in both runs of a role, or in neither, is refused
    both = decide(tmp_path / "both", recipe(tmp_path / "both"), "--candidate-evals", str(CAND_EVALS),
                  "--baseline-evals", str(BASE_EVALS), *cmd, evals=None)
    assert both.returncode == 2 and "give one run a task" in both.stderr


def test_a_decide_run_cannot_be_resumed_as_a_run(tmp_path):
    """Its folder holds imported evidence and no stages of a run: resuming it would quantize and
    serve into a decision's record."""
    assert decide(tmp_path, recipe(tmp_path)).returncode == 1
    run = only_run(tmp_path)
    r = subprocess.run([sys.executable, "-m", "quantlab", "run", str(tmp_path / "recipe.yaml"), "--resume", str(run),
                        "--runs-dir", str(tmp_path / "runs")], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "QUANTLAB_CACHE_DIR": str(tmp_path / "cache")})
    assert r.returncode == 2 and "decision on imported evidence" in r.stderr, r.stderr[-2000:]
    assert list(json.loads((run / "run.json").read_text())["stages"]) == ["evidence", "quality", "performance",
                                                                          "release"]
