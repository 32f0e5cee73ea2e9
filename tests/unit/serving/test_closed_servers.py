"""A server quantlab starts is closed to the rest of the host: its key in the child's
environment (never argv), a guard on every path but /health, the clients' key by base
URL, serve.host exposure only when asked for, and the port's listener checked to be the
engine's own process group. No vLLM here: the guard is driven as ASGI, the port race with
a stand-in process."""

from __future__ import annotations

import asyncio
import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from quantlab.core.errors import EngineError, RecipeError
from quantlab.recipe.file import parse_recipe
from quantlab.recipe.serve import ServeSpec
from quantlab.serving import api_keys
from quantlab.serving.engine_guard.quantlab_engine_guard import Guard
from quantlab.serving.exposure import exposure, loopback
from quantlab.serving.listener import owned_by_group
from quantlab.serving.plan import EngineTarget, plan_serving
from quantlab.serving.vllm_server import GUARD_MIDDLEWARE, LaunchPlan, VLLMServer, free_port, plan_launch

CPU_PROBE = {"device": "cpu", "versions": {}, "gpus": []}


def test_a_launched_server_gets_a_random_key_in_its_environment_not_its_argv():
    a = plan_launch(ServeSpec(), Path("/m"), "candidate-1a2b3c4d", "cpu", {"max_model_len": 64}, port=1,
                    python=Path("/py"))
    b = plan_launch(ServeSpec(), Path("/m"), "candidate-1a2b3c4d", "cpu", {}, port=1, python=Path("/py"))
    assert a.api_key != b.api_key and len(a.api_key) >= 40
    assert a.env["VLLM_API_KEY"] == a.api_key and not any(a.api_key in arg for arg in a.argv)
    assert a.api_key not in repr(a)  # a plan in a traceback shows no key
    # every path but /health needs the key: vLLM's own check covers /v1 only (/invocations is open)
    assert a.argv[a.argv.index("--middleware") + 1] == GUARD_MIDDLEWARE
    assert a.env["PYTHONPATH"].split(os.pathsep)[0].endswith("engine_guard") and a.check_listener


def test_a_pythonpath_in_serve_env_goes_first_and_keeps_the_cpu_emulation(monkeypatch):
    from quantlab.core.cpu_emulation import SITE_DIR

    monkeypatch.setenv("QUANTLAB_EMULATE_CPU", "avx2")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    launch = plan_launch(ServeSpec(env={"PYTHONPATH": "/mine"}), Path("/m"), "c", "cpu", {}, port=1,
                         python=Path("/py"))
    folders = launch.env["PYTHONPATH"].split(os.pathsep)
    assert folders.index("/mine") < folders.index(str(SITE_DIR))  # the recipe's, then the emulation's
    monkeypatch.delenv("QUANTLAB_EMULATE_CPU")
    plain = plan_launch(ServeSpec(env={"PYTHONPATH": "/mine"}), Path("/m"), "c", "cpu", {}, port=1, python=Path("/py"))
    assert str(SITE_DIR) not in plain.env["PYTHONPATH"] and "/mine" in plain.env["PYTHONPATH"].split(os.pathsep)


def test_serve_env_cannot_set_the_key_and_api_key_env_is_for_servers_quantlab_does_not_start():
    base = {"name": "x", "quantization": {"method": "rtn", "scheme": "W4A16"}}
    with pytest.raises(RecipeError, match="serve.env.VLLM_API_KEY: quantlab gives every server"):
        parse_recipe({**base, "serve": {"env": {"VLLM_API_KEY": "mine"}}})
    with pytest.raises(RecipeError, match="api_key_env names the key of a server quantlab does not start"):
        parse_recipe({**base, "serve": {"api_key_env": "MY_KEY"}})
    spec = parse_recipe({**base, "serve": {"mode": "endpoint", "endpoint": "http://127.0.0.1:9", "api_key_env": "K",
                                           "allow_same_endpoint": True}}).serve
    assert spec.api_key_env == "K"


