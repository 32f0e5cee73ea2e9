"""quantlab decide's evidence: what the command line may name, the copies the run judges
(hashed as copied, links refused), and `verify --evidence` against the manifest's record."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from quantlab.core.errors import RecipeError
from quantlab.core.evidence import Evidence
from quantlab.release import evidence_stage
from quantlab.release.evidence_check import check_evidence
from quantlab.release.evidence_record import evidence_record


DATA = Path(__file__).resolve().parents[2] / "data" / "imported" / "lmeval"
TASKS = ["ql_knowledge_mc", "ql_lastword"]


@pytest.fixture(autouse=True)
def _recipe_tasks(monkeypatch):
    """The recipe's quality tasks, as the stage reads them from its suites."""
    monkeypatch.setattr(evidence_stage, "judged_tasks", lambda ctx: TASKS)


def _lm_eval_folder(root: Path, role: str = "baseline") -> Path:
    """A copy of a real lm-eval output (tests/data/imported/lmeval/)."""
    shutil.copytree(DATA / role, root)
    return root


def _ctx(tmp_path: Path, evidence: Evidence, **sections) -> SimpleNamespace:
    run = SimpleNamespace(path=tmp_path / "run")
    run.path.mkdir()
    artifacts: list[tuple[str, str]] = []
    recipe = SimpleNamespace(**{"stability": None, "serve": SimpleNamespace(targets=[]), "quality": object(),
                                "performance": None, **sections})
    return SimpleNamespace(run=run, evidence=evidence, progress=lambda m: None, artifacts=artifacts,
                           add_artifact=lambda rel, role: artifacts.append((rel, role)), recipe=recipe,
                           loaded=SimpleNamespace(path=tmp_path / "recipe.yaml"))


@pytest.mark.parametrize("sections, field", [
    ({"stability": object()}, "stability"),
    ({"serve": SimpleNamespace(targets=["cpu-avx2"])}, "serve.targets"),
    ({"performance": object()}, "performance"),  # a check whose evidence was not given: never dropped silently
    ({"quality": None}, "quality"),  # evidence no check reads
])
def test_a_check_imported_files_cannot_judge_is_refused(tmp_path, sections, field):
    base, cand = _lm_eval_folder(tmp_path / "b"), _lm_eval_folder(tmp_path / "c")
    ctx = _ctx(tmp_path, Evidence.given(baseline_evals=base, candidate_evals=cand), **sections)
    with pytest.raises(RecipeError) as err:
        evidence_stage.preflight(ctx)
    assert err.value.field == field and err.value.file == str(tmp_path / "recipe.yaml")


def test_both_roles_of_a_kind_are_needed(tmp_path):
    folder = _lm_eval_folder(tmp_path / "b")
    with pytest.raises(RecipeError) as err:
        Evidence.given(baseline_evals=folder)
    assert "--candidate-evals" in str(err.value) and err.value.field == "--candidate-evals"
    with pytest.raises(RecipeError, match="no evidence given"):
        Evidence.given()
    with pytest.raises(RecipeError, match="does not exist"):
        Evidence.given(baseline_bench=[tmp_path / "a.json"], candidate_bench=[tmp_path / "b.json"])


BENCH = DATA.parent / "bench"


def test_the_run_judges_copies_hashed_as_copied(tmp_path):
    base, cand = _lm_eval_folder(tmp_path / "b"), _lm_eval_folder(tmp_path / "c", "candidate")
    bench = [BENCH / f"vllm-bench-{r}.json" for r in ("baseline", "baseline-2", "candidate", "candidate-2")]
    ev = Evidence.given(baseline_evals=base, candidate_evals=cand, baseline_bench=bench[:2], candidate_bench=bench[2:])
    ctx = _ctx(tmp_path, ev, performance=object())
    evidence_stage.preflight(ctx)
    result = evidence_stage.run(ctx)
    assert len(result.files) == 10  # a results file and the 2 judged tasks' samples a role; 4 benchmark repeats
    assert not [f for f in result.files if "ql_chat" in f.source]  # a task the recipe does not judge: not evidence
    assert [f["model"] for f in result.facts["candidate"]["lm-eval"]] == ["tiny-llama-seed1"]
    assert [f["file"] for f in result.facts["baseline"]["benchmark"]] == ["1-vllm-bench-baseline.json",
                                                                         "2-vllm-bench-baseline-2.json"]
    for f in result.files:  # each digest is of the copy, which holds the original's bytes
        copy = ctx.run.path / f.copied
        assert f.sha256 == hashlib.sha256(copy.read_bytes()).hexdigest() == \
            hashlib.sha256(Path(f.source).read_bytes()).hexdigest()
    assert result.bench["candidate"] == ["evidence/candidate/benchmark/1-vllm-bench-candidate.json",
                                         "evidence/candidate/benchmark/2-vllm-bench-candidate-2.json"]  # the repeats
    assert (ctx.run.path / result.evals["baseline"][0] / "tiny-llama-seed0").is_dir()
    assert len(ctx.artifacts) == 10
    evidence_stage.run(ctx)  # a resume imports anew over the earlier copies
    record = evidence_record(result, None)
    assert record["checkpoint"] is None and len(record["files"]) == 10


def test_one_run_given_as_two_is_refused(tmp_path):
    base = _lm_eval_folder(tmp_path / "b")
    ctx = _ctx(tmp_path, Evidence.given(baseline_evals=base, candidate_evals=base))
    with pytest.raises(RecipeError, match="same bytes") as err:
        evidence_stage.preflight(ctx)
    assert err.value.field == "--candidate-evals"


def test_a_link_among_the_evidence_is_refused(tmp_path):
    base, cand = _lm_eval_folder(tmp_path / "b"), _lm_eval_folder(tmp_path / "c", "candidate")
    (samples,) = cand.rglob("samples_ql_lastword_*.jsonl")
    secret = tmp_path / "secret.jsonl"
    shutil.move(samples, secret)
    os.symlink(secret, samples)
    ctx = _ctx(tmp_path, Evidence.given(baseline_evals=base, candidate_evals=cand))
    with pytest.raises(RecipeError, match="a link") as err:
        evidence_stage.preflight(ctx)
    assert err.value.field == "--candidate-evals"


def test_a_folder_without_lm_eval_output_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    ctx = _ctx(tmp_path, Evidence.given(baseline_evals=tmp_path / "empty", candidate_evals=tmp_path / "empty"))
    with pytest.raises(RecipeError, match="no lm-eval results file"):
        evidence_stage.preflight(ctx)


def test_verify_evidence_matches_files_by_digest(tmp_path):
    good = tmp_path / "b1.json"
    good.write_text("{}")
    other = tmp_path / "c1.json"
    other.write_text('{"x": 1}')
    record = {"imported": "imported", "files": [
        {"role": "baseline", "kind": "benchmark", "source": str(good), "copied": "evidence/b/1-b1.json",
         "size": 2, "sha256": hashlib.sha256(b"{}").hexdigest()},
        {"role": "candidate", "kind": "benchmark", "source": "/elsewhere/c1.json", "copied": "evidence/c/1-c1.json",
         "size": 2, "sha256": "0" * 64}]}
    problems, notes = check_evidence(record, [good])
    assert problems == [] and "1 of the 2 recorded" in notes[0] and "candidate benchmark c1.json" in notes[1]
    problems, _ = check_evidence(record, [other])
    assert len(problems) == 1 and "none of the 2 files" in problems[0]
    problems, _ = check_evidence(None, [good])
    assert "not decided on imported evidence" in problems[0]
