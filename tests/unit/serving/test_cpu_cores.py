"""Engine core binding for servers side by side: pure, no server."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantlab.serving.cpu_cores import physical_cores, split_cores, thread_bind
from quantlab.recipe.serve import ServeSpec
from quantlab.serving.vllm_server import plan_launch


def fake_topology(root: Path, cores: dict[int, tuple[int, int]]) -> Path:
    """cpu -> (package, core) as Linux lays it out under /sys/devices/system/cpu."""
    for cpu, (package, core) in cores.items():
        topo = root / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{package}\n")
        (topo / "core_id").write_text(f"{core}\n")
    return root


def test_smt_siblings_count_as_one_core(tmp_path):
    # 4 cores with SMT: CPU i and i+4 are siblings, as Linux numbers them
    sys_cpu = fake_topology(tmp_path, {i: (0, i % 4) for i in range(8)})
    assert physical_cores(list(range(8)), sys_cpu) == [0, 1, 2, 3]
    assert thread_bind(0, 2, cpus=list(range(8)), sys_cpu=sys_cpu) == "0,1"
    assert thread_bind(1, 2, cpus=list(range(8)), sys_cpu=sys_cpu) == "2,3"


def test_two_core_host_gives_a_core_each(tmp_path):
    sys_cpu = fake_topology(tmp_path, {0: (0, 0), 1: (0, 1)})
    assert [thread_bind(s, 2, cpus=[0, 1], sys_cpu=sys_cpu) for s in (0, 1)] == ["0", "1"]


def test_one_core_or_one_engine_keeps_vllms_choice(tmp_path):
    assert thread_bind(0, 2, cpus=[3], sys_cpu=tmp_path) is None
    assert split_cores([0, 1, 2], 1) is None
    assert split_cores([0, 1, 2], 2) == [[0], [1]]  # equal halves: a left-over core stays free
    assert thread_bind(2, 2, cpus=[0, 1], sys_cpu=tmp_path) is None


def test_more_engines_than_cores_share_them_in_turn(tmp_path):
    # a comparison's baseline and three candidates on a 2-core host: two engines a core,
    # not all four on vLLM's one
    sys_cpu = fake_topology(tmp_path, {0: (0, 0), 1: (0, 1)})
    assert [thread_bind(s, 4, cpus=[0, 1], sys_cpu=sys_cpu) for s in range(4)] == ["0", "1", "0", "1"]
    assert split_cores([0, 1, 2], 5) == [[0], [1], [2], [0], [1]]


def test_missing_topology_counts_every_cpu(tmp_path):
    assert physical_cores([5, 2, 7], tmp_path) == [2, 5, 7]


@pytest.mark.parametrize("preset, expected", [(None, "1"), ("0-1", "0-1")])
def test_launch_binds_unless_the_environment_says(monkeypatch, preset, expected):
    if preset is None:
        monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    else:
        monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", preset)
    plan = plan_launch(ServeSpec(), Path("/m"), "c", "cpu", {}, port=1, python=Path("/py"), cpu_bind="1")
    assert plan.env["VLLM_CPU_OMP_THREADS_BIND"] == expected
    spec = ServeSpec(env={"VLLM_CPU_OMP_THREADS_BIND": "nobind"})
    assert plan_launch(spec, Path("/m"), "c", "cpu", {}, port=1, python=Path("/py"), cpu_bind="1").env[
        "VLLM_CPU_OMP_THREADS_BIND"] == "nobind"


def test_cuda_launch_is_not_bound(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    plan = plan_launch(ServeSpec(), Path("/m"), "c", "cuda", {}, port=1, python=Path("/py"), cpu_bind="1")
    assert "VLLM_CPU_OMP_THREADS_BIND" not in plan.env


def test_without_an_affinity_call_every_cpu_counts(monkeypatch, tmp_path):
    monkeypatch.delattr("os.sched_getaffinity", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    assert thread_bind(1, 2, sys_cpu=tmp_path) == "2,3"
