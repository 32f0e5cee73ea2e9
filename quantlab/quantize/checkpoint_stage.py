"""Checkpoint stage (`quantlab validate` instead of quantize): an existing checkpoint is
copied into the run folder and hashed, so the run validates, signs and records exactly
the files it served, whatever happens to the original folder. Formats vLLM serves:
compressed-tensors (quantlab, llm-compressor), GPTQ (AutoGPTQ, GPTQModel), AWQ
(AutoAWQ), FP8, or an unquantized model."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from quantlab.core.stage_context import StageContext
from quantlab.core.errors import RecipeError
from quantlab.core.fsutil import atomic_directory, sha256_file
from quantlab.core.layout import CHECKPOINT_DIR
from quantlab.core.results import CheckpointResult, FileFact
from quantlab.quantize.checkpoint_config import read_quant_config

NAME = "checkpoint"
SKIP = {"quantlab-manifest.json", "quantlab-manifest.sig"}  # an earlier release's signature is not carried over


def _source(ctx: StageContext) -> Path:
    if ctx.import_from is None:
        raise RecipeError("the checkpoint stage needs a checkpoint folder (quantlab validate --checkpoint DIR)")
    return Path(ctx.import_from).expanduser().resolve()


def _files(folder: Path) -> list[tuple[str, Path]]:
    """(relative path, file) of every file below `folder`, subfolders included (a tokenizer
    or an adapter may sit in one), but an earlier release's manifest and signature."""
    return [(rel, p) for p in sorted(folder.rglob("*")) if p.is_file()
            and (rel := p.relative_to(folder).as_posix()) not in SKIP]


def inputs(ctx: StageContext) -> dict[str, Any]:
    src = _source(ctx)
    files = {rel: [p.stat().st_size, int(p.stat().st_mtime)] for rel, p in _files(src)} if src.is_dir() else {}
    return {"source": str(src), "files": files}


def preflight(ctx: StageContext) -> None:
    src = _source(ctx)
    if not src.is_dir():
        raise RecipeError(f"checkpoint folder {src} does not exist", field="--checkpoint")
    read_quant_config(src)  # config.json present and parsable, safetensors weights present
    if any(p.suffix in (".bin", ".pt", ".pth") for _, p in _files(src)):
        raise RecipeError(f"{src} holds pickle weight files (*.bin/*.pt): quantlab loads safetensors only; "
                          "convert the checkpoint to safetensors first", field="--checkpoint")


def checkpoint_format(quant_config: dict[str, Any] | None) -> str:
    if not quant_config:
        return "unquantized"
    return str(quant_config.get("quant_method") or quant_config.get("format") or "unknown")


def run(ctx: StageContext) -> CheckpointResult:
    src = _source(ctx)
    ctx.progress(f"checkpoint: copying {src} into the run folder")
    with atomic_directory(ctx.checkpoint_dir, replace=True) as tmp:
        for rel, p in _files(src):
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, tmp / rel)  # a symlink's content, never the link: the copy is self-contained
    files = {rel: FileFact(size=p.stat().st_size, sha256=sha256_file(p)) for rel, p in _files(ctx.checkpoint_dir)}
    for name in files:
        if name.endswith(".safetensors"):
            ctx.add_artifact(f"{CHECKPOINT_DIR}/{name}", "checkpoint-weights")
    qc = read_quant_config(ctx.checkpoint_dir)
    return CheckpointResult(checkpoint=CHECKPOINT_DIR, source=str(src), format=checkpoint_format(qc),
                            quantization_config=qc, size_bytes=sum(f.size for f in files.values()), files=files)
