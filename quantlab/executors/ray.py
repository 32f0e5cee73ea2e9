"""The Ray executor (`--ray ADDRESS --storage DIR --ray-cpus N`): each member a task on a
node of a Ray cluster (executors/ray_driver.py), the choice and signing on this machine.

Entered, it joins the cluster (or starts one here with `local`) and checks the storage
folder every node writes to; it leaves the cluster on exit. What can be refused without
creating anything is refused before the cluster is tried: a cluster elsewhere without
--storage, a storage folder that cannot be made.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from quantlab.core.errors import RecipeError
from quantlab.core.progress import Progress
from quantlab.executors.ray_cluster import check_storage, check_storage_creatable, connect, disconnect
from quantlab.executors.ray_driver import run_comparison_on_ray
from quantlab.pipeline.candidates.members import Comparison
from quantlab.pipeline.candidates.servers import HeldBaseline
from quantlab.recipe.family import Family
from quantlab.recipe.file import LoadedRecipe


def storage_for(address: str, storage: Path | None, runs_dir: Path) -> Path:
    """--storage, or <runs-dir>/storage for a cluster started here (a cluster elsewhere
    cannot see this machine's runs folder)."""
    if storage is not None:
        return storage
    if address != "local":
        raise RecipeError("--ray with a cluster needs --storage: a folder every node sees (NFS or a mounted "
                          "bucket) for the checkpoints, the shared cache and the run folders", field="--storage")
    return runs_dir / "storage"


@dataclass
class RayExecutor:
    """`address`: host:port, 'auto' or 'local'; `storage`: --storage (None: see storage_for);
    `runs_dir`: --runs-dir; `cpus`: what each member's task asks of its node. Building one
    joins nothing and creates nothing."""

    address: str
    storage: Path | None = None
    runs_dir: Path = Path("runs")
    cpus: int = 1
    progress: Progress = print
    name: ClassVar[str] = "ray"
    joined: Path | None = field(default=None, init=False)  # the storage folder, checked, once joined

    def __enter__(self) -> RayExecutor:
        target = storage_for(self.address, self.storage, self.runs_dir)
        check_storage_creatable(target)  # bad input is refused before anything is created:
        connect(self.address, progress=self.progress)  # an address nobody answers at too
        try:
            self.joined = check_storage(target)
        except BaseException:
            disconnect()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.joined = None
        disconnect()

    def hold_baseline(self, at_least: int) -> HeldBaseline | None:
        """None: each task serves its own baseline on its node."""
        return None

    def run(self, members: Sequence[Path | LoadedRecipe], runs_root: Path, *, progress: Progress = print,
            verbose: bool = False, family: Family | None = None, held: HeldBaseline | None = None,
            allow_single: bool = False) -> Comparison:
        """The members as tasks; their run folders in the storage folder (<storage>/runs/compare/<id>/),
        not under `runs_root`. One member is always a comparison of one."""
        if self.joined is None:
            raise RuntimeError("the Ray executor runs inside `with executor:` (it joins the cluster there)")
        return run_comparison_on_ray(list(members), self.joined, progress=progress, cpus=self.cpus,
                                     verbose=verbose, family=family)
