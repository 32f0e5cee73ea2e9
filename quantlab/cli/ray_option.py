"""`quantlab run --ray`: the recipes' quantization as Ray tasks before the run's stages."""

from __future__ import annotations

from pathlib import Path

from quantlab.core.errors import RecipeError
from quantlab.cli.base import progress


def storage_for(address: str, storage: Path | None, runs_dir: Path) -> Path:
    """--storage, or <runs-dir>/storage for a cluster started here (a cluster elsewhere
    cannot see this machine's runs folder)."""
    if storage is not None:
        return storage
    if address != "local":
        raise RecipeError("--ray with a cluster needs --storage: a folder every node sees (NFS or a mounted "
                          "bucket) for the checkpoints", field="--storage")
    return runs_dir / "storage"


def quantize_on_ray(recipes: list[Path], address: str, storage: Path | None, runs_dir: Path, *,
                    cpus: int = 1) -> None:
    """The recipes' quantization as Ray tasks; this process then reads the storage folder's
    checkpoint cache (QUANTLAB_CHECKPOINT_CACHE), where the tasks left the checkpoints;
    every other cache (results, probe, the signing key) stays this machine's."""
    import os

    from quantlab.core.result_cache import CHECKPOINT_CACHE_ENV
    from quantlab.pipeline.ray_quantize import (check_storage, connect, disconnect, quantize_candidates,
                                                storage_cache)

    folder = check_storage(storage_for(address, storage, runs_dir))
    connect(address, progress=progress)
    try:
        os.environ[CHECKPOINT_CACHE_ENV] = str(storage_cache(folder))  # the run reads the tasks' checkpoints
        quantize_candidates(recipes, folder, progress=progress, cpus=cpus)
    finally:
        disconnect()
