"""The CPU-kind emulation's environment: which variables each kind sets, and a clear error
for a kind it does not know."""

import pytest

from quantlab.core import cpu_emulation
from quantlab.core.errors import RecipeError


@pytest.mark.parametrize(("kind", "aten", "onednn"), [("avx2", "avx2", "AVX2"),
                                                      ("avx512", "avx512", "AVX512_CORE_VNNI")])
def test_each_kind_holds_torch_and_onednn_to_its_instruction_set(kind, aten, onednn):
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
