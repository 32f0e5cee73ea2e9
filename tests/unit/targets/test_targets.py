"""Several serve targets: the merged serve section per target, planning (an optional
target that cannot serve is recorded, a required one refused), the targets' own gates,
per-target decisions, and a manifest whose target decision does not follow its gates."""

from __future__ import annotations

import json

import pytest

from quantlab.core.errors import RecipeError
from quantlab.recipe.file import parse_recipe
from quantlab.recipe.serve import ServeSpec
from quantlab.core.results import TargetOutcome
from quantlab.serving.plan import plan_extra_target
from quantlab.targets.gates import verdicts as judge

CPU_PROBE = {"device": "cpu", "versions": {"compressed-tensors": "0.17.0"}, "gpus": []}


def write_ckpt(folder, bits):
    folder.mkdir()
    qc = {"quant_method": "compressed-tensors", "config_groups": {
        "g": {"weights": {"type": "int", "num_bits": bits, "strategy": "group"}, "input_activations": None}}}
    (folder / "config.json").write_text(json.dumps({"quantization_config": qc}))
    (folder / "model.safetensors").write_bytes(b"x")
    return folder


def test_a_target_is_the_serve_section_with_its_overrides():
    spec = ServeSpec(engine_args={"max_model_len": 512, "max_num_seqs": 8}, env={"A": "1"}, targets=[
        {"name": "eager", "engine_args": {"enforce_eager": True, "max_num_seqs": None}, "env": {"B": "2"}},
        {"name": "ext", "mode": "endpoint", "endpoint": "http://127.0.0.1:9000", "roles": ["candidate"]}])
    eager = spec.for_target(spec.targets[0])
    assert eager.engine_args == {"max_model_len": 512, "enforce_eager": True}  # null removed the key
    assert eager.env == {"A": "1", "B": "2"} and eager.mode == "launch" and eager.targets == []
    ext = spec.for_target(spec.targets[1])
    assert ext.mode == "endpoint" and ext.endpoint == "http://127.0.0.1:9000"
    assert spec.targets[0].required and spec.targets[1].roles == ["candidate"]


@pytest.mark.parametrize("targets, message", [
    ([{"name": "primary"}], "not 'primary'"),
    ([{"name": "a"}, {"name": "a"}], "must be unique"),
    ([{"name": "ext", "mode": "endpoint"}], "targets[0] ('ext'), once merged over the serve section"),
    ([{"name": "bad name"}], "name"),
    ([{"name": "x", "roles": []}], "roles"),
])
def test_bad_targets_are_refused_naming_the_target(targets, message):
    with pytest.raises(RecipeError) as err:
        parse_recipe({"name": "t", "model": {"source": "x"}, "quantization": {"method": "rtn", "scheme": "W4A16"},
                      "serve": {"targets": targets}})
    assert message in str(err.value) and "serve" in str(err.value)


def test_an_optional_target_that_cannot_serve_is_recorded_and_a_required_one_refused(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    (base / "model.safetensors").write_bytes(b"x")
    w8 = write_ckpt(tmp_path / "w8", 8)
    spec = ServeSpec(targets=[{"name": "gpu", "device": "cuda", "required": False},
                              {"name": "cpu2", "required": False, "roles": ["candidate"]}])
    gpu = plan_extra_target(spec, spec.targets[0], baseline_dir=base, candidate_dir=w8, dtype="bfloat16",
                            probe=CPU_PROBE)
    assert gpu.plan is None and "sees no GPU" in gpu.unservable
    cpu2 = plan_extra_target(spec, spec.targets[1], baseline_dir=base, candidate_dir=w8, dtype="bfloat16",
                             probe=CPU_PROBE)
    assert cpu2.plan is None and "cannot be served here" in cpu2.unservable
    required = ServeSpec(targets=[{"name": "cpu2", "roles": ["candidate"]}])
    with pytest.raises(RecipeError) as err:
        plan_extra_target(required, required.targets[0], baseline_dir=base, candidate_dir=w8, dtype="bfloat16",
                          probe=CPU_PROBE)
    assert "serve target 'cpu2' (required; set required: false" in str(err.value)
    ok = plan_extra_target(required, required.targets[0], baseline_dir=base,
                           candidate_dir=write_ckpt(tmp_path / "w4", 4), dtype="bfloat16", probe=CPU_PROBE)
    assert ok.plan is not None and [t.role for t in ok.plan.targets] == ["candidate"]
    assert ok.plan.label("candidate") == "candidate@cpu2"


def outcome(**kw):
    base = {"name": "t", "required": True, "roles": ["baseline", "candidate"], "status": "checked", "mode": "launch",
            "errors": {"baseline": 0, "candidate": 0}}
    return TargetOutcome(**{**base, **kw})


def test_target_gates():
    target = ServeSpec(targets=[{"name": "t", "max_mismatch": 0.5}]).targets[0]
    v = {g.gate: g for g in judge(outcome(cross_mismatch_rate={"baseline": 0.25, "candidate": 0.375}), target)}
    assert v["max_mismatch_excess"].verdict == "pass" and v["max_mismatch_excess"].value == pytest.approx(0.125)
    assert v["max_mismatch"].verdict == "pass" and v["max_request_errors"].verdict == "pass"
    assert all(g.target == "t" and g.scope == "t" for g in v.values())
    v = {g.gate: g for g in judge(outcome(cross_mismatch_rate={"baseline": 0.0, "candidate": 0.75},
                                          errors={"candidate": 2}), target)}
    assert v["max_mismatch_excess"].verdict == "fail" and v["max_mismatch"].verdict == "fail"
    assert v["max_request_errors"].verdict == "fail" and "candidate 2" in v["max_request_errors"].evidence
    v = {g.gate: g for g in judge(outcome(roles=["candidate"], cross_mismatch_rate={"candidate": 0.0}), target)}
    assert v["max_mismatch_excess"].verdict == "inconclusive"  # no baseline on this target
    [v] = judge(outcome(status="unservable", reason="no kernel for W8A16 on cpu"), target)
    assert v.gate == "servable" and v.verdict == "fail" and "no kernel" in v.evidence
    [v] = judge(outcome(status="not_started", reason="exited with code 1"), target)
    assert v.gate == "started" and v.verdict == "fail"
