"""What a checkpoint folder says about its own quantization (its config.json), read
before any engine loads it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from quantlab.core.errors import RecipeError


def read_quant_config(model_dir: Path) -> dict[str, Any] | None:
    cfg = Path(model_dir) / "config.json"
    if not cfg.is_file():
        raise RecipeError(f"no config.json in {model_dir}: not a model folder (was the quantize stage run?)")
    try:
        data = json.loads(cfg.read_text())
    except ValueError as err:
        raise RecipeError(f"{cfg} is not valid JSON ({err}): the checkpoint is corrupt; re-run quantize") from None
    if not list(Path(model_dir).glob("*.safetensors")):
        raise RecipeError(f"no *.safetensors in {model_dir}: the checkpoint is incomplete; re-run quantize")
    return data.get("quantization_config")
