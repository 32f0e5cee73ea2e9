"""Behave as a poorer CPU kind on a richer one, for tests and benchmarks: the machines this
project runs on include AVX2-only EPYCs (QUANTLAB_EMULATE_CPU=avx2: vLLM's `_C_AVX2`, which
has no W4A16 kernel, and torch emulating bf16) and AVX-512 hosts without BF16
(QUANTLAB_EMULATE_CPU=avx512: vLLM's `_C_AVX512`, torch emulating bf16).

Three levers, all set through the environment of the processes concerned:
- ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA hold torch's and oneDNN's kernels to the
  kind's instruction set (read when torch loads: set before it is imported, so in this
  process by the CLI's entry point and in every child through its environment);
- the serving environment's Python gets `serving/cpu_emulation/sitecustomize.py` on its
  path, which makes torch report what the kind lacks (AVX-512, its BF16, AMX), so vLLM
  loads that kind's kernel library.
"""

from __future__ import annotations

import functools
import os
from collections.abc import MutableMapping
from pathlib import Path

VARIABLE = "QUANTLAB_EMULATE_CPU"
SITE_DIR = Path(__file__).resolve().parents[1] / "serving" / "cpu_emulation"
# what each kind's torch and oneDNN may use; AVX512_CORE_VNNI is oneDNN's AVX-512 level below BF16
KINDS = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"},
}
TORCH_VARIABLES = tuple(KINDS["avx2"])  # the same two for every kind
# The variables that change which kernels torch, oneDNN and vLLM use: part of every key
# that caches something measured or chosen on this host.
KERNEL_VARIABLES = (VARIABLE, *TORCH_VARIABLES)


# what the host must have for each kind: a poorer kind is emulated on a richer CPU, never the reverse
NEEDS = {"avx2": "avx2", "avx512": "avx512f"}


def emulated(env: MutableMapping[str, str] | None = None) -> str | None:
    value = (env if env is not None else os.environ).get(VARIABLE, "").strip().lower()
    if value in ("", "0", "none", "native"):
        return None
    if value not in KINDS:
        from quantlab.core.errors import RecipeError

        raise RecipeError(f"{VARIABLE}={value!r} is not understood; the CPU kinds quantlab can emulate are "
                          f"'avx2' (AVX2 only) and 'avx512' (AVX-512 without BF16); unset it to run natively")
    flags = _host_flags()
    if flags and NEEDS[value] not in flags:
        from quantlab.core.errors import RecipeError

        raise RecipeError(f"{VARIABLE}={value} emulates a poorer CPU on a richer one, but this CPU has no "
                          f"{NEEDS[value]}: unset it (this host is already poorer than that kind)")
    return value


@functools.cache
def _host_cpu() -> tuple[str | None, frozenset[str]]:
    """This CPU's model name and flags from /proc/cpuinfo (None and empty where it cannot be read)."""
    model, flags = None, frozenset()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model is None:
                model = line.split(":", 1)[1].strip()
            elif line.startswith(("flags", "Features")) and not flags:
                flags = frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return model, flags


def _host_flags() -> frozenset[str]:
    return _host_cpu()[1]


def apply(env: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """Add the emulation's variables to `env` (a child's environment, or os.environ before
    torch is imported). Does nothing unless QUANTLAB_EMULATE_CPU asks for it."""
    kind = emulated(env)
    if kind is None:
        return env
    for key, value in KINDS[kind].items():
        env[key] = value  # the kind's own limits, also over another kind's a parent passed down
    path = env.get("PYTHONPATH", "")
    if str(SITE_DIR) not in path.split(os.pathsep):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE_DIR), path) if p)
    return env


def kernel_environment(env: MutableMapping[str, str] | None = None) -> dict[str, str | None]:
    env = env if env is not None else os.environ
    return {v: env.get(v) for v in KERNEL_VARIABLES}


def cache_hardware(probe: dict) -> dict:
    """The hardware part of a cached result's key: the probe's CPU and GPUs, and under an
    emulation the kind's variables (the CPU is the same, the kernels are not). Natively the
    same dict as before emulations existed, so native entries keep their keys."""
    hardware = {"cpu": probe.get("cpu"), "gpus": probe.get("gpus")}
    if emulated():
        hardware["emulated"] = kernel_environment()
    return hardware


def host_kernel_identity() -> dict[str, object]:
    """What decides which kernels (and so which dtype is fast) this host runs: the CPU
    model and flags, and the variables above. For cache keys of what 'auto' chose."""
    import hashlib

    model, flag_set = _host_cpu()
    flags = " ".join(sorted(flag_set))
    return {"cpu": model, "flags_sha256": hashlib.sha256(flags.encode()).hexdigest()[:16],
            "env": kernel_environment()}
