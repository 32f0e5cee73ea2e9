"""Crossover placement: the two engines swap cores every second repeat, and back."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from quantlab.performance.placement import Placement, parse_cpus, swap_map, swapped
from quantlab.performance.stage import _schedule


def test_each_role_gets_each_core_and_each_position_over_a_pair_of_repeats():
    ctx = SimpleNamespace(recipe=SimpleNamespace(serve=SimpleNamespace(side_by_side=True)))
    order, interleaved = _schedule(ctx, 4)
    assert interleaved
    first = {rep: role for rep, role in reversed(order)}  # who goes first in each repeat
    assert [first[r] for r in range(4)] == ["baseline", "candidate", "baseline", "candidate"]
    assert [swapped(r) for r in range(4)] == [False, True, False, True]
    # over each pair: the baseline goes first once and second once, on its own cores once and on the other's once
    for pair in ((0, 1), (2, 3)):
        assert {(first[r] == "baseline", swapped(r)) for r in pair} == {(True, False), (False, True)}


def test_bind_strings_and_the_swap():
    assert parse_cpus("0,2-3") == [0, 2, 3] and parse_cpus("auto") is None and parse_cpus(None) is None
    assert parse_cpus("x") is None
    assert swap_map([0], [1]) == {0: 1, 1: 0} and swap_map([0, 1], [2, 3]) == {0: 2, 1: 3, 2: 0, 3: 1}
    assert swap_map([0], [0]) is None and swap_map([0], [1, 2]) is None
    assert Placement.of({"baseline": SimpleNamespace(proc=None, plan=None)}) is None


def _pinned_child(cpu: int) -> subprocess.Popen:
    """A process with a worker thread, all pinned to one CPU (as vLLM pins its OMP threads)."""
    code = ("import os, threading, time\nos.sched_setaffinity(0, {%d})\n"
            "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\nprint('up', flush=True)\n"
            "time.sleep(60)\n" % cpu)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    return proc


def _affinities(pid: int) -> set[frozenset[int]]:
    return {frozenset(os.sched_getaffinity(int(t))) for t in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs two CPUs this process may use, to move threads between them")
def test_the_engines_threads_move_to_each_others_cores_and_back():
    a, b = sorted(os.sched_getaffinity(0))[:2]
    procs = {"baseline": _pinned_child(a), "candidate": _pinned_child(b)}
    try:
        engines = {role: SimpleNamespace(proc=p, plan=SimpleNamespace(env={"VLLM_CPU_OMP_THREADS_BIND": str(c)}))
                   for (role, p), c in zip(procs.items(), (a, b))}
        placement = Placement.of(engines)
        assert placement is not None and placement.cores == {"baseline": [a], "candidate": [b]}
        assert placement.put(True) and placement.is_swapped and all(n >= 2 for n in placement.moved.values())
        assert _affinities(procs["baseline"].pid) == {frozenset({b})}
        assert _affinities(procs["candidate"].pid) == {frozenset({a})}
        assert placement.line() == f"baseline on CPU {b}, candidate on CPU {a}"
        assert placement.put(False) and not placement.is_swapped
        assert _affinities(procs["baseline"].pid) == {frozenset({a})}
    finally:
        for p in procs.values():
            p.kill()
            p.wait(timeout=10)
