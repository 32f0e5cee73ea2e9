"""Quantize stage: the recipe's model -> llm-compressor -> compressed-tensors checkpoint
in the run folder, its every file recorded (size, sha256) in the stage's result as it is
exported: what the checks serve and the release signs is compared with that record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from quantlab.core import folder_record, result_cache
from quantlab.core.stage_context import StageContext
from quantlab.models.source import model_files_identity
from quantlab.core.cpu_emulation import host_kernel_identity
from quantlab.core.errors import EngineError, IntegrityError, RecipeError
from quantlab.core.fsutil import atomic_directory, sha256_file
from quantlab.core.layout import CHECKPOINT_DIR, LOG_DIR, QUANTIZE_RESULT_FILE
from quantlab.models.source import source_fingerprint
from quantlab.core.results import FileFact, QuantizeResult

NAME = "quantize"


def inputs(ctx: StageContext) -> dict[str, Any]:
    r = ctx.recipe
    return {
        "model": r.model.model_dump(mode="json"),
        "model_source": source_fingerprint(ctx.loaded),
        "quantization": r.quantization.model_dump(mode="json"),
        "calibration": r.calibration.model_dump(mode="json") if r.calibration else None,
        # the content, not the path: an edited calibration file re-runs the stage
        "calibration_files": [sha256_file(p) for p in ctx.loaded.calibration_paths()],
    }


def _log_file(ctx: StageContext):
    return None if ctx.verbose else ctx.run.path / LOG_DIR / "llmcompressor.log"


def preflight(ctx: StageContext) -> None:
    from quantlab.quantize.llmcompressor import check_layout, llmcompressor_log

    if reuses(ctx):  # these inputs passed this check and quantized before: skip llm-compressor's import
        return
    distributed = ctx.recipe.quantization.distributed
    if distributed is not None:
        from quantlab.quantize.distributed import check_devices

        check_devices(distributed.nproc_per_node, ctx.loaded.path)
    with llmcompressor_log(_log_file(ctx)):
        check_layout(ctx.loaded, ctx.baseline_model())


def _cache_hit(ctx: StageContext) -> tuple[dict[str, Any] | None, str | None, Path | None]:
    """(key parts, key, cached checkpoint folder); all None when reuse is off."""
    if not ctx.recipe.quantization.reuse_checkpoint:
        return None, None, None
    parts = _cache_parts(ctx)
    key = result_cache.cache_key(parts)
    return parts, key, result_cache.lookup(result_cache.CHECKPOINTS, key)


def cache_key(ctx: StageContext) -> str | None:
    """The key the checkpoint is cached under (None when reuse is off)."""
    return _cache_hit(ctx)[1]


def reuses(ctx: StageContext) -> str | None:
    """What the stage will take from the cache instead of doing, if anything."""
    try:
        _, key, cached = _cache_hit(ctx)
    except (RecipeError, OSError):
        return None
    return f"reuses the checkpoint cached from the same inputs ({key[:12]})" if cached else None


def _cache_parts(ctx: StageContext) -> dict[str, Any]:
    """What a checkpoint depends on, by content: the model files, the recipe's
    quantization (less the reuse switch) and calibration sections, the calibration data,
    and the versions of quantlab's code and of the quantization libraries."""
    from quantlab.core.version import __version__
    from quantlab.quantize.llmcompressor import library_versions
    from quantlab.core.provenance import quantlab_code_sha256

    r = ctx.recipe
    return {"model": model_files_identity(ctx.baseline_model().path),
            "quantization": r.quantization.model_dump(mode="json", exclude={"reuse_checkpoint"}),
            "calibration": r.calibration.model_dump(mode="json") if r.calibration else None,
            "calibration_files": [sha256_file(p) for p in ctx.loaded.calibration_paths()],
            "trust_remote_code": r.model.trust_remote_code, "dtype": r.model.dtype,
            # what decides quantization.calibration_dtype 'auto' on this host (CPU, kernel limits)
            "host": host_kernel_identity() if r.quantization.calibration_dtype == "auto" else None,
            "versions": library_versions(), "quantlab": {"version": __version__, "code": quantlab_code_sha256()},
            "format": 2}


