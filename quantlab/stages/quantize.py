"""Quantize stage: the recipe's model -> llm-compressor -> compressed-tensors checkpoint
in the run folder."""

from __future__ import annotations

from typing import Any

from quantlab.context import RunContext
from quantlab.fsutil import sha256_file
from quantlab.layout import CHECKPOINT_DIR, LOG_DIR, QUANTIZE_RESULT_FILE
from quantlab.models import source_fingerprint
from quantlab.results import FileFact, QuantizeResult

NAME = "quantize"


def inputs(ctx: RunContext) -> dict[str, Any]:
    r = ctx.recipe
    return {
        "model": r.model.model_dump(mode="json"),
        "model_source": source_fingerprint(ctx.loaded),
        "quantization": r.quantization.model_dump(mode="json"),
        "calibration": r.calibration.model_dump(mode="json") if r.calibration else None,
        # the content, not the path: an edited calibration file re-runs the stage
        "calibration_files": [sha256_file(p) for p in ctx.loaded.calibration_paths()],
    }


def _log_file(ctx: RunContext):
    return None if ctx.verbose else ctx.run.path / LOG_DIR / "llmcompressor.log"


def preflight(ctx: RunContext) -> None:
    from quantlab.engines.llmcompressor import check_layout, llmcompressor_log

    with llmcompressor_log(_log_file(ctx)):
        check_layout(ctx.loaded, ctx.baseline_model())


def run(ctx: RunContext) -> QuantizeResult:
    from quantlab.engines.llmcompressor import quantize_checkpoint

    out = quantize_checkpoint(ctx.loaded, ctx.baseline_model(), ctx.checkpoint_dir, overwrite=True,
                              progress=ctx.progress, log_file=_log_file(ctx))
    ckpt = out["checkpoint"]
    ctx.add_artifact(f"{CHECKPOINT_DIR}/{QUANTIZE_RESULT_FILE}", "quantize-result")
    for name in ckpt["files"]:
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
        files={k: FileFact(**v) for k, v in ckpt["files"].items()},
        timings=out["timings"],
        peak_rss_bytes=out["peak_rss_bytes"],
        versions=out["versions"],
        model=out["model"],
        gptq_max_loss=(out["gptq"] or {}).get("max_loss"),
        engine_warnings=out["engine_warnings"],
        shims=out["shims"],
    )
