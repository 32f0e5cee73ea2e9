"""Which dtype to compute in on this host: the recipe's, or float32 where 16-bit floats
are emulated. Pure: the speeds come from a measurement (`quantize/dtype_speed.py`, run
in-process for calibration and inside the serving-environment probe for serving).

Why measured, not looked up: on a CPU without bf16 instructions torch emulates bf16
(a bf16 matmul of the default model's shapes took 5.8x the float32 time on a 2-core
AVX2-only EPYC), while on a Xeon with AMX bf16 is about twice as fast as float32. The
CPU flags tell part of it, but oneDNN and ATen can be held to a lower ISA by the
environment (ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY); the measurement sees what runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantlab.core.fsutil import safetensors_bytes

SIXTEEN_BIT = ("bfloat16", "float16")
# float32 is chosen only when the 16-bit matmul is clearly slower: emulated bf16 measured
# 5.8x slower (AVX2 EPYC, 512x576 @ 576x1536) to 100x (its probe's shape), native
# bf16 7x faster (AMX Xeon: 0.08 against 0.47-0.66 ms). A busy host has measured bf16 1.6x
# "slower" (4.2 against 6.7 ms, two test suites on 2 cores), so the bar is well above noise.
SLOWER_BY = 3.0
# float32 doubles the weights of a 16-bit model; keep that within this share of the
# memory the host has free (the rest is activations, the KV cache, the other process).
MEMORY_SHARE = 0.5


@dataclass(frozen=True)
class DtypeChoice:
    dtype: str  # what to compute in
    requested: str  # what the recipe says ("auto" or a dtype)
    model_dtype: str  # the recipe's model.dtype: what a checkpoint is exported in
    reason: str  # one line, for the record, the progress line and the report

    @property
    def changed(self) -> bool:
        return self.dtype != self.model_dtype

    def as_record(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "requested": self.requested, "model_dtype": self.model_dtype,
                "reason": self.reason}


def float32_bytes(model_dirs: list[Path], model_dtype: str) -> int | None:
    """What the weights in these folders take in float32, from their safetensors sizes."""
    weights = safetensors_bytes(*model_dirs)
    return weights * 4 // (2 if model_dtype in SIXTEEN_BIT else 4) if weights else None


def choose_dtype(requested: str, model_dtype: str, *, device: str, speed: dict[str, Any] | None,
                 float32_bytes: int | None = None, available_bytes: int | None = None) -> DtypeChoice:
    """`requested` is a dtype (used as given) or 'auto': the model's dtype, except on a CPU
    where its 16-bit matmul measured slower than float32 and float32 weights fit.

    `speed` is a dtype_speed measurement: {"ms": {"float32": .., "bfloat16": ..}, ...}."""
    def pick(dtype: str, reason: str) -> DtypeChoice:
        return DtypeChoice(dtype, requested, model_dtype, reason)

    if requested != "auto":
        return pick(requested, f"{requested} as the recipe sets it")
    if model_dtype not in SIXTEEN_BIT:
        return pick(model_dtype, f"{model_dtype}: the model's dtype")
    if device != "cpu":
        return pick(model_dtype, f"{model_dtype}: the model's dtype ({device} computes 16-bit floats natively)")
    ms = (speed or {}).get("ms") or {}
    fast, slow = ms.get("float32"), ms.get(model_dtype)
    if not fast or not slow:
        why = (speed or {}).get("error") or "not measured"
        return pick(model_dtype, f"{model_dtype}: the model's dtype (the CPU's {model_dtype} speed is unknown: {why})")
    ratio = slow / fast
    measured = f"a {model_dtype} matmul took {ratio:.1f}x the float32 time on this CPU"
    if ratio < SLOWER_BY:
        return pick(model_dtype, f"{model_dtype}: the model's dtype ({measured})")
    if float32_bytes and available_bytes and float32_bytes > MEMORY_SHARE * available_bytes:
        return pick(model_dtype, f"{model_dtype}: the model's dtype although {measured}, because float32 "
                    f"weights ({float32_bytes / 2**30:.1f} GiB) would not fit in half the free memory "
                    f"({available_bytes / 2**30:.1f} GiB)")
    return pick("float32", f"float32 instead of {model_dtype}: {measured} (no native {model_dtype})")
