"""The servers of one run, kept up across stages: the serve stage starts them, the
checks after it reuse them, the pipeline stops them at the end. With
serve.side_by_side false only one runs at a time (getting one stops the other)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from quantlab.engines.vllm_server import Progress, VLLMServer, open_engine
from quantlab.serving_plan import ServingPlan


class EnginePool:
    def __init__(self, plan: ServingPlan, *, log_dir: Path, progress: Progress):
        self.plan = plan
        self.log_dir = Path(log_dir)
        self.progress = progress
        self._stacks: dict[str, contextlib.ExitStack] = {}
        self._servers: dict[str, VLLMServer] = {}

    def get(self, role: str) -> VLLMServer:
        if role in self._servers:
            self._servers[role].ensure_alive("between checks")
            return self._servers[role]
        if not self.plan.spec.side_by_side:
            for other in list(self._servers):
                self.stop(other)
        stack = contextlib.ExitStack()
        server = stack.enter_context(open_engine(self.plan, role, log_dir=self.log_dir, progress=self.progress))
        self._stacks[role], self._servers[role] = stack, server
        return server

    def running(self) -> list[str]:
        return list(self._servers)

    def stop(self, role: str) -> None:
        self._servers.pop(role, None)
        stack = self._stacks.pop(role, None)
        if stack is not None:
            stack.close()

    def close(self) -> None:
        for role in list(self._servers):
            self.stop(role)
