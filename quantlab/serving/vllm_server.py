"""One vLLM engine process (or an external endpoint) and its HTTP handle.

`VLLMServer` is a context manager: a free port, a deadline for /health, fail-fast if
the process exits, and on exit the whole process group is stopped (SIGTERM, then
SIGKILL) so no engine process is left behind, also on Ctrl-C. quantlab talks to vLLM
only as a subprocess and over HTTP: vLLM lives in its own environment (.venv-vllm)
because it pins another compressed-tensors.

A server quantlab launches is closed to everyone else on the host: a random API key for
the run in the child's VLLM_API_KEY (not argv: `ps` shows argv to every user), a guard
middleware that asks it on every path but /health (engine_guard/), and after /health
answers, a check that the port's listener is the engine's own process group (another
process may take the port between quantlab's pick and vLLM's bind).
"""

from __future__ import annotations

import contextlib
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

from quantlab.core import cpu_emulation, redact
from quantlab.serving.engine_log import diagnose_failure, startup_phase
from quantlab.core.engine_time import engine_busy
from quantlab.core.process_death import die_with_parent
from quantlab.serving.vllm_probe import serving_python
from quantlab.core.errors import EngineError, RecipeError
from quantlab.core.layout import cache_dir
from quantlab.core.progress import Progress, step
from quantlab.recipe.serve import ServeSpec
from quantlab.serving import api_keys
from quantlab.serving.listener import owned_by_group
from quantlab.serving.plan import ServingPlan, engine_arg_list

LOG_TAIL_LINES = 40
GUARD_DIR = Path(__file__).resolve().parent / "engine_guard"
GUARD_MIDDLEWARE = "quantlab_engine_guard.Guard"


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
    api_key: str | None = None  # in env only (VLLM_API_KEY), never in argv, a log or a record
    host: str = "127.0.0.1"
    check_listener: bool = False  # launch mode: the port's listener must be the child's own group
    secrets: list[str] | None = None  # values scrubbed from the server's log (secret engine args, env)

    def __repr__(self) -> str:  # a plan printed in a traceback or a log shows no key
        return f"LaunchPlan(argv={self.argv!r}, base_url={self.base_url!r}, served_name={self.served_name!r})"


def log_secrets(spec: ServeSpec, engine_args: dict[str, Any], key: str | None) -> list[str]:
    """Values that must not stay in a server log: the key, secret-looking engine arguments and env values."""
    values = [str(v) for k, v in engine_args.items() if isinstance(v, str)
              and (redact.secret_name(k) or redact.secret_value(v))]
    values += [v for k, v in spec.env.items() if redact.secret_name(k) or redact.secret_value(v)]
    return values + ([key] if key else [])


def plan_launch(spec: ServeSpec, model: Path, served_name: str, device: str, engine_args: dict[str, Any],
                *, port: int | None = None, python: Path | None = None, cpu_bind: str | None = None) -> LaunchPlan:
    """`cpu_bind`: the cores this engine's threads compute on (see cpu_cores), unless the
    environment or serve.env names them."""
    host = spec.host
    port = port or free_port(host)
    env = cpu_emulation.apply(dict(os.environ))
    if device == "cpu":
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{spec.cpu_kv_cache_space_gib:g}")
        # A persistent torch.compile cache under quantlab's cache folder. vllm-cpu 0.32's default
        # AOT artifact fails to load on the next start ("Compiling model again due to a load
        # failure"), so every start recompiled; its inductor cache loads (start 149 s -> 50 s
        # measured on SmolLM2-135M). vLLM keys the cache by model, config and version.
        env.setdefault("VLLM_USE_AOT_COMPILE", "0")
        # a graph compiled against one kernel library calls its ops by name: an emulated kind
        # (which loads _C_AVX2 or _C_AVX512) must not reuse what this CPU's own library compiled
        emulated = cpu_emulation.emulated(env)
        env.setdefault("VLLM_CACHE_ROOT", str(cache_dir() / (f"vllm-emulated-{emulated}" if emulated else "vllm")))
        if cpu_bind:
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_bind)
    inherited_path = env.get("PYTHONPATH", "")
    env.update(spec.env)
    if spec.env.get("PYTHONPATH") and inherited_path:
        # serve.env's folders first, then what quantlab put there (the CPU emulation's sitecustomize):
        # replacing it would silently serve the host's own CPU kind
        env["PYTHONPATH"] = os.pathsep.join((spec.env["PYTHONPATH"], inherited_path))
    # the run's key: the user's for a command whose server expects one, else a random one
    key = (api_keys.user_key(spec) if spec.mode == "command" else None) or api_keys.new_key()
    env["VLLM_API_KEY"] = key
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
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(GUARD_DIR), env.get("PYTHONPATH", "")) if p)
        argv = [str(python or serving_python(spec)), "-m", "vllm.entrypoints.openai.api_server",
                "--model", str(model), "--served-model-name", served_name,
                "--host", host, "--port", str(port), "--middleware", GUARD_MIDDLEWARE, *extra]
    url_host = f"[{host}]" if ":" in host else host
    return LaunchPlan(argv, env, f"http://{url_host}:{port}", served_name, port, api_key=key, host=host,
                      check_listener=spec.mode == "launch", secrets=log_secrets(spec, engine_args, key))


