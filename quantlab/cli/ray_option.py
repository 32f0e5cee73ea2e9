"""`quantlab run --ray` and `quantlab search --ray`: every candidate (or trial) as a Ray
task on a node of the cluster."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
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
                          "bucket) for the checkpoints, the shared cache and the run folders", field="--storage")
    return runs_dir / "storage"


@contextmanager
def on_ray(address: str, storage: Path | None, runs_dir: Path) -> Iterator[Path]:
    """Joined to the cluster (or one started here) for the block; yields the storage
    folder, created and checked writable once joined. The run folders go there
    (<storage>/runs/compare/<id>/)."""
    from quantlab.pipeline.ray_cluster import check_storage, check_storage_creatable, connect, disconnect

    target = storage_for(address, storage, runs_dir)
    check_storage_creatable(target)  # bad input is refused before anything is created:
    connect(address, progress=progress)  # an address nobody answers at too
    try:
        yield check_storage(target)
    finally:
        disconnect()


def compare_on_ray(recipes: list[Path], address: str, storage: Path | None, runs_dir: Path, *, cpus: int = 1,
                   verbose: bool = False, family=None):
    """The candidates' stages on the cluster's nodes, their release and the choice here."""
    from quantlab.pipeline.ray_candidates import run_comparison_on_ray
    from quantlab.recipe.file import load_recipe

    loaded = [load_recipe(r) for r in recipes]  # every file valid before the cluster is joined or storage made
    with on_ray(address, storage, runs_dir) as folder:
        return run_comparison_on_ray(loaded, folder, progress=progress, cpus=cpus, verbose=verbose, family=family)
