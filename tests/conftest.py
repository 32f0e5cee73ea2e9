"""Shared, expensive fixtures: built once per test session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
RECIPES = REPO / "recipes"
CALIB = REPO / "calib_data"
sys.path.insert(0, str(Path(__file__).resolve().parent))

# Never reach a hub from tests: a hub lookup must fail fast and clearly.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The embedded SmolLM2-135M-Instruct as bf16 safetensors (built once, cached)."""
    from quantlab.models import build_default_model

    return build_default_model(progress=lambda m: None).path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, default_model_dir) -> Path:
    """A 2-layer random Llama with the default model's tokenizer and chat template."""
    from tiny_model import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), default_model_dir)


def write_recipe(folder: Path, data: dict, name: str = "recipe.yaml") -> Path:
    """Write a recipe dict as YAML; calibration paths are made absolute."""
    folder.mkdir(parents=True, exist_ok=True)
    for ds in (data.get("calibration") or {}).get("datasets", []):
        p = Path(ds["path"])
        if not p.is_absolute():
            ds["path"] = str((RECIPES / p).resolve())
    path = folder / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def shipped(name: str) -> dict:
    return yaml.safe_load((RECIPES / f"{name}.yaml").read_text())


def tiny_variant(name: str, model_dir: Path, *, samples: int = 8, seq: int = 128) -> dict:
    """A shipped recipe pointed at the tiny model with a small calibration budget."""
    data = shipped(name)
    data["model"]["source"] = str(model_dir)
    if data.get("calibration"):
        data["calibration"]["num_samples"] = samples
        data["calibration"]["max_seq_length"] = seq
    return data
