"""The servers of one run, kept up across stages: the serve stage starts them, the
checks after it reuse them, the pipeline stops them at the end. Servers are keyed by
(serve target, role). With serve.side_by_side false only one runs at a time (getting
one stops the others)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from quantlab.engines.vllm_server import Progress, VLLMServer, open_engine
from quantlab.recipe import PRIMARY_TARGET
from quantlab.serving_plan import ServingPlan


class EnginePool:
    def __init__(self, plan: ServingPlan, *, log_dir: Path, progress: Progress):
        self.plans: dict[str, ServingPlan] = {PRIMARY_TARGET: plan}
        self.side_by_side = plan.spec.side_by_side
        self.log_dir = Path(log_dir)
        self.progress = progress
        self._stacks: dict[tuple[str, str], contextlib.ExitStack] = {}
        self._servers: dict[tuple[str, str], VLLMServer] = {}

    @property
    def plan(self) -> ServingPlan:
        return self.plans[PRIMARY_TARGET]

    def add_target(self, plan: ServingPlan) -> None:
        self.plans[plan.name] = plan

    def get(self, role: str, target: str = PRIMARY_TARGET) -> VLLMServer:
        key = (target, role)
        if key in self._servers:
            self._servers[key].ensure_alive("between checks")
            return self._servers[key]
        if not self.side_by_side:
            for other in list(self._servers):
                self._stop(other)
        stack = contextlib.ExitStack()
        server = stack.enter_context(open_engine(self.plans[target], role, log_dir=self.log_dir,
                                                 progress=self.progress))
        self._stacks[key], self._servers[key] = stack, server
        return server

    def running(self) -> list[str]:
        return [self.plans[t].label(r) for t, r in self._servers]

    def running_keys(self) -> list[tuple[str, str]]:
        return list(self._servers)

    def stop(self, role: str, target: str = PRIMARY_TARGET) -> None:
        self._stop((target, role))

    def _stop(self, key: tuple[str, str]) -> None:
        self._servers.pop(key, None)
        stack = self._stacks.pop(key, None)
        if stack is not None:
            stack.close()

    def close(self) -> None:
        for key in list(self._servers):
            self._stop(key)