def test_an_endpoint_key_comes_from_the_named_variable(monkeypatch, tmp_path):
    from quantlab.serving.vllm_server import prepare_engine

    spec = ServeSpec(mode="endpoint", endpoint="http://127.0.0.1:9", api_key_env="QUANTLAB_TEST_KEY",
                     allow_same_endpoint=True)
    plan = plan_serving(spec, [EngineTarget("candidate", None, "c")], dtype="bfloat16", probe=CPU_PROBE)
    monkeypatch.delenv("QUANTLAB_TEST_KEY", raising=False)
    with pytest.raises(RecipeError, match="QUANTLAB_TEST_KEY, which is not set") as err:
        prepare_engine(plan, "candidate", log_dir=tmp_path, progress=lambda m: None)
    assert err.value.field == "serve.api_key_env"
    monkeypatch.setenv("QUANTLAB_TEST_KEY", "user-key")
    server = prepare_engine(plan, "candidate", log_dir=tmp_path, progress=lambda m: None)
    assert server.headers == {"Authorization": "Bearer user-key"}


def test_two_endpoints_may_have_two_keys(monkeypatch, tmp_path):
    """serve.candidate_api_key_env: the candidate endpoint's own key (two deployments, two keys);
    the baseline keeps api_key_env's. Only for endpoints."""
    from quantlab.serving.vllm_server import prepare_engine

    base = {"name": "x", "quantization": {"method": "rtn", "scheme": "W4A16"}}
    with pytest.raises(RecipeError, match="candidate_api_key_env names the candidate endpoint's key"):
        parse_recipe({**base, "serve": {"candidate_api_key_env": "MY_KEY"}})
    spec = ServeSpec(mode="endpoint", endpoint="http://127.0.0.1:9", candidate_endpoint="http://127.0.0.1:10",
                     api_key_env="QUANTLAB_TEST_KEY", candidate_api_key_env="QUANTLAB_TEST_CANDIDATE_KEY")
    plan = plan_serving(spec, [EngineTarget("baseline", None, "b"), EngineTarget("candidate", None, "c")],
                        dtype="bfloat16", probe=CPU_PROBE)
    monkeypatch.setenv("QUANTLAB_TEST_KEY", "baseline-key")
    monkeypatch.delenv("QUANTLAB_TEST_CANDIDATE_KEY", raising=False)
    with pytest.raises(RecipeError, match="QUANTLAB_TEST_CANDIDATE_KEY, which is not set") as err:
        prepare_engine(plan, "candidate", log_dir=tmp_path, progress=lambda m: None)
    assert err.value.field == "serve.candidate_api_key_env"
    monkeypatch.setenv("QUANTLAB_TEST_CANDIDATE_KEY", "candidate-key")
    assert prepare_engine(plan, "candidate", log_dir=tmp_path, progress=lambda m: None).headers == \
        {"Authorization": "Bearer candidate-key"}
    assert prepare_engine(plan, "baseline", log_dir=tmp_path, progress=lambda m: None).headers == \
        {"Authorization": "Bearer baseline-key"}


def test_clients_find_a_servers_key_by_its_url_while_it_runs():
    url = "http://127.0.0.1:1"
    server = VLLMServer(None, log_path=Path("/nonexistent/log"), startup_timeout_s=1, endpoint=url + "/",
                        api_key="k1")
    server.start()
    assert api_keys.headers(url) == {"Authorization": "Bearer k1"} and api_keys.key_for(url + "/") == "k1"
    attached = VLLMServer(None, log_path=Path("/nonexistent/log"), startup_timeout_s=1, endpoint=url, api_key="k1")
    attached.start()
    attached.stop()  # an endpoint attached to a server of ours lets go of its own registration only
    assert api_keys.key_for(url) == "k1"
    server.stop()
    assert api_keys.headers(url) == {} and api_keys.key_for(url) is None