def _tail(path: Path, lines: int = LOG_TAIL_LINES, secrets_: list[str] | None = None) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no server log)"
    return redact.scrub_text("\n".join(text[-lines:]), secrets_ or [])


class VLLMServer:
    """One engine process (or an existing endpoint) with a deadline on every wait."""

    def __init__(self, plan: LaunchPlan | None, *, log_path: Path, startup_timeout_s: float,
                 shutdown_timeout_s: float = 30, endpoint: str | None = None, served_name: str | None = None,
                 role: str = "candidate", api_key: str | None = None):
        self.plan = plan
        self.log_path = Path(log_path)
        self.startup_timeout_s = startup_timeout_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self.base_url = (endpoint or (plan.base_url if plan else "")).rstrip("/")
        self.served_name = served_name or (plan.served_name if plan else None)
        self.role = role
        self.api_key = api_key or (plan.api_key if plan else None)
        self._secrets = (plan.secrets if plan else None) or ([self.api_key] if self.api_key else [])
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

    @property
    def headers(self) -> dict[str, str]:
        """The Authorization header every request to this server carries: its own key, or the
        key registered for its URL (an endpoint that is a server of this process); none: no key."""
        key = self.api_key or api_keys.key_for(self.base_url)
        return {"Authorization": f"Bearer {key}"} if key else {}

    def start(self) -> None:
        self.started_at = time.monotonic()
        api_keys.register(self.base_url, self.api_key)
        if self.plan is None:
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            try:
                self.proc = subprocess.Popen(self.plan.argv, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, env=self.plan.env,
                                             start_new_session=True,  # own process group: stop kills all
                                             preexec_fn=die_with_parent if os.name == "posix" else None)
            except OSError as err:
                raise EngineError(f"cannot start the {self.role} server ({self.plan.argv[0]}): {err}") from None

    def startup_phase(self) -> str | None:
        """What the starting engine is doing, from its log's tail (None: nothing yet or no log)."""
        if self.plan is None or not self.log_path.is_file():
            return None
        with open(self.log_path, "rb") as f:
            f.seek(max(0, self.log_path.stat().st_size - 16384))
            return startup_phase(f.read().decode("utf-8", "replace"))

    def wait_ready(self, on_wait: Callable[[], None] | None = None) -> None:
        deadline = self.started_at + self.startup_timeout_s
        with engine_busy(), httpx.Client(timeout=5) as client:
            while True:
                self.ensure_alive("while starting")
                if on_wait is not None:
                    on_wait()
                try:
                    if client.get(f"{self.base_url}/health").status_code == 200:
                        self.ready_after_s = round(time.monotonic() - self.started_at, 3)
                        self.ensure_own_listener()
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise EngineError(
                        f"the {self.role} server at {self.base_url} was not healthy within "
                        f"{self.startup_timeout_s:.0f} s (serve.startup_timeout_s). Last log lines "
                        f"({self.log_path}):\n{_tail(self.log_path, secrets_=self._secrets)}")
                time.sleep(0.5)

    def ensure_own_listener(self) -> None:
        """EngineError unless the port that answered /health is held by this engine's own
        process group (the port was free when picked; another process may have bound it
        before vLLM did, and would then see every request and its key)."""
        if self.plan is None or not self.plan.check_listener or self.proc is None:
            return
        owned, seen = owned_by_group(self.plan.host, self.plan.port, self.proc.pid)
        if owned is False:
            self.ensure_alive("while its port was taken by another process")
            raise EngineError(f"the {self.role} server's port {self.plan.port} on {self.plan.host} answers /health, "
                              f"but not from the server quantlab started: {seen}. Another process took the port "
                              "between quantlab's choice and vLLM's bind; nothing was sent to it. Run again (a new "
                              "port is picked) or set serve.port to a port only quantlab uses",
                              cause="the server's port is held by another process")

    def ensure_alive(self, when: str = "") -> None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = _tail(self.log_path, secrets_=self._secrets)
            cause = diagnose_failure(self.log_text())
            hint = ""
            if cause == "the port is already in use":
                hint = f" Port {self.plan.port} is already in use: free it or leave serve.port unset."
            said = f": {cause}" if cause else ""
            raise EngineError(f"the {self.role} server exited with code {self.proc.returncode} {when}{said}.{hint} "
                              f"Last log lines ({self.log_path}):\n{tail}", cause=cause)

    def scrub_log(self) -> None:
        """Secret values out of the stopped server's log (vLLM prints its non-default arguments)."""
        values = [v for v in self._secrets if v and len(v) >= 4]
        if not values or self.plan is None or not self.log_path.is_file():
            return
        text = self.log_path.read_text(errors="replace")
        cleaned = redact.scrub_text(text, values)
        if cleaned != text:
            tmp = self.log_path.with_name(self.log_path.name + ".tmp")
            tmp.write_text(cleaned)
            tmp.replace(self.log_path)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        api_keys.forget(self.base_url, self.api_key)
        if proc is None:
            return
        try:
            self._stop_group(proc)
        finally:
            self.scrub_log()

    def _stop_group(self, proc: subprocess.Popen) -> None:
        if proc.poll() is not None and not _group_alive(proc.pid):
            return
        with engine_busy():  # the engine's shutdown
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
            with engine_busy():
                r = httpx.get(f"{self.base_url}{path}", timeout=timeout, headers=self.headers)
            r.raise_for_status()
            return r.json()
        except httpx.HTTPError as err:
            self.ensure_alive(f"during GET {path}")
            raise EngineError(f"GET {self.base_url}{path} failed: {err}") from None

    def complete(self, prompt: str, *, max_tokens: int = 8, timeout: float = 120, **extra) -> dict[str, Any]:
        body = {"model": self.served_name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
        try:
            with engine_busy():
                r = httpx.post(f"{self.base_url}/v1/completions", json=body, timeout=timeout, headers=self.headers)
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


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False




def prepare_engine(plan: ServingPlan, role: str, *, log_dir: Path, progress: Progress,
                   cpu_bind: str | None = None) -> VLLMServer:
    """The server for one role of a serving plan, not started yet. `cpu_bind`: its own
    cores, where several engines run at once on a CPU host."""
    spec, target, label = plan.spec, plan.target(role), plan.label(role)
    log_path = Path(log_dir) / f"{label}-server.log"
    if spec.mode == "endpoint":
        progress(f"using the external {label} server at {redact.url(plan.endpoint_for(role))}")
        return VLLMServer(None, log_path=log_path, startup_timeout_s=spec.startup_timeout_s,
                          endpoint=plan.endpoint_for(role), served_name=target.served_name, role=label,
                          api_key=api_keys.user_key(spec, role))
    assert target.model_dir is not None and plan.engine_args is not None
    launch = plan_launch(spec, target.model_dir, target.served_name, plan.device, plan.engine_args, port=spec.port,
                         cpu_bind=cpu_bind)
    # what the engine will use: serve.env or the environment may have named other cores
    bound = cpu_bind and plan.device == "cpu"
    cores = f", engine threads on CPU {launch.env['VLLM_CPU_OMP_THREADS_BIND']}" if bound else ""
    progress(f"starting the {label} server: {target.model_dir.name} on {launch.base_url}{cores} (log {log_path})")
    return VLLMServer(launch, log_path=log_path, startup_timeout_s=spec.startup_timeout_s,
                      shutdown_timeout_s=spec.shutdown_timeout_s, role=label)


def wait_healthy(server: VLLMServer, progress: Progress) -> None:
    """Wait for a started server with a progress step (its start-up phase from the log);
    stop it if it fails. Call from the thread that started it."""
    if server.plan is None:
        server.wait_ready()
        return
    try:
        with step(progress, f"{server.role} server start (deadline {server.startup_timeout_s:.0f} s)",
                  heartbeat_s=30, announce=False) as bar:
            server.wait_ready(on_wait=lambda: bar.update(note=server.startup_phase() or ""))
    except BaseException:
        server.stop()
        raise


def start_together(servers: list[VLLMServer], progress: Progress) -> None:
    """Start several servers at once and wait until all are healthy; on any failure all of
    them are stopped. The processes are started from this thread (a server's parent-death
    signal follows the thread that started it), then waited for one by one."""
    try:
        for server in servers:
            server.start()
        for server in servers:
            wait_healthy(server, progress)
    except BaseException:
        for server in servers:
            server.stop()
        raise


@contextlib.contextmanager
def open_engine(plan: ServingPlan, role: str, *, log_dir: Path, progress: Progress) -> Iterator[VLLMServer]:
    """Start (or attach to) the engine for one role of a serving plan; stop it on exit."""
    server = prepare_engine(plan, role, log_dir=log_dir, progress=progress)
    start_together([server], progress)
    try:
        yield server
    finally:
        server.stop()
