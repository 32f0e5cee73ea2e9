"""Only what was evaluated is signed: the release stage, driven from a recorded checkpoint
(`quantlab validate`'s real checkpoint stage, no engine), compares every file in the
checkpoint folder with the record made when the candidate was copied in. A file a check
added (a completion's `modeling_evil.py`), a changed config.json (an `auto_map`) or a
removed file stops the release with exit 3 naming the file, on a resume too; an untouched
folder is released with ordinary modes, listing the evaluated files and the release's own."""

from __future__ import annotations

import json
import os
import stat

import pytest
from conftest import shipped, write_recipe

from quantlab.core.errors import IntegrityError
from quantlab.core.layout import MANIFEST_FILE, SIGNATURE_FILE, release_owned
from quantlab.core.run import RunDir
from quantlab.pipeline.context import RunContext
from quantlab.pipeline.stage_run import guard_checkpoint, lock_checkpoint, run_stage
from quantlab.pipeline.stages import VALIDATE_STAGES, enabled
from quantlab.quantize import checkpoint_stage
from quantlab.recipe.file import load_recipe
from quantlab.release import stage as release_stage
from quantlab.release.manifest import folder_files, read_manifest


@pytest.fixture(autouse=True, scope="module")
def own_cache(tmp_path_factory):
    """One cache for the module (the SBOMs are made once, the local signing key too), none of the user's."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QUANTLAB_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


def model_folder(folder, quant_config=None):
    (folder / "tokenizer").mkdir(parents=True)
    config = {"architectures": ["LlamaForCausalLM"], **({"quantization_config": quant_config} if quant_config else {})}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(os.urandom(4096))
    (folder / "tokenizer" / "tokenizer.json").write_text("{}")
    return folder


def context(tmp_path, run=None):
    """A validate run of a checkpoint against a local baseline, as `quantlab validate` opens it."""
    base = tmp_path / "baseline"
    if not base.is_dir():
        model_folder(base)
        model_folder(tmp_path / "src", {"quant_method": "gptq", "bits": 4})
    data = shipped("gptq-w4a16")
    data["model"]["source"] = str(base)
    loaded = load_recipe(write_recipe(tmp_path, data))
    run = run or RunDir.create(loaded, tmp_path / "runs")
    ctx = RunContext(loaded, run, lambda m: None, import_from=tmp_path / "src", stages=VALIDATE_STAGES)
    ctx.enabled_stages = {s.NAME for s in VALIDATE_STAGES if enabled(s, ctx)}
    return ctx


def validated(tmp_path):
    ctx = context(tmp_path)
    checkpoint_stage.preflight(ctx)
    run_stage(ctx, checkpoint_stage)
    lock_checkpoint(ctx)  # as the run loop does once the checkpoint is recorded
    return ctx


def modes(folder):
    return {p.relative_to(folder).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in [folder, *folder.rglob("*")]}


def test_an_untouched_checkpoint_is_released_with_the_evaluated_files_and_ordinary_modes(tmp_path):
    ctx = validated(tmp_path)
    folder = ctx.checkpoint_dir
    assert set(modes(folder).values()) == {0o444, 0o555}  # read-only through the checks
    recorded = ctx.run.record.result("checkpoint").files
    assert sorted(recorded) == ["config.json", "model.safetensors", "tokenizer/tokenizer.json"]
    run_stage(ctx, release_stage)
    assert ctx.run.record.stages["release"].status == "ok"
    manifest = read_manifest(folder)
    listed = manifest.checkpoint_files
    for name, fact in recorded.items():  # the evaluated files, as recorded when they were copied in
        assert listed[name] == fact.model_dump()
    own = set(listed) - set(recorded)  # the SBOMs the release could make (none where cyclonedx-py cannot run)
    assert all(release_owned(n) for n in own), own
    assert listed == folder_files(folder)  # what verify hashes: the folder holds exactly what the manifest lists
    assert (folder / SIGNATURE_FILE).is_file()
    got = modes(folder)
    assert {m for p, m in got.items() if (folder / p).is_dir() or p == ""} == {0o755}
    assert {m for p, m in got.items() if (folder / p).is_file()} == {0o644}  # a deploy user can read it


def tampered(folder, how: str) -> str:
    """Change the folder as a process of the same user could, modes notwithstanding; the file named."""
    os.chmod(folder, 0o755)
    if how == "added":
        (folder / "modeling_evil.py").write_text("import os\nos.system('id')\n")
        return "added file: modeling_evil.py"
    if how == "changed":
        cfg = folder / "config.json"
        os.chmod(cfg, 0o644)
        data = json.loads(cfg.read_text())
        cfg.write_text(json.dumps({**data, "auto_map": {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}}))
        return "changed file: config.json"
    os.chmod(folder / "tokenizer", 0o755)
    (folder / "tokenizer" / "tokenizer.json").unlink()
    return "missing file: tokenizer/tokenizer.json"


@pytest.mark.parametrize("how", ["added", "changed", "removed"])
def test_a_checkpoint_changed_during_the_checks_is_not_released(tmp_path, how):
    ctx = validated(tmp_path)
    said = tampered(ctx.checkpoint_dir, how)
    with pytest.raises(IntegrityError, match=said) as err:
        run_stage(ctx, release_stage)
    assert err.value.exit_code == 3
    record = RunDir.open(ctx.run.path).record.stages["release"]
    assert record.status == "failed" and said in record.error and said in record.cause
    assert not (ctx.checkpoint_dir / MANIFEST_FILE).exists() and not (ctx.checkpoint_dir / SIGNATURE_FILE).exists()


def test_a_resume_hashes_the_folder_again_and_never_trusts_the_record(tmp_path):
    """Released once; the folder changed afterwards; a resume that re-releases (here: the
    release stage run again on the reopened run) refuses, naming the file."""
    ctx = validated(tmp_path)
    run_stage(ctx, release_stage)
    said = tampered(ctx.checkpoint_dir, "changed")
    resumed = context(tmp_path, RunDir.open(ctx.run.path))
    with pytest.raises(IntegrityError, match=said):
        run_stage(resumed, release_stage)
    assert RunDir.open(ctx.run.path).record.stages["release"].status == "failed"


@pytest.mark.parametrize("how", ["added", "changed", "removed"])
def test_a_resumed_run_compares_the_folder_before_any_check_reads_it(tmp_path, how):
    """The run loop's guard after the checkpoint stage: made in this invocation, the folder is
    only locked; made by an earlier one (a resume, a retried Ray task), it is hashed against
    the record first, so a folder edited between runs is never served or evaluated."""
    ctx = validated(tmp_path)
    guard_checkpoint(context(tmp_path, RunDir.open(ctx.run.path)), made_now=False)  # untouched: passes
    said = tampered(ctx.checkpoint_dir, how)
    guard_checkpoint(ctx, made_now=True)  # just made: no hashing, locked again
    assert set(modes(ctx.checkpoint_dir).values()) <= {0o444, 0o555}
    os.chmod(ctx.checkpoint_dir, 0o755)
    with pytest.raises(IntegrityError, match=said) as err:
        guard_checkpoint(context(tmp_path, RunDir.open(ctx.run.path)), made_now=False)
    assert err.value.exit_code == 3
