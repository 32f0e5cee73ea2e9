"""The CPU-kind emulation's environment: which variables each kind sets, and a clear error
for a kind it does not know."""

import pytest

from quantlab.core import cpu_emulation
from quantlab.core.errors import RecipeError


@pytest.mark.parametrize(("kind", "aten", "onednn"), [("avx2", "avx2", "AVX2"),
                                                      ("avx512", "avx512", "AVX512_CORE_VNNI")])
def test_each_kind_holds_torch_and_onednn_to_its_instruction_set(kind, aten, onednn, monkeypatch):
    monkeypatch.setattr(cpu_emulation, "_host_flags", lambda: frozenset({"avx2", "avx512f"}))  # any host
    env = cpu_emulation.apply({"QUANTLAB_EMULATE_CPU": kind.upper(), "PYTHONPATH": "/elsewhere"})
    assert env["ATEN_CPU_CAPABILITY"] == aten
    assert env["ONEDNN_MAX_CPU_ISA"] == onednn
    # the site folder that makes the serving Python's torch report the poorer CPU comes first
    assert env["PYTHONPATH"].split(":") == [str(cpu_emulation.SITE_DIR), "/elsewhere"]


def test_native_changes_nothing():
    env = {"QUANTLAB_EMULATE_CPU": "native"}
    assert cpu_emulation.apply(dict(env)) == env
    assert cpu_emulation.emulated({}) is None


def test_an_unknown_kind_names_the_ones_it_knows():
    with pytest.raises(RecipeError, match="'avx2' .*'avx512'"):
        cpu_emulation.emulated({"QUANTLAB_EMULATE_CPU": "amx"})


def test_a_kind_asked_by_a_child_replaces_the_parents_limits(monkeypatch):
    monkeypatch.setattr(cpu_emulation, "_host_flags", lambda: frozenset({"avx2", "avx512f"}))
    parent = cpu_emulation.apply({"QUANTLAB_EMULATE_CPU": "avx512"})
    child = cpu_emulation.apply({**parent, "QUANTLAB_EMULATE_CPU": "avx2"})
    assert (child["ATEN_CPU_CAPABILITY"], child["ONEDNN_MAX_CPU_ISA"]) == ("avx2", "AVX2")
    assert child["PYTHONPATH"] == str(cpu_emulation.SITE_DIR)  # once


def test_a_kind_richer_than_the_host_is_refused(monkeypatch):
    monkeypatch.setattr(cpu_emulation, "_host_flags", lambda: frozenset({"avx", "avx2", "fma"}))
    assert cpu_emulation.emulated({"QUANTLAB_EMULATE_CPU": "avx2"}) == "avx2"
    with pytest.raises(RecipeError, match="no avx512f"):
        cpu_emulation.emulated({"QUANTLAB_EMULATE_CPU": "avx512"})


def test_an_emulated_kind_has_cache_keys_of_its_own(monkeypatch):
    probe = {"cpu": {"model": "AMD EPYC"}, "gpus": []}
    monkeypatch.delenv("QUANTLAB_EMULATE_CPU", raising=False)
    assert cpu_emulation.cache_hardware(probe) == {"cpu": {"model": "AMD EPYC"}, "gpus": []}  # native keys unchanged
    monkeypatch.setattr(cpu_emulation, "_host_flags", lambda: frozenset({"avx2", "avx512f"}))
    keys = set()
    for kind in ("avx2", "avx512"):
        monkeypatch.setenv("QUANTLAB_EMULATE_CPU", kind)
        for name, value in cpu_emulation.KINDS[kind].items():
            monkeypatch.setenv(name, value)
        hardware = cpu_emulation.cache_hardware(probe)
        assert hardware["emulated"]["QUANTLAB_EMULATE_CPU"] == kind
        keys.add(repr(hardware))
    assert len(keys) == 2
