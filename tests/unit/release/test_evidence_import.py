"""quantlab decide's evidence: what the command line may name, the copies the run judges
(hashed as copied, links refused), and `verify --evidence` against the manifest's record."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from quantlab.core.errors import RecipeError
from quantlab.core.evidence import Evidence
from quantlab.release import evidence_stage
from quantlab.release.evidence_check import check_evidence
from quantlab.release.stage import imported_evidence


def _lm_eval_folder(root: Path, stamp: str = "2026-12-01T10-00-00.000001") -> Path:
    model = root / "my__model"
    model.mkdir(parents=True)
    (model / f"results_{stamp}.json").write_text('{"results": {}, "configs": {}}')
    (model / f"samples_arith_{stamp}.jsonl").write_text('{"doc_id": 0}\n')
    return root


def _ctx(tmp_path: Path, evidence: Evidence, **sections) -> SimpleNamespace:
    run = SimpleNamespace(path=tmp_path / "run")
    run.path.mkdir()
    artifacts: list[tuple[str, str]] = []
    recipe = SimpleNamespace(**{"stability": None, "serve": SimpleNamespace(targets=[]), "quality": None,
                                "performance": None, **sections})
    return SimpleNamespace(run=run, evidence=evidence, progress=lambda m: None, artifacts=artifacts,
                           add_artifact=lambda rel, role: artifacts.append((rel, role)), recipe=recipe,
                           loaded=SimpleNamespace(path=tmp_path / "recipe.yaml"))


@pytest.mark.parametrize("sections, field", [
    ({"stability": object()}, "stability"),
    ({"serve": SimpleNamespace(targets=["cpu-avx2"])}, "serve.targets"),
    ({"performance": object()}, "performance"),  # a check whose evidence was not given: never dropped silently
])
def test_a_check_imported_files_cannot_judge_is_refused(tmp_path, sections, field):
    base, cand = _lm_eval_folder(tmp_path / "b"), _lm_eval_folder(tmp_path / "c")
    ctx = _ctx(tmp_path, Evidence.given(baseline_evals=base, candidate_evals=cand), quality=object(), **sections)
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


def test_the_run_judges_copies_hashed_as_copied(tmp_path):
    base, cand = _lm_eval_folder(tmp_path / "b"), _lm_eval_folder(tmp_path / "c")
    bench = [tmp_path / f"{r}{i}.json" for r in "bc" for i in (1, 2)]
    for i, p in enumerate(bench):
        p.write_text(f'{{"n": {i}}}')
    ev = Evidence.given(baseline_evals=base, candidate_evals=cand, baseline_bench=bench[:2], candidate_bench=bench[2:])
    ctx = _ctx(tmp_path, ev)
    evidence_stage.preflight(ctx)
    result = evidence_stage.run(ctx)
    assert len(result.files) == 8
    for f in result.files:  # each digest is of the copy, which holds the original's bytes
        copy = ctx.run.path / f.copied
        assert f.sha256 == hashlib.sha256(copy.read_bytes()).hexdigest() == \
            hashlib.sha256(Path(f.source).read_bytes()).hexdigest()
    assert result.bench["candidate"] == ["evidence/candidate/benchmark/1-c1.json",
                                         "evidence/candidate/benchmark/2-c2.json"]  # the order given: the repeats
    assert (ctx.run.path / result.evals["baseline"] / "my__model").is_dir()
    assert len(ctx.artifacts) == 8
    evidence_stage.run(ctx)  # a resume imports anew over the earlier copies
    record = imported_evidence(result, None)
    assert record["checkpoint"] is None and len(record["files"]) == 8


def test_a_link_among_the_evidence_is_refused(tmp_path):
    base, cand = _lm_eval_folder(tmp_path / "b"), _lm_eval_folder(tmp_path / "c")
    secret = tmp_path / "secret.jsonl"
    secret.write_text("key\n")
    os.symlink(secret, cand / "my__model" / "samples_other_2026-12-01T10-00-00.000001.jsonl")
    ctx = _ctx(tmp_path, Evidence.given(baseline_evals=base, candidate_evals=cand))
    with pytest.raises(RecipeError, match="a link") as err:
        evidence_stage.preflight(ctx)
    assert err.value.field == "--candidate-evals"


def test_a_folder_without_lm_eval_output_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    ctx = _ctx(tmp_path, Evidence.given(baseline_evals=tmp_path / "empty", candidate_evals=tmp_path / "empty"))
    with pytest.raises(RecipeError, match="no lm-eval output"):
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
