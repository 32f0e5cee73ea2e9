"""What a stage is given: the loaded recipe, the run folder, progress, and inputs that
are resolved once per run and shared by the stages (the baseline model, the serving
environment's probe)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantlab.layout import CHECKPOINT_DIR
from quantlab.models import ResolvedModel, resolve_recipe_model
from quantlab.recipe import LoadedRecipe, Recipe
from quantlab.run import Artifact, RunDir

Progress = Callable[[str], None]


def inputs_hash(inputs: dict[str, Any]) -> str:
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass
class RunContext:
    loaded: LoadedRecipe
    run: RunDir
    progress: Progress = print
    will_run: set[str] = field(default_factory=set)  # stages this invocation runs (set by the pipeline)
    artifacts: list[Artifact] = field(default_factory=list)  # the running stage's, collected by the pipeline
    _baseline: ResolvedModel | None = None
    _probe: dict[str, Any] | None = None

    @property
    def recipe(self) -> Recipe:
        return self.loaded.recipe

    @property
    def checkpoint_dir(self) -> Path:
        return self.run.path / CHECKPOINT_DIR

    def baseline_model(self) -> ResolvedModel:
        if self._baseline is None:
            self._baseline = resolve_recipe_model(self.loaded, progress=self.progress)
        return self._baseline

    def serving_probe(self) -> dict[str, Any]:
        """The serving environment's versions and hardware (probed once per run; an
        endpoint's hardware cannot be probed)."""
        if self._probe is None:
            spec = self.recipe.serve
            if spec.mode == "launch":
                from quantlab.engines.vllm_probe import probe_serving_env, serving_python

                self._probe = probe_serving_env(serving_python(spec))
            else:
                self._probe = unprobed(spec.mode)
        return self._probe

    def add_artifact(self, relative: str, role: str) -> None:
        self.artifacts.append(self.run.artifact(relative, role))


def unprobed(mode: str) -> dict[str, Any]:
    why = "external endpoint" if mode == "endpoint" else "started by serve.command, possibly elsewhere"
    return {"device": "unknown", "versions": {}, "gpus": [], "note": f"{why}: its environment is not probed"}
