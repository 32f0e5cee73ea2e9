"""The servers of one run, kept up across stages: the serve stage starts them, the
checks after it reuse them, the pipeline stops them at the end. Servers are keyed by
(serve target, role). With serve.side_by_side false only one runs at a time (getting
one stops the others)."""

from __future__ import annotations

from pathlib import Path

from quantlab.serving.cpu_cores import engine_bind
from quantlab.core.progress import Progress
from quantlab.serving.vllm_server import VLLMServer, prepare_engine, start_together
from quantlab.recipe.serve import PRIMARY_TARGET
from quantlab.core.roles import ROLES
from quantlab.serving.plan import ServingPlan


class EnginePool:
    def __init__(self, plan: ServingPlan, *, log_dir: Path, progress: Progress):
        self.plans: dict[str, ServingPlan] = {PRIMARY_TARGET: plan}
        self.side_by_side = plan.spec.side_by_side
        self.log_dir = Path(log_dir)
        self.progress = progress
        self._servers: dict[tuple[str, str], VLLMServer] = {}
        self._borrowed: set[tuple[str, str]] = set()  # servers another pool owns (a comparison's baseline)

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
        self.start([key])
        return self._servers[key]

    def start(self, keys: list[tuple[str, str]]) -> None:
        """Start the servers not running yet, at the same time when there are several
        (side by side only: otherwise the others are stopped first)."""
        todo = [k for k in keys if k not in self._servers]
        if not todo:
            return
        if not self.side_by_side:
            assert len(todo) == 1, "one server at a time: start them one by one"
            for other in list(self._servers):
                self._stop(other)
        servers = [prepare_engine(self.plans[t], r, log_dir=self.log_dir, progress=self.progress,
                                  cpu_bind=self._cpu_bind(t, r)) for t, r in todo]
        start_together(servers, self.progress)
        self._servers.update(zip(todo, servers, strict=True))

    def _cpu_bind(self, target: str, role: str) -> str | None:
        """Baseline and candidate side by side on one target: a half of the cores each, so
        they neither take turns on the cores vLLM's own binding gives both nor leave the
        rest idle (see cpu_cores). Other layouts keep vLLM's binding."""
        if not self.side_by_side or len(self.plans) != 1 or role not in ROLES:
            return None
        return engine_bind(self.plans[target].device, ROLES.index(role), len(ROLES))

    def adopt(self, role: str, server: VLLMServer, *, owned: bool, target: str = PRIMARY_TARGET) -> None:
        """Take a server started elsewhere. One not owned (the baseline a comparison shares
        between its candidates) is never stopped by this pool: close() only lets go of it."""
        key = (target, role)
        self._servers[key] = server
        if owned:
            self._borrowed.discard(key)
        else:
            self._borrowed.add(key)

    def running_server(self, role: str, target: str = PRIMARY_TARGET) -> VLLMServer | None:
        return self._servers.get((target, role))

    def running(self) -> list[str]:
        return [self.plans[t].label(r) for t, r in self._servers]

    def running_keys(self) -> list[tuple[str, str]]:
        return list(self._servers)

    def stop(self, role: str, target: str = PRIMARY_TARGET) -> None:
        self._stop((target, role))

    def _stop(self, key: tuple[str, str]) -> None:
        server = self._servers.pop(key, None)
        if server is not None and key not in self._borrowed:
            server.stop()
        self._borrowed.discard(key)

    def close(self) -> None:
        """Stop every server, all at once: each shutdown is a wait of seconds."""
        from concurrent.futures import ThreadPoolExecutor

        servers = [self._servers.pop(key) for key in list(self._servers) if key not in self._borrowed]
        for key in list(self._borrowed):
            self._servers.pop(key, None)
        self._borrowed.clear()
        if not servers:
            return
        with ThreadPoolExecutor(max_workers=len(servers)) as pool:
            for done in [pool.submit(server.stop) for server in servers]:
                done.result()
