"""What a stage is given: the loaded recipe, the run folder, progress, the engines
(serving.session.EngineSession) and what its run decides (the stages that run, the
artifacts collected), set by its pipeline/candidate_run.CandidateRun, which builds it.
Stages see it through core.stage_context.StageContext."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from quantlab.core.evidence import Evidence
from quantlab.core.run import Artifact
from quantlab.serving.session import EngineSession


@dataclass
class RunContext(EngineSession):
    will_run: set[str] = field(default_factory=set)  # stages this invocation runs (set by its CandidateRun)
    enabled_stages: set[str] = field(default_factory=set)  # stages the recipe asks for (set by its CandidateRun)
    # whether any check needs a baseline server, asked by the serve stage once the checkpoint
    # exists (set by its CandidateRun; the quality stage can do without when its baseline is cached)
    needs_baseline: Callable[[], bool] = lambda: True
    stages: list[Any] = field(default_factory=list)  # this run's stage modules (pipeline/stages.py)
    artifacts: list[Artifact] = field(default_factory=list)  # the running stage's, collected by the pipeline
    comparison: dict[str, Any] | None = None  # several candidates: the choice, recorded in the manifest
    evidence: Evidence | None = None  # quantlab decide: the files it imports instead of serving (core/evidence.py)

    def add_artifact(self, relative: str, role: str) -> None:
        self.artifacts.append(self.run.artifact(relative, role))
