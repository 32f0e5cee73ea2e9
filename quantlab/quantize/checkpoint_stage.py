"""Checkpoint stage (`quantlab validate` instead of quantize): an existing checkpoint is
copied into the run folder and every file hashed as it is copied, so the run validates,
signs and records exactly the files it served, whatever happens to the original folder.
Formats vLLM serves: compressed-tensors (quantlab, llm-compressor), GPTQ (AutoGPTQ,
GPTQModel), AWQ (AutoAWQ), FP8, or an unquantized model.

Links: the copy holds plain files only. A link to a file inside the checkpoint folder is
copied as that file's content; a link that leads outside it (or nowhere, or to a folder)
is refused before anything is created, naming the link and its target: its target's
bytes would otherwise be copied, signed and shipped (a key file behind `added_tokens.json`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from quantlab.core import folder_record
from quantlab.core.stage_context import StageContext
from quantlab.core.errors import RecipeError
from quantlab.core.fsutil import atomic_directory
from quantlab.core.layout import CHECKPOINT_DIR, release_owned
from quantlab.core.results import CheckpointResult, FileFact
from quantlab.quantize.checkpoint_config import read_quant_config

NAME = "checkpoint"


def _source(ctx: StageContext) -> Path:
    if ctx.import_from is None:
        raise RecipeError("the checkpoint stage needs a checkpoint folder (quantlab validate --checkpoint DIR)")
    return Path(ctx.import_from).expanduser().resolve()


def _files(folder: Path) -> list[tuple[str, Path]]:
    """(relative path, the file whose bytes are copied) of every file below `folder`,
    subfolders included (a tokenizer or an adapter may sit in one), but what an earlier
    release added (its manifest, signature, attestation, registration and SBOMs: a release
    is made anew). A link to a file inside the folder gives that file; any other link, or
    anything not a plain file, is refused (RecipeError naming it)."""
    root = Path(folder).resolve()
    files, others = folder_record.walk(root)
    out = [(rel, root / rel) for rel in files]
    for rel, what in others.items():
        p = root / rel
        if not p.is_symlink():
            raise RecipeError(f"{p} is {what}: a checkpoint holds plain files only; remove it",
                              field="--checkpoint")
        target = Path(os.path.realpath(p))
        if not target.is_relative_to(root):
            raise RecipeError(f"{p} is a link to {os.readlink(p)} ({target}), outside the checkpoint folder {root}: "
                              "its target is not copied, signed or shipped. Replace the link with the file it should "
                              "hold (a copy, after checking it), or remove it", field="--checkpoint")
        if not target.is_file():
            raise RecipeError(f"{p} is a link to {os.readlink(p)}, which is not a file inside the checkpoint folder "
                              "(missing, or a folder): replace it with the files it should hold", field="--checkpoint")
        out.append((rel, target))
    return sorted([(rel, p) for rel, p in out if not release_owned(rel)], key=lambda f: f[0].split("/"))


def check_source(folder: Path) -> None:
    """What `validate --checkpoint` must be, checked before anything is created: a folder whose
    links stay inside it (RecipeError, exit 2, otherwise)."""
    src = Path(folder).expanduser()
    if not src.resolve().is_dir():
        raise RecipeError(f"checkpoint folder {src} does not exist (or is not a folder); expected the folder "
                          "holding the checkpoint's config.json and *.safetensors", field="--checkpoint")
    _files(src)


def inputs(ctx: StageContext) -> dict[str, Any]:
    src = _source(ctx)
    try:
        listed = _files(src) if src.is_dir() else []
    except RecipeError:  # said by the preflight, which runs before the stage
        listed = []
    return {"source": str(src), "files": {rel: [p.stat().st_size, int(p.stat().st_mtime)] for rel, p in listed}}


def preflight(ctx: StageContext) -> None:
    src = _source(ctx)
    check_source(src)
    read_quant_config(src)  # config.json present and parsable, safetensors weights present
    if any(Path(rel).suffix in (".bin", ".pt", ".pth") for rel, _ in _files(src)):
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
        # the record: each file hashed as its copy is written (an inside link's target's bytes, never a link)
        files = {rel: FileFact(**folder_record.copy_hashed(p, tmp / rel)) for rel, p in _files(src)}
    for name in files:
        if name.endswith(".safetensors"):
            ctx.add_artifact(f"{CHECKPOINT_DIR}/{name}", "checkpoint-weights")
    qc = read_quant_config(ctx.checkpoint_dir)
    return CheckpointResult(checkpoint=CHECKPOINT_DIR, source=str(src), format=checkpoint_format(qc),
                            quantization_config=qc, size_bytes=sum(f.size for f in files.values()), files=files)
