"""Behave as an AVX2-only host on a richer CPU (QUANTLAB_EMULATE_CPU=avx2), for tests and
benchmarks: the machines this project runs on include AVX2-only EPYCs whose vLLM build has
no W4A16 kernel and whose torch emulates bf16.

Three levers, all set through the environment of the processes concerned:
- ATEN_CPU_CAPABILITY=avx2 and ONEDNN_MAX_CPU_ISA=AVX2 hold torch's and oneDNN's kernels
  to AVX2 (read when torch loads: set before it is imported, so in this process by the
  CLI's entry point and in every child through its environment);
- the serving environment's Python gets `serving/cpu_emulation/sitecustomize.py` on its
  path, which makes torch report no AVX-512/AMX, so vLLM loads `_C_AVX2`.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path

VARIABLE = "QUANTLAB_EMULATE_CPU"
SITE_DIR = Path(__file__).resolve().parents[1] / "serving" / "cpu_emulation"
TORCH_LIMITS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
# The variables that change which kernels torch, oneDNN and vLLM use: part of every key
# that caches something measured or chosen on this host.
KERNEL_VARIABLES = (VARIABLE, *TORCH_LIMITS)


def emulated(env: MutableMapping[str, str] | None = None) -> str | None:
    value = (env if env is not None else os.environ).get(VARIABLE, "").strip().lower()
    if value in ("", "0", "none", "native"):
        return None
    if value != "avx2":
        from quantlab.core.errors import RecipeError

        raise RecipeError(f"{VARIABLE}={value!r} is not understood; the one CPU kind quantlab can emulate is "
                          f"'avx2' (unset it to run natively)")
    return value


def apply(env: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """Add the emulation's variables to `env` (a child's environment, or os.environ before
    torch is imported). Does nothing unless QUANTLAB_EMULATE_CPU asks for it."""
    if emulated(env) is None:
        return env
    for key, value in TORCH_LIMITS.items():
        env.setdefault(key, value)
    path = env.get("PYTHONPATH", "")
    if str(SITE_DIR) not in path.split(os.pathsep):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE_DIR), path) if p)
    return env


def kernel_environment(env: MutableMapping[str, str] | None = None) -> dict[str, str | None]:
    env = env if env is not None else os.environ
    return {v: env.get(v) for v in KERNEL_VARIABLES}


def host_kernel_identity() -> dict[str, object]:
    """What decides which kernels (and so which dtype is fast) this host runs: the CPU
    model and flags, and the variables above. For cache keys of what 'auto' chose."""
    import hashlib

    model, flags = None, ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model is None:
                model = line.split(":", 1)[1].strip()
            elif line.startswith(("flags", "Features")) and not flags:
                flags = " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return {"cpu": model, "flags_sha256": hashlib.sha256(flags.encode()).hexdigest()[:16],
            "env": kernel_environment()}
