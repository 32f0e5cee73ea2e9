"""The run directory and its typed record.

runs/<recipe name>/<run id>/run.json is rewritten (atomically) after every stage.
Resume, reports, gates and `verify` all read this one record; raw tool outputs sit
beside it and are referenced by relative path + sha256.
"""

from __future__ import annotations

import datetime as dt
import json
import platform
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from quantlab.core import redact
from quantlab.core.layout import RECORD_FILE  # noqa: F401 (also read from here)
from quantlab.core.version import __version__
from quantlab.core.errors import RecipeError
from quantlab.core.fsutil import sha256_file, write_json_atomic
from quantlab.core.results import StageOutput

RECORD_VERSION = 2
StageStatus = Literal["ok", "failed", "interrupted"]
RunStatus = Literal["running", "ok", "blocked", "failed", "interrupted"]


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


class Artifact(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str  # relative to the run directory
    sha256: str | None = None  # None for folders (their files are listed in the stage summary)
    role: str


class StageRecord(BaseModel):
    """One stage's outcome. `inputs_sha256` hashes what the stage depends on, so a
    resumed run redoes exactly the stages whose inputs changed."""

    model_config = ConfigDict(extra="forbid")
    name: str
    status: StageStatus
    started_at: str
    finished_at: str
    duration_s: float
    engine_s: float | None = Field(None, description="Of duration_s, the wall time an engine was at work "
                                   "(llm-compressor, a vLLM server starting or answering, lm-eval); the rest "
                                   "is quantlab's own.")
    inputs_sha256: str
    result: StageOutput | None = None
    artifacts: list[Artifact] = Field(default_factory=list)
    error: str | None = None
    cause: str | None = Field(None, description="Why the stage failed, in one line, where an engine's log told "
                              "(for instance a kernel op missing from the serving engine's build).")
    error_log: str | None = Field(None, description="Traceback file of an unexpected error, relative to the run.")


class AttemptTime(BaseModel):
    model_config = ConfigDict(extra="forbid")
    wall_s: float
    engine_s: float

    @property
    def own_s(self) -> float:
        return max(0.0, self.wall_s - self.engine_s)


class RunRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    record_version: Literal[2] = RECORD_VERSION
    run_id: str
    recipe_name: str
    recipe_path: str
    recipe_sha256: str
    recipe: dict[str, Any]
    quantlab_version: str = __version__
    host: dict[str, Any] = Field(default_factory=dict)
    created_at: str = Field(default_factory=now_iso)
    updated_at: str = Field(default_factory=now_iso)
    status: RunStatus = "running"
    # sha256 of each recipe this run was resumed with after the first (edits between tries)
    recipe_history: list[str] = Field(default_factory=list)
    stages: dict[str, StageRecord] = Field(default_factory=dict)
    placement: dict[str, Any] | None = Field(None, description="`--ray`: where the candidate's stages ran "
                                             "(node, Ray node and job id, attempt); None on this machine.")
    registration: dict[str, Any] | None = Field(None, description="The gate set registered before any engine "
                                                "started (release/registration.py): its file, digests, signing.")
    stream_note: str | None = Field(None, description="What the stream's register could not record of this run's "
                                    "decision (pipeline/streams.py), said rather than lost.")
    stopped_early: str | None = Field(None, description="`--ray` racing: the failed required gate that ended "
                                      "the candidate's checks after its quality stage.")
    attempt: AttemptTime | None = Field(None, description="Wall and engine time of the latest run/validate "
                                        "call on this record, preflights and reports included.")

    def result(self, stage: str) -> StageOutput | None:
        rec = self.stages.get(stage)
        return rec.result if rec is not None and rec.status == "ok" else None


def new_run_folder(parent: Path, digest: str) -> Path:
    """parent/<UTC time>-<digest[:8]>, created; a suffix when two start in the same second."""
    run_id = f"{dt.datetime.now(dt.timezone.utc).strftime('%Y%m%d-%H%M%S')}-{digest[:8]}"
    path = Path(parent) / run_id
    suffix = 1
    while path.exists():
        suffix += 1
        path = path.with_name(f"{run_id}-{suffix}")
    path.mkdir(parents=True)
    return path


class RecipeDocument(Protocol):
    """What a run record keeps of a loaded recipe (quantlab.recipe.file.LoadedRecipe is one)."""

    path: Path
    content_hash: str
    recipe: Any


class RunDir:
    def __init__(self, path: Path, record: RunRecord):
        self.path = Path(path)
        self.record = record

    @classmethod
    def create(cls, loaded: RecipeDocument, runs_root: Path) -> "RunDir":
        path = new_run_folder(Path(runs_root) / loaded.recipe.name, loaded.content_hash)
        record = RunRecord(
            run_id=path.name,
            recipe_name=loaded.recipe.name,
            recipe_path=str(loaded.path),
            recipe_sha256=loaded.content_hash,
            recipe=redact.recipe(loaded.recipe.model_dump(mode="json")),  # secrets as digests
            host={"platform": platform.platform(), "machine": platform.machine(),
                  "python": platform.python_version()},
        )
        run = cls(path, record)
        run.save()
        return run

    @classmethod
    def open(cls, path: Path) -> "RunDir":
        f = Path(path) / RECORD_FILE
        if not f.is_file():
            raise RecipeError(f"no run record at {f}; pass a run directory created by `quantlab run`")
        try:
            record = RunRecord.model_validate(json.loads(f.read_text()))
        except ValueError as err:
            raise RecipeError(f"run record {f} is corrupt or from another quantlab version ({err}); "
                              "start a new run instead of resuming this one") from None
        return cls(Path(path), record)

    @staticmethod
    def latest(runs_root: Path, recipe_name: str) -> Path | None:
        folder = Path(runs_root) / recipe_name
        runs = sorted(p for p in folder.glob("*") if (p / RECORD_FILE).is_file()) if folder.is_dir() else []
        return runs[-1] if runs else None

    def artifact(self, relative: str, role: str) -> Artifact:
        p = self.path / relative
        return Artifact(path=relative, role=role, sha256=sha256_file(p) if p.is_file() else None)

    def put_stage(self, stage: StageRecord) -> None:
        self.record.stages[stage.name] = stage
        self.save()

    def adopt_recipe(self, loaded: RecipeDocument) -> None:
        """A resumed run takes the recipe it is resumed with; the old hash is kept."""
        if self.record.recipe_sha256 != loaded.content_hash:
            self.record.recipe_history.append(self.record.recipe_sha256)
            self.record.recipe_sha256 = loaded.content_hash
            self.record.recipe = redact.recipe(loaded.recipe.model_dump(mode="json"))
            self.record.recipe_path = str(loaded.path)

    def save(self) -> None:
        self.record.updated_at = now_iso()
        write_json_atomic(self.path / RECORD_FILE, self.record.model_dump(mode="json"))