def test_the_guard_lets_only_health_and_the_key_through(monkeypatch):
    async def app(scope, receive, send):
        reached.append(scope.get("path"))

    async def receive():
        return {"type": "http.request"}

    async def send(message):
        sent.append(message)

    monkeypatch.setenv("VLLM_API_KEY", "the-key")
    guard = Guard(app)
    cases = [("/health", [], True), ("/invocations", [], False), ("/v1/completions", [], False),
             ("/tokenize", [(b"authorization", b"Bearer wrong")], False),
             ("/metrics", [(b"authorization", b"Basic the-key")], False),
             ("/invocations", [(b"authorization", b"Bearer the-key")], True),
             ("/v1/models", [(b"Authorization", b"bearer the-key")], True)]
    for path, headers, passes in cases:
        reached, sent = [], []
        asyncio.run(guard({"type": "http", "path": path, "headers": headers}, receive, send))
        assert (reached == [path]) is passes, (path, headers)
        if not passes:
            assert sent[0]["status"] == 401 and b"Unauthorized" in sent[1]["body"]
    reached, sent = [], []
    asyncio.run(guard({"type": "websocket", "path": "/v1/realtime", "headers": []}, receive, send))
    assert reached == [] and sent == [{"type": "websocket.close", "code": 1008}]
    asyncio.run(guard({"type": "lifespan"}, receive, send))
    assert reached == [None]  # start-up and shut-down pass through untouched
    monkeypatch.delenv("VLLM_API_KEY")
    reached, sent = [], []
    asyncio.run(Guard(app)({"type": "http", "path": "/v1/models", "headers": [(b"authorization", b"Bearer ")]},
                           receive, send))
    assert reached == [] and sent[0]["status"] == 401  # no key set: closed, not open


@pytest.mark.parametrize("host, is_loopback", [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True),
                                                ("localhost", True), ("0.0.0.0", False), ("::", False),
                                                ("10.1.2.3", False)])
def test_loopback(host, is_loopback):
    assert loopback(host) is is_loopback


def test_an_exposed_host_needs_serve_expose_and_is_said_in_words():
    assert exposure(ServeSpec()) is None
    with pytest.raises(RecipeError, match="not a loopback address.*serve.expose: true") as err:
        plan_serving(ServeSpec(host="0.0.0.0"), [], dtype="bfloat16", probe=CPU_PROBE)
    assert "serve.host" in err.value.field and "serve.expose" in err.value.field
    plan = plan_serving(ServeSpec(host="0.0.0.0", expose=True), [], dtype="bfloat16", probe=CPU_PROBE)
    assert "every interface of this host" in plan.exposed and "other hosts can reach them" in plan.exposed
    # an endpoint's host is the endpoint's business: serve.host is not used
    assert exposure(ServeSpec(mode="endpoint", endpoint="http://10.0.0.1:8000", host="0.0.0.0",
                              allow_same_endpoint=True)) is None


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the stdlib's name
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_port_taken_by_another_process_is_refused(tmp_path):
    """The port was free when quantlab picked it; another process bound it first and answers
    /health: quantlab stops and says so (exit 3) instead of sending it requests and the key."""
    port = free_port()
    impostor = http.server.HTTPServer(("127.0.0.1", port), _Health)  # this test's process: not the child's group
    threading.Thread(target=impostor.serve_forever, daemon=True).start()
    plan = LaunchPlan([sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ),
                      f"http://127.0.0.1:{port}", "candidate-x", port, api_key="k", check_listener=True)
    server = VLLMServer(plan, log_path=tmp_path / "server.log", startup_timeout_s=30, shutdown_timeout_s=5)
    try:
        with pytest.raises(EngineError, match=f"port {port} on 127.0.0.1 answers /health, but not from the server "
                                              "quantlab started") as err:
            with server:
                pass
        assert err.value.exit_code == 3 and "outside the server's group" in str(err.value)
    finally:
        impostor.shutdown()
        impostor.server_close()
    assert server.proc is None and api_keys.key_for(plan.base_url) is None


def test_a_listener_in_the_childs_own_group_is_ours(tmp_path):
    port = free_port()
    child = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                             start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import time

        deadline = time.monotonic() + 20
        while (owned := owned_by_group("127.0.0.1", port, child.pid))[0] is not True and time.monotonic() < deadline:
            time.sleep(0.1)
        assert owned[0] is True, owned
        assert owned_by_group("127.0.0.1", port, os.getpgrp())[0] is False
    finally:
        child.terminate()
        child.wait(timeout=10)
    assert owned_by_group("127.0.0.1", port, child.pid) == (False, f"nothing listens on 127.0.0.1:{port}")
