"""Engine adapter: the embedded default model's GGUF converted with transformers (torch).
Only quantlab.models.source calls it, inside build_default_model."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from quantlab.core.fsutil import atomic_directory, sha256_file, write_json_atomic
from quantlab.models.identity import (CONVERSION_VERSION, DEFAULT_MODEL_NAME, DEFAULT_PACKAGE, PROVENANCE_FILE,
                                     ResolvedModel)


def convert_gguf(gguf: Path, gguf_sha: str, pkg_version: str, folder: Path) -> ResolvedModel:
    """The embedded GGUF, dequantized, saved as a bf16 safetensors folder with its provenance."""
    from transformers.utils import logging as hf_logging

    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # transformers' tqdm bars would clutter the terminal; a minute at most
    try:
        # the GGUF loader draws its own tqdm bar on stderr, whatever the setting above
        with contextlib.redirect_stderr(io.StringIO()):
            return _convert(gguf, gguf_sha, pkg_version, folder)
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()


def _convert(gguf: Path, gguf_sha: str, pkg_version: str, folder: Path) -> ResolvedModel:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with atomic_directory(folder, replace=True) as tmp:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16
        )
        # save_pretrained refuses a GGUF-loaded model: rebuild from its config.
        config = loaded.config
        config.dtype = torch.bfloat16
        if hasattr(config, "quantization_config"):  # the GGUF's, not ours
            delattr(config, "quantization_config")
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
        # tied lm_head may legitimately be absent from the state dict
        missing = [m for m in missing if not (m == "lm_head.weight" and config.tie_word_embeddings)]
        if missing or unexpected:
            raise RuntimeError(f"GGUF conversion lost weights: missing={missing} unexpected={unexpected}")
        model.generation_config = loaded.generation_config
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        files = {
            p.name: {"size": p.stat().st_size, "sha256": sha256_file(p)}
            for p in sorted(tmp.iterdir())
            if p.is_file()
        }
        provenance = {
            "model": DEFAULT_MODEL_NAME,
            "package": DEFAULT_PACKAGE,
            "package_version": pkg_version,
            "gguf_file": gguf.name,
            "gguf_sha256": gguf_sha,
            "licence": "Apache-2.0",
            "conversion": "transformers GGUF loader (Q4_1 dequantized) -> from_config -> bf16 safetensors",
            "conversion_version": CONVERSION_VERSION,
            "note": "weights were 4-bit (Q4_1) before dequantization; the bf16 model is the "
            "dequantized GGUF, not the original bf16 release",
            "parameters": sum(p.numel() for p in model.parameters()),
            "files": files,
        }
        write_json_atomic(tmp / PROVENANCE_FILE, provenance)
    return ResolvedModel(folder, "default", "default", provenance)
