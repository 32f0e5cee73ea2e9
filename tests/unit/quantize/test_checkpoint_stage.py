"""`quantlab validate`'s checkpoint stage: the whole checkpoint is copied in (subfolders
included), hashed, and pickle weights anywhere in it are refused."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from quantlab.core.errors import RecipeError
from quantlab.quantize import checkpoint_stage


def checkpoint(folder):
    (folder / "tokenizer").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "gptq"}}))
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "tokenizer" / "tokenizer.json").write_text("{}")
    (folder / "quantlab-manifest.json").write_text("{}")  # an earlier release's: not carried over
    return folder


def context(tmp_path, src):
    artifacts = []
    return SimpleNamespace(import_from=src, checkpoint_dir=tmp_path / "run" / "checkpoint",
                           progress=lambda msg: None, add_artifact=lambda path, role: artifacts.append(path),
                           artifacts=artifacts)


def test_a_checkpoint_is_copied_whole_subfolders_included(tmp_path):
    src = checkpoint(tmp_path / "src")
    ctx = context(tmp_path, src)
    (tmp_path / "run").mkdir()
    checkpoint_stage.preflight(ctx)
    result = checkpoint_stage.run(ctx)
    assert sorted(result.files) == ["config.json", "model.safetensors", "tokenizer/tokenizer.json"]
    assert (ctx.checkpoint_dir / "tokenizer" / "tokenizer.json").read_text() == "{}"
    assert not (ctx.checkpoint_dir / "quantlab-manifest.json").exists()
    assert result.format == "gptq" and ctx.artifacts == ["checkpoint/model.safetensors"]
    assert "tokenizer/tokenizer.json" in checkpoint_stage.inputs(ctx)["files"]  # a change there redoes the stage


def test_pickle_weights_in_a_subfolder_are_refused(tmp_path):
    src = checkpoint(tmp_path / "src")
    (src / "tokenizer" / "extra.bin").write_bytes(b"pickle")
    with pytest.raises(RecipeError, match="pickle weight files"):
        checkpoint_stage.preflight(context(tmp_path, src))


def test_a_link_leading_outside_the_checkpoint_is_refused_naming_it_and_its_target(tmp_path):
    """`added_tokens.json -> <a key file>`: the key's bytes would be copied, signed and shipped."""
    src = checkpoint(tmp_path / "src")
    secret = tmp_path / "keys" / "signing.pem"
    secret.parent.mkdir()
    secret.write_text("-----BEGIN PRIVATE KEY-----\n")
    (src / "added_tokens.json").symlink_to(secret)
    ctx = context(tmp_path, src)
    with pytest.raises(RecipeError, match=r"added_tokens\.json is a link to .*signing\.pem.*outside the checkpoint") \
            as err:
        checkpoint_stage.preflight(ctx)
    assert err.value.exit_code == 2
    with pytest.raises(RecipeError, match="outside the checkpoint"):  # the stage itself refuses too, copying nothing
        checkpoint_stage.run(ctx)
    assert not ctx.checkpoint_dir.exists()


def test_a_relative_link_that_climbs_out_and_a_linked_folder_are_refused(tmp_path):
    src = checkpoint(tmp_path / "src")
    (tmp_path / "outside.json").write_text("{}")
    (src / "tokenizer" / "special_tokens_map.json").symlink_to("../../outside.json")
    with pytest.raises(RecipeError, match="outside the checkpoint"):
        checkpoint_stage.check_source(src)
    (src / "tokenizer" / "special_tokens_map.json").unlink()
    (src / "more").symlink_to(src / "tokenizer")  # a folder, even inside: not copied through
    with pytest.raises(RecipeError, match="more is a link to .*not a file inside"):
        checkpoint_stage.check_source(src)


def test_a_link_to_a_file_inside_the_checkpoint_is_copied_as_its_content(tmp_path):
    src = checkpoint(tmp_path / "src")
    (src / "tokenizer" / "tokenizer.json").write_text('{"model": "bpe"}')
    (src / "tokenizer.json").symlink_to("tokenizer/tokenizer.json")
    ctx = context(tmp_path, src)
    (tmp_path / "run").mkdir()
    checkpoint_stage.preflight(ctx)
    result = checkpoint_stage.run(ctx)
    copied = ctx.checkpoint_dir / "tokenizer.json"
    assert not copied.is_symlink() and copied.read_text() == '{"model": "bpe"}'
    assert result.files["tokenizer.json"] == result.files["tokenizer/tokenizer.json"]


def test_an_earlier_releases_files_are_not_carried_over(tmp_path):
    src = checkpoint(tmp_path / "src")
    for name in ("quantlab-manifest.sig", "quantlab-registration.json", "quantlab-attestation.intoto.jsonl"):
        (src / name).write_text("{}")
    (src / "sbom").mkdir()
    (src / "sbom" / "quantize-env.cdx.json").write_text("{}")
    ctx = context(tmp_path, src)
    (tmp_path / "run").mkdir()
    result = checkpoint_stage.run(ctx)
    assert sorted(result.files) == ["config.json", "model.safetensors", "tokenizer/tokenizer.json"]
    assert sorted(p.name for p in ctx.checkpoint_dir.iterdir()) == ["config.json", "model.safetensors", "tokenizer"]


@pytest.mark.parametrize("problem", ["missing", "outside link"])
def test_validate_refuses_a_bad_checkpoint_before_creating_anything(tmp_path, problem):
    from conftest import shipped, write_recipe

    from quantlab.pipeline.loop import run_pipeline
    from quantlab.recipe.file import load_recipe

    loaded = load_recipe(write_recipe(tmp_path / "recipes", shipped("gptq-w4a16")))
    src = tmp_path / "missing"
    if problem == "outside link":
        src = checkpoint(tmp_path / "src")
        (src / "added_tokens.json").symlink_to(tmp_path / "recipes" / "recipe.yaml")
    with pytest.raises(RecipeError, match="does not exist" if problem == "missing" else "outside the checkpoint"):
        run_pipeline(loaded, tmp_path / "runs", checkpoint=src, progress=lambda m: None)
    assert not (tmp_path / "runs").exists()  # no run folder, no run.json
