"""[adapter] Crossover placement: baseline and candidate swap cores between paired repeats.

Side by side on a CPU host each role's engine computes on cores of its own
(serving/cpu_cores). Those cores are not alike (core 0 also takes the host's
interrupts and, on a 2-core machine, the load generator's turns), so a ratio measured
with the baseline always on core 0 holds the placement as well as the model: an A/A
run gave a throughput ratio interval of 0.828-0.850, excluding 1.0. The stage measures
repeat 1 as launched, repeat 2 with the two engines' threads moved onto each other's
cores (os.sched_setaffinity on every thread pinned within the role's cores: the OMP
compute threads, not the API server's floating ones), repeat 3 as launched again, and so
on; with the start order alternating too (A B, B A), each role has each core and each
position equally often over a pair of repeats, and the spread between repeats enters
the interval (performance/noise.py resamples paired repeats). The placement is put back
when the stage ends.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from quantlab.core.roles import ROLES


def swapped(rep: int) -> bool:
    """Repeat `rep` (from 0) runs with the cores swapped: every second one."""
    return rep % 2 == 1


def parse_cpus(text: str | None) -> list[int] | None:
    """'0,2-3' -> [0, 2, 3]; None for vLLM's own choice ('auto', 'nobind', unset)."""
    if not text or text.strip() in ("auto", "nobind", "all"):
        return None
    out: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            out += list(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        return None
    return out


def swap_map(a: list[int], b: list[int]) -> dict[int, int] | None:
    """Core i of `a` <-> core i of `b`; None unless both are the same size and disjoint."""
    if len(a) != len(b) or set(a) & set(b) or not a:
        return None
    return {**dict(zip(a, b)), **dict(zip(b, a))}


@dataclass
class Placement:
    """The two engines' processes and the cores they were launched on."""

    pids: dict[str, int]
    cores: dict[str, list[int]]
    is_swapped: bool = False
    moved: dict[str, int] = field(default_factory=dict)  # threads moved at the last change, per role

    @classmethod
    def of(cls, engines: dict[str, Any]) -> "Placement | None":
        """For two quantlab-launched CPU engines bound to disjoint cores of one size; None
        otherwise (endpoints, GPUs, vLLM's own binding): nothing to swap."""
        pids, cores = {}, {}
        for role in ROLES:
            server = engines.get(role)
            proc = getattr(server, "proc", None)
            plan = getattr(server, "plan", None)
            bind = parse_cpus((plan.env if plan is not None else {}).get("VLLM_CPU_OMP_THREADS_BIND"))
            if proc is None or bind is None:
                return None
            pids[role], cores[role] = proc.pid, bind
        if swap_map(cores["baseline"], cores["candidate"]) is None:
            return None
        return cls(pids, cores)

    def where(self, role: str) -> list[int]:
        other = ROLES[1 - ROLES.index(role)]
        return self.cores[other] if self.is_swapped else self.cores[role]

    def put(self, swap: bool) -> bool:
        """Move both engines to the placement asked for; False when no thread could be
        moved (then the placement is as launched, and said so)."""
        if swap == self.is_swapped:
            return True
        mapping = swap_map(self.cores["baseline"], self.cores["candidate"])
        assert mapping is not None
        self.moved = {role: _move_tree(self.pids[role], set(self.where(role)), mapping) for role in ROLES}
        if not all(self.moved.values()):
            if any(self.moved.values()):  # half a swap would put both on the same cores: undo it
                for role in ROLES:
                    _move_tree(self.pids[role], {mapping[c] for c in self.where(role)}, mapping)
            return False
        self.is_swapped = swap
        return True

    def line(self) -> str:
        return ", ".join(f"{role} on CPU {','.join(map(str, self.where(role)))}" for role in ROLES)


def _move_tree(pid: int, within: set[int], mapping: dict[int, int]) -> int:
    """Every thread of the process tree at `pid` whose affinity lies within `within`,
    moved through `mapping`. Returns how many moved."""
    import psutil

    moved = 0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    for proc in procs:
        try:
            threads = proc.threads()
        except psutil.Error:
            continue
        for t in threads:
            try:
                now = os.sched_getaffinity(t.id)
                if now and now <= within:
                    os.sched_setaffinity(t.id, {mapping[c] for c in now})
                    moved += 1
            except (OSError, KeyError):
                continue
    return moved