def run(ctx: StageContext) -> QuantizeResult:
    parts, key, cached = _cache_hit(ctx)
    recorded: dict[str, dict[str, Any]] | None = None
    if cached is not None:
        ctx.progress(f"quantize: reusing the checkpoint quantized earlier from the same inputs ({key[:12]}; "
                     "quantization.reuse_checkpoint: false quantizes again)")
        try:
            with atomic_directory(ctx.checkpoint_dir, replace=True) as tmp:
                # only the files the entry's authenticated index lists, each hashed as it is copied
                recorded = result_cache.copy_entry(result_cache.CHECKPOINTS, cached, tmp)
            out = json.loads((ctx.checkpoint_dir / QUANTIZE_RESULT_FILE).read_text())
        except IntegrityError as err:  # another node may have written it: a broken entry is replaced, never served
            ctx.progress(f"quantize: {err}; the entry is removed and the recipe quantized again")
            result_cache.discard(cached)
            cached = None
    if cached is None:
        out = _quantize(ctx)
        recorded = record_checkpoint(ctx.checkpoint_dir, out["checkpoint"]["files"])
        if key is not None:  # before later stages add the manifest and signature to the folder
            result_cache.store(result_cache.CHECKPOINTS, key, ctx.checkpoint_dir, parts)
    ckpt = out["checkpoint"]
    ctx.add_artifact(f"{CHECKPOINT_DIR}/{QUANTIZE_RESULT_FILE}", "quantize-result")
    for name in recorded:
        if name.endswith(".safetensors"):
            ctx.add_artifact(f"{CHECKPOINT_DIR}/{name}", "checkpoint-weights")
    return QuantizeResult(
        checkpoint=CHECKPOINT_DIR,
        method=out["method"],
        scheme=out["scheme"],
        layers_quantized=out["layers_quantized"],
        calibration=out["calibration"],
        quantization_config=ckpt["quantization_config"],
        size_bytes=ckpt["size_bytes"],
        files={k: FileFact(**v) for k, v in recorded.items()},
        timings=out["timings"],
        peak_rss_bytes=out["peak_rss_bytes"],
        versions=out["versions"],
        model=out["model"],
        gptq_max_loss=(out["gptq"] or {}).get("max_loss"),
        compute_dtype=out.get("compute_dtype"),
        engine_warnings=out["engine_warnings"],
        shims=out["shims"],
        reused_from_cache=key if cached is not None else None,
    )


def record_checkpoint(folder: Path, exported: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every file of the checkpoint just exported, with its size and sha256: the record every
    later stage and the release read (the release compares the folder with it, file by file).
    The export hashed its weights and configs as it wrote them (quantize.json's list); the rest
    (quantize.json itself, tokenizer files in subfolders) is hashed here, before any check runs.
    A link in the export is refused: a checkpoint holds plain files."""
    files, others = folder_record.walk(folder)
    if others:
        raise EngineError(f"the exported checkpoint {folder} holds what is not a plain file: "
                          + ", ".join(f"{rel} ({what})" for rel, what in others.items()))
    return {rel: ({"size": exported[rel]["size"], "sha256": exported[rel]["sha256"]} if rel in exported
                  else folder_record.file_digest(folder / rel)) for rel in files}


def _quantize(ctx: StageContext) -> dict[str, Any]:
    """In this process, or with quantization.distributed one process per GPU under torchrun."""
    from quantlab.quantize.llmcompressor import quantize_checkpoint

    distributed = ctx.recipe.quantization.distributed
    if distributed is None:
        return quantize_checkpoint(ctx.loaded, ctx.baseline_model(), ctx.checkpoint_dir, overwrite=True,
                                   progress=ctx.progress, log_file=_log_file(ctx))
    from quantlab.quantize.distributed import run_distributed, write_rank_recipe

    ctx.baseline_model()  # resolved (and converted) once here, not by every rank
    log = _log_file(ctx) or ctx.run.path / LOG_DIR / "llmcompressor.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    ctx.progress(f"quantize: {distributed.nproc_per_node} processes under torchrun (llm-compressor's distributed "
                 f"oneshot; its output: {log})")
    return run_distributed(write_rank_recipe(ctx.loaded, log.parent), ctx.checkpoint_dir,
                           distributed.nproc_per_node, log_file=log)
