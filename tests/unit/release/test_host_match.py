"""`quantlab verify --here`: this host against the hosts a release was validated on, by class."""

from __future__ import annotations

import json

import pytest

from quantlab.release.decision import TargetDecision
from quantlab.release.host_match import judge
from quantlab.release.manifest import Manifest

AVX512_BF16 = {"device": "cpu", "gpus": [], "driver": None, "versions": {"vllm": "0.32.0"},
               "cpu": {"model": "AMD EPYC 9R14", "machine": "x86_64", "count": 2},
               "engine_kernels": {"library": "_C", "amx": False}}
H100 = {"device": "cuda", "driver": "580.65.06", "versions": {"vllm": "0.33.0"}, "cpu": {"machine": "x86_64"},
        "gpus": [{"name": "NVIDIA H100 80GB HBM3", "capability": [9, 0]}] * 2, "engine_kernels": {}}


def manifest_on(probe, *, engine_args=None, targets=None, decisions=None) -> Manifest:
    folder_manifest = {"manifest_version": 1, "quantlab": {}, "created_at": "x", "run": {}, "recipe": {}, "model": {},
                       "calibration": None, "quantization": {}, "checkpoint_files": {}, "results": {},
                       "raw_files": [], "gates": [], "decision": {"decision": "release", "why": "w"},
                       "hardware": {k: probe.get(k) for k in ("device", "gpus", "cpu", "driver")},
                       "runtime": {"versions": probe["versions"], "engine_kernels": probe["engine_kernels"],
                                   "engine_args": engine_args or {}, "targets": targets or {}},
                       "targets": decisions or {}}
    return Manifest.model_validate(folder_manifest)


def with_(probe, **changes):
    out = json.loads(json.dumps(probe))
    for path, value in changes.items():
        node = out
        *head, last = path.split("__")
        for key in head:
            node = node[key]
        node[last] = value
    return out


def test_the_same_kind_of_host_is_covered_whatever_its_cpu_model():
    here = with_(AVX512_BF16, cpu__model="AMD EPYC 9654", cpu__count=96)
    verdict = judge(manifest_on(AVX512_BF16), here)
    assert verdict.covered_by == "primary" and verdict.allowed == []


def test_another_isa_is_named_and_can_be_accepted():
    avx2 = with_(AVX512_BF16, engine_kernels__library="_C_AVX2")
    verdict = judge(manifest_on(AVX512_BF16), avx2)
    assert verdict.covered_by is None
    [d] = verdict.differences["primary"]
    assert d.name == "cpu-kernel-library" and "AVX-512 with BF16" in d.line() and "_C_AVX2 (AVX2 only)" in d.line()
    assert judge(manifest_on(AVX512_BF16), avx2, allow=("cpu-kernel-library",)).covered_by == "primary"


def test_amx_and_the_exact_vllm_version_are_classes_too():
    amx = with_(AVX512_BF16, engine_kernels__amx=True, versions__vllm="0.32.1")
    names = {d.name for d in judge(manifest_on(AVX512_BF16), amx).differences["primary"]}
    assert names == {"amx", "vllm-version"}


def test_gpu_classes_model_capability_count_and_driver_major():
    assert judge(manifest_on(H100), with_(H100, driver="580.95.05")).covered_by == "primary"  # same major
    one_a100 = with_(H100, gpus=[{"name": "NVIDIA A100-SXM4-80GB", "capability": [8, 0]}], driver="550.54.15")
    diffs = judge(manifest_on(H100, engine_args={"tensor_parallel_size": 2}), one_a100).differences["primary"]
    assert {d.name for d in diffs} == {"gpu-model", "compute-capability", "gpu-count", "driver-major"}
    assert judge(manifest_on(H100), AVX512_BF16).differences["primary"][0].name == "device"


def test_a_host_that_matches_a_released_extra_target_is_covered():
    avx2 = with_(AVX512_BF16, engine_kernels__library="_C_AVX2")
    target = {"device": "cpu", "cpu": avx2["cpu"], "gpus": [], "versions": avx2["versions"],
              "engine_kernels": avx2["engine_kernels"], "engine_args": {}}
    released = {"avx2": TargetDecision(decision="release", required=False, why="w")}
    assert judge(manifest_on(AVX512_BF16, targets={"avx2": target}, decisions=released), avx2).covered_by == "avx2"
    blocked = {"avx2": TargetDecision(decision="blocked", required=False, why="w")}
    assert judge(manifest_on(AVX512_BF16, targets={"avx2": target}, decisions=blocked), avx2).covered_by is None


def test_an_endpoint_release_covers_no_host_and_unknown_allow_names_are_refused():
    endpoint = manifest_on(with_(AVX512_BF16, device="unknown"))
    [d] = judge(endpoint, AVX512_BF16).differences["primary"]
    assert d.name == "hardware-unknown"
    with pytest.raises(ValueError, match="not a class"):
        judge(manifest_on(AVX512_BF16), AVX512_BF16, allow=("cpu-model",))


def test_a_server_quantlab_did_not_launch_covers_no_host_whatever_the_recipe_said():
    """serve.mode command with device cuda: the manifest holds the recipe's device, but nothing was probed."""
    m = manifest_on(H100)
    m.runtime["mode"] = "command"
    [d] = judge(m, H100).differences["primary"]
    assert d.name == "hardware-unknown" and "serve.mode command" in d.line()


def test_a_released_cuda_extra_target_is_matched_by_its_gpu_and_driver():
    target = {"mode": "launch", "device": "cuda", "gpus": H100["gpus"], "driver": H100["driver"],
              "cpu": H100["cpu"], "versions": H100["versions"], "engine_kernels": {},
              "engine_args": {"tensor_parallel_size": 2}}
    released = {"h100": TargetDecision(decision="release", required=False, why="w")}
    m = manifest_on(AVX512_BF16, targets={"h100": target}, decisions=released)
    assert judge(m, H100).covered_by == "h100"
    diffs = judge(m, with_(H100, driver="550.1")).differences
    assert [d.name for d in diffs["h100"]] == ["driver-major"] and diffs["primary"][0].name == "device"


def test_accepting_another_device_still_compares_the_engine_version():
    m = manifest_on(H100)
    assert judge(m, AVX512_BF16, allow=("device",)).covered_by is None  # vLLM 0.33.0 there, 0.32.0 here
    assert judge(m, with_(AVX512_BF16, versions__vllm="0.33.0"), allow=("device",)).covered_by == "primary"
