"""A comparison's servers: the shared baseline (kept up across a search's rounds when
held) and each group's candidates, started at once beside it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantlab.core.digest import json_sha256
from quantlab.core.errors import EngineError
from quantlab.core.layout import SERVE_LOG_DIR
from quantlab.core.progress import Progress
from quantlab.pipeline.candidates.members import Candidate
from quantlab.serving.cpu_cores import engine_bind


@dataclass
class HeldBaseline:
    """A baseline server kept up across comparisons of one recipe's trials (a search's
    rounds, ~40-200 s of start-up each saved): started by the first, stopped by its owner."""

    server: Any = None
    slots: int = 0  # the engines up at once it was bound for (its cores, and its candidates')
    at_least: int = 2  # bind for this many from the start (1 + a search's width), so a wider round needs no restart
    launched: str | None = None  # what it serves with (baseline_key): a round planning another baseline restarts it

    def usable(self, slots: int, key: str) -> bool:
        proc = getattr(self.server, "proc", None)
        return (self.server is not None and (proc is None or proc.poll() is None) and slots <= self.slots
                and key == self.launched)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.server = None


def baseline_key(plan: Any) -> str:
    """What the baseline server serves and how: its weights, device, mode and engine
    arguments (a scheme's dtype choice among them); equal keys, one server."""
    base = plan.target("baseline")
    return json_sha256({"model": str(base.model_dir), "device": plan.device, "mode": plan.spec.mode,
                        "engine_args": plan.engine_args, "endpoint": plan.endpoint_for("baseline")
                        if plan.spec.mode == "endpoint" else None})


def start_baseline(folder: Path, first: Candidate, progress: Progress, slots: int):
    """The shared baseline server (its log in the comparison's folder), started but not
    waited for: the first group's servers start beside it and all load at once. Each of
    the `slots` engines up at once computes on cores of its own (see cpu_cores)."""
    from quantlab.serving.vllm_server import prepare_engine

    plan = first.ctx.serving_plan()
    baseline = prepare_engine(plan, "baseline", log_dir=folder / SERVE_LOG_DIR, progress=progress,
                              cpu_bind=engine_bind(plan.device, 0, slots))
    baseline.start()
    return baseline


def start_candidates(baseline, group: list[Candidate], progress: Progress, slots: int, *, first: bool) -> None:
    """The group's servers, started at once beside the baseline (on the first group, while
    it is still loading too); a baseline that fails to start stops the comparison, a
    candidate's fails that candidate alone."""
    from quantlab.serving.vllm_server import prepare_engine, wait_healthy

    plans = {c.name: c.ctx.serving_plan() for c in group}
    mine = {c.name: prepare_engine(plans[c.name], "candidate", log_dir=c.run.path / SERVE_LOG_DIR, progress=progress,
                                   cpu_bind=engine_bind(plans[c.name].device, 1 + i, slots))
            for i, c in enumerate(group)}
    started = []
    try:
        for server in mine.values():
            server.start()
            started.append(server)
        if first:
            wait_healthy(baseline, progress)
    except BaseException:
        for server in started:
            server.stop()
        raise
    for c in group:
        try:
            wait_healthy(mine[c.name], progress)
        except EngineError as err:
            c.failed = f"its server did not start: {err.cause or str(err).splitlines()[0]}"
            progress(f"candidate {c.name}: {c.failed}; the others go on")
            continue
        except BaseException:
            for server in mine.values():
                server.stop()
            raise
        c.ctx.adopt_engine("baseline", baseline, owned=False)
        c.ctx.adopt_engine("candidate", mine[c.name], owned=True)
