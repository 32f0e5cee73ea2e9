"""`--ray`: the driver checks a candidate's run folder on the shared storage against what
its task handed back over Ray's channel (written_files) and against what the driver wrote
there itself, before any decision or signature (no cluster needed: the functions that check)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from conftest import shipped, write_recipe

from quantlab.core import folder_record
from quantlab.core.errors import IntegrityError
from quantlab.core.results import FileFact, QuantizeResult
from quantlab.core.run import RunDir, StageRecord, now_iso
from quantlab.executors.ray_node import NodeOutcome, written_files
from quantlab.executors.ray_read_back import check_read_back, read_back_problems
from quantlab.recipe.file import load_recipe


def task_run(tmp_path):
    """A candidate's run folder as a task leaves it: the driver's registration, then the
    task's checkpoint, records and results."""
    run = RunDir.create(load_recipe(write_recipe(tmp_path, shipped("gptq-w4a16"))), tmp_path / "storage")
    (run.path / "registration").mkdir()
    (run.path / "registration" / "quantlab-registration.json").write_text('{"gates": []}')
    own = {"registration/quantlab-registration.json": folder_record.file_digest(
        run.path / "registration" / "quantlab-registration.json")["sha256"]}
    (run.path / "checkpoint").mkdir()
    (run.path / "checkpoint" / "model.safetensors").write_bytes(b"w" * 64)
    (run.path / "quality" / "candidate").mkdir(parents=True)
    (run.path / "quality" / "candidate" / "ql_lastword.jsonl").write_text('{"doc_id": 0, "acc": 1}\n')
    files = folder_record.digests(run.path / "checkpoint")
    run.put_stage(StageRecord(name="quantize", status="ok", started_at=now_iso(), finished_at=now_iso(),
                              duration_s=1.0, inputs_sha256="x", result=QuantizeResult(
                                  checkpoint="checkpoint", method="gptq", scheme="W4A16", layers_quantized=1,
                                  calibration=None, quantization_config={}, size_bytes=64,
                                  files={k: FileFact(**v) for k, v in files.items()}, timings={}, peak_rss_bytes=1,
                                  versions={}, model={})))
    return run, own


def test_an_untouched_folder_holds(tmp_path):
    run, own = task_run(tmp_path)
    written = written_files(run.path, run.record)
    assert "quality/candidate/ql_lastword.jsonl" in written["files"] and "run.json" in written["files"]
    assert written["checkpoint"] == {"model.safetensors": folder_record.file_digest(
        run.path / "checkpoint" / "model.safetensors")["sha256"]}
    assert not any(rel.startswith("checkpoint/") for rel in written["files"])  # the release hashes those
    assert read_back_problems(run.path, written, own) == []


@pytest.mark.parametrize("edit, said", [
    ("answers", "changed file: quality/candidate/ql_lastword.jsonl"),
    ("added", "added file: quality/candidate/planted.jsonl"),
    ("removed", "missing file: quality/candidate/ql_lastword.jsonl"),
    ("registration", "changed file: registration/quantlab-registration.json"),
    ("record", "changed file: run.json"),
])
def test_a_folder_changed_on_the_storage_is_named(tmp_path, edit, said):
    run, own = task_run(tmp_path)
    written = written_files(run.path, run.record)
    answers = run.path / "quality" / "candidate" / "ql_lastword.jsonl"
    if edit == "answers":
        answers.write_text('{"doc_id": 0, "acc": 0}\n')
    elif edit == "added":
        (answers.parent / "planted.jsonl").write_text("")
    elif edit == "removed":
        answers.unlink()
    elif edit == "registration":  # before the task ran: the task's own digest of it would be of the edit
        (run.path / "registration" / "quantlab-registration.json").write_text('{"gates": ["none"]}')
        written = written_files(run.path, run.record)
    else:  # the record's checkpoint digests, to match a swapped checkpoint
        doc = json.loads((run.path / "run.json").read_text())
        doc["stages"]["quantize"]["result"]["files"]["model.safetensors"]["sha256"] = "0" * 64
        (run.path / "run.json").write_text(json.dumps(doc))
    problems = read_back_problems(run.path, written, own)
    assert any(p.startswith(said) for p in problems), problems
    cand = SimpleNamespace(name="a", run=run)
    with pytest.raises(IntegrityError, match=said.split(": ")[1]) as err:
        check_read_back([cand], {"a": NodeOutcome("a", written=written)}, {"a": own})
    assert err.value.exit_code == 3
    if edit != "record":
        assert RunDir.open(run.path).record.status == "failed"


def test_a_task_that_failed_in_ray_is_not_read_back(tmp_path):
    run, own = task_run(tmp_path)
    (run.path / "quality" / "candidate" / "planted.jsonl").write_text("")
    check_read_back([SimpleNamespace(name="a", run=run)], {"a": NodeOutcome("a", failed="its Ray task failed")},
                      {"a": own})  # nothing to release from it: the candidate is failed already
