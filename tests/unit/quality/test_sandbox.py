"""Model code in the sandbox, tried as an attacker would: hostile completions through the
real HumanEval scorer (the standard suite's utils.score_humaneval), the default suite's
ql_code scorer and a traffic row's user scorer. Each tries one harm (read a planted key,
the environment, the run folder found through /proc; write into a checkpoint; reach a
listener on 127.0.0.1; leave a daemon; fill the disk; print 300 MB) and is written to
pass its tests only if the harm worked, so "scores fail" and "did no harm" are one
assertion, checked on the host as well. exit()/sys.exit(0)/SystemExit/os._exit(0) fail,
an honest completion passes. Parametrized over the isolation this host has (a kind that
does not work here is skipped with its reason); the refusal paths run on every host."""

from __future__ import annotations

import ast
import importlib.util
import os
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from quantlab.core.errors import RecipeError
from quantlab.quality.sandbox import (ENV_VAR, ISOLATING, OUTPUT_CAP, PROCESSES, CodeExecutionRefused, SandboxFailed,
                                      probe, resolve, run_python)
from quantlab.quality.suites import SHIPPED
from quantlab.quality.traffic_checks import check_answer
from quantlab.recipe.file import load_recipe

REPO = Path(__file__).resolve().parents[3]
SECRET = "fake-signing-password-" + secrets.token_hex(8)
DOC = {"prompt": 'def add(a, b):\n    """Return the sum of a and b."""\n',
       "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
       "entry_point": "add"}
HONEST = "    return a + b\n"


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)  # each suite's utils.py, as lm-eval imports it
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HUMANEVAL = _module(SHIPPED / "standard" / "utils.py", "standard_suite_utils")
DEFAULT = _module(SHIPPED / "default" / "utils.py", "default_suite_utils")


@pytest.fixture(params=ISOLATING)
def kind(request, monkeypatch) -> str:
    """Each isolation this host has, as a run that chose it sets it for the scorers."""
    why = probe(request.param)
    if why is not None:
        pytest.skip(f"{request.param} does not isolate on this host: {why}")
    monkeypatch.setenv(ENV_VAR, request.param)
    return request.param


@pytest.fixture
def planted(monkeypatch):
    """What a completion must not reach: a key file in the home directory, a run folder with
    a checkpoint (the evaluator's working folder, so /proc/<its pid>/cwd leads there), a
    secret in the environment. Outside /tmp, so the sandbox's own /tmp is no excuse."""
    tag = secrets.token_hex(6)
    home = Path.home() / f".quantlab-sandbox-test-{tag}"
    run = REPO / "build" / f"sandbox-test-{tag}" / "runs" / "r1"
    (run / "checkpoint").mkdir(parents=True)
    (run / "checkpoint" / "config.json").write_text('{"model_type": "llama"}')
    home.mkdir()
    (home / "signing.key").write_text(SECRET)
    monkeypatch.setenv("QUANTLAB_SIGNING_KEY_PASSWORD", SECRET)
    monkeypatch.chdir(run)
    yield SimpleNamespace(key=home / "signing.key", run=run, checkpoint=run / "checkpoint", tag=tag)
    shutil.rmtree(home, ignore_errors=True)
    shutil.rmtree(run.parents[1], ignore_errors=True)


def score(completion: str) -> int:
    return HUMANEVAL.score_humaneval(DOC, [completion])["pass_at_1"]


def test_an_honest_completion_passes(kind):
    assert score(HONEST) == 1
    assert score("    return a - b\n") == 0


def test_reading_the_key_the_environment_or_the_run_folder_fails(kind, planted):
    reads_key = f"    try:\n        return a + b if {SECRET!r} in open({str(planted.key)!r}).read() else None\n" \
                "    except OSError:\n        return None\n"
    reads_env = f"    import os\n    return a + b if {SECRET!r} in repr(dict(os.environ)) else None\n"
    # the evaluating process's working folder through /proc, as the found attack did
    finds_run = "    import os\n    for pid in os.listdir('/proc'):\n        try:\n" \
                "            if os.path.exists(os.path.join('/proc', pid, 'cwd', 'checkpoint', 'config.json')):\n" \
                "                return a + b\n        except OSError:\n            pass\n" \
                f"    return a + b if os.path.exists({str(planted.checkpoint / 'config.json')!r}) else None\n"
    for completion in (reads_key, reads_env, finds_run):
        assert score(completion) == 0, completion
    # and what it prints never holds them either
    out = run_python(f"import os\nprint(repr(dict(os.environ)))\nprint(open({str(planted.key)!r}).read())",
                     timeout_s=10)
    assert SECRET not in out.stdout + out.stderr and "FileNotFoundError" in out.stderr
    assert set(ast.literal_eval(out.stdout.splitlines()[0])) <= {"PATH", "LANG", "HOME", "PWD"}


def test_writing_into_the_checkpoint_fails(kind, planted):
    evil = planted.checkpoint / "modeling_evil.py"
    writes = f"    try:\n        open({str(evil)!r}, 'w').write('import os')\n        return a + b\n" \
             "    except OSError:\n        return None\n"
    assert score(writes) == 0
    assert not evil.exists() and sorted(p.name for p in planted.checkpoint.iterdir()) == ["config.json"]


def test_no_network_even_to_the_hosts_loopback(kind):
    accepted, done = [], threading.Event()
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        server.settimeout(0.1)

        def accept():
            while not done.is_set():
                try:
                    accepted.append(server.accept())
                except OSError:
                    continue

        listener = threading.Thread(target=accept)
        listener.start()
        connects = f"    import socket\n    try:\n        socket.create_connection(('127.0.0.1', {port}), 2).close()\n" \
                   "        return a + b\n    except OSError:\n        return None\n"
        assert score(connects) == 0
        out = run_python(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), 2)", timeout_s=10)
        assert not out.ok and ("ConnectionRefused" in out.stderr or "Network is unreachable" in out.stderr)
        done.set()
        listener.join()
    assert accepted == []


def _tagged(tag: str) -> list[int]:
    pids = []
    for p in os.listdir("/proc"):
        try:
            if p.isdigit() and tag.encode() in Path(f"/proc/{p}/cmdline").read_bytes():
                pids.append(int(p))
        except OSError:
            pass
    return pids


def test_a_daemon_does_not_outlive_its_program(kind, planted):
    marker = planted.run / "daemon-was-here"
    daemon = f"import time; time.sleep(2); open({str(marker)!r}, 'w').write('x')"
    spawns = ("    import os, sys\n    if os.fork() == 0:\n        os.setsid()\n"
              f"        os.execv(sys.executable, [sys.executable, '-c', {daemon!r}, {planted.tag!r}])\n"
              "    import time\n    time.sleep(0.3)\n    return a + b\n")
    assert score(spawns) == 1  # it answered right: what matters is that its daemon is gone
    assert _tagged(planted.tag) == []  # no process left, at once
    time.sleep(2.5)
    assert not marker.exists() and _tagged(planted.tag) == []


@pytest.mark.parametrize("completion", [
    "    open('big', 'wb').write(b'x' * (100 << 20))\n    return a + b\n",  # one file past 16 MiB
    "    for i in range(8):\n        open(f'f{i}', 'wb').write(b'x' * (15 << 20))\n    return a + b\n",  # the tmpfs
    "    x = bytearray(2 << 30)\n    return a + b\n",  # 2 GiB of memory
    "    import os\n    n = 0\n    while n < 500:\n        if os.fork() == 0:\n            import time\n"
    "            time.sleep(3)\n            os._exit(0)\n        n += 1\n    return a + b\n",  # 500 processes
], ids=["file-size", "tmpfs", "memory", "processes"])
def test_resources_are_limited(kind, completion):
    assert score(completion) == 0


def test_the_chroot_escape_fails(kind, planted):
    """The classic way out of a chroot (chroot into a subfolder, `..` past the root, chroot
    "."): it needs CAP_SYS_CHROOT, which the program never has (as root it runs as nobody;
    unshare, whose script runs as root, is used only then)."""
    escape = ("    import os\n    try:\n        os.makedirs('x', exist_ok=True)\n        os.chroot('x')\n"
              "        for _ in range(64):\n            os.chdir('..')\n        os.chroot('.')\n"
              f"        return a + b if {planted.key.parent.name!r} in os.listdir({str(Path.home())!r}) else None\n"
              "    except OSError:\n        return None\n")
    assert score(escape) == 0
    out = run_python("import os\nos.makedirs('x')\nos.chroot('x')\nfor _ in range(64):\n    os.chdir('..')\n"
                     f"os.chroot('.')\nprint(os.listdir({str(Path.home())!r}))", timeout_s=10)
    assert not out.ok and planted.key.parent.name not in out.stdout and "Operation not permitted" in out.stderr


def test_the_process_limit_is_set_inside_the_sandbox(kind):
    """Set before the sandbox starts, the kernel would count the user's host processes against
    it (bwrap failing to start for a user with a busy server): the wrapper sets it inside."""
    out = run_python("import resource\nprint(*resource.getrlimit(resource.RLIMIT_NPROC))", timeout_s=10)
    assert out.ok and [int(v) for v in out.stdout.split()] == [PROCESSES, PROCESSES]


def test_unshare_is_refused_unless_quantlab_runs_as_root(monkeypatch):
    """For another user, unshare's --map-root-user would leave the program root with every
    capability in a chroot it can leave: it is not offered, and auto needs bwrap."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    probe.cache_clear()
    try:
        if shutil.which("unshare") is not None:
            assert "only when quantlab runs as root" in probe("unshare")
            with pytest.raises(RecipeError, match="code_sandbox is unshare, which does not work here.*bubblewrap"):
                resolve("unshare")
        with pytest.raises(OSError, match="only when quantlab runs as root"):
            run_python("print(1)", timeout_s=10, kind="unshare")
    finally:
        probe.cache_clear()


def test_a_sandbox_that_does_not_start_raises_rather_than_scoring_a_fail(monkeypatch, tmp_path):
    """bwrap refusing to start is no fail of the model's (it would read 0 on both models and
    pass every gate): it raises, naming the kind and what the tool said."""
    fake = tmp_path / "bin" / "bwrap"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'bwrap: Creating new namespace failed: Resource temporarily unavailable' >&2\n"
                    "exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    monkeypatch.setenv(ENV_VAR, "bwrap")
    probe.cache_clear()
    try:
        with pytest.raises(SandboxFailed, match="the bwrap code sandbox did not start.*Resource temporarily") as err:
            score(HONEST)
        assert err.value.exit_code == 3
        assert "could not start" in probe("bwrap") and "Resource temporarily unavailable" in probe("bwrap")
    finally:
        probe.cache_clear()


def test_300_mb_of_output_is_cut_and_the_evaluator_stays_small(kind):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    prints = "    import sys\n    for i in range(300):\n        sys.stdout.write('x' * (1 << 20))\n    return a + b\n"
    assert score(prints) == 0
    out = run_python("import sys\nfor i in range(300):\n    sys.stdout.write('x' * (1 << 20))", timeout_s=30)
    assert out.truncated and not out.ok and len(out.stdout) <= OUTPUT_CAP
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024


@pytest.mark.parametrize("completion", [
    "    return a + b\nexit(0)\n", "    return a + b\n__import__('sys').exit(0)\n",
    "    return a + b\nraise SystemExit\n", "    return a + b\n__import__('os')._exit(0)\n",
    "    exit(0)\n", "    raise SystemExit(0)\n", "    __import__('os')._exit(0)\n",
], ids=["exit", "sys.exit", "raise", "os._exit", "exit-in-body", "raise-in-body", "os._exit-in-body"])
def test_a_program_that_exits_before_its_tests_end_fails(kind, completion):
    assert score(completion) == 0


def test_import_ends_a_completion(kind):
    assert HUMANEVAL.cut("    return a + b\nimport os\nos._exit(0)\n") == "    return a + b"
    assert score("    return a + b\nimport os\nos._exit(0)\n") == 1  # what follows the stop never runs
    assert score("    return None\nimport sys\nsys.exit(0)\n") == 0


def test_the_default_suites_code_task_scores_the_same_way(kind):
    doc = {"prompt": "def add(a, b):\n    \"\"\"Return the sum of a and b.\"\"\"\n    return",
           "tests": ["add(2, 3) == 5", "add(-1, 1) == 0"]}
    assert DEFAULT.score_code(doc, [" a + b"]) == {"pass": 1}
    for hostile in (" a + b\nexit(0)", " __import__('os')._exit(0)", " a + b\nraise SystemExit"):
        assert DEFAULT.score_code(doc, [hostile]) == {"pass": 0}, hostile


SCORERS = '''
import os, sys

def polite(answer, row):
    return "please" in answer.lower()

def says_true_then_exits(answer, row):
    print("true")
    sys.exit(0)

def snoops(answer, row):
    return os.environ.get("QUANTLAB_SIGNING_KEY_PASSWORD") is not None or os.path.exists(row["key"])

def writes_home(answer, row):
    open(os.path.join(os.path.dirname(__file__), "planted.py"), "w").write("x")
    return True
'''


def test_a_user_scorer_runs_in_the_sandbox_and_cannot_say_true_by_exiting(kind, planted, tmp_path):
    (tmp_path / "scorers.py").write_text(SCORERS)
    tmp_path.chmod(0o755)  # pytest makes it 0700: as root, model code runs as nobody and must read it
    check = {"kind": "python", "timeout_s": 30, "value": {"folder": str(tmp_path), "module": "scorers"}}

    def run(function, answer="x"):
        return check_answer({**check, "value": {**check["value"], "function": function}}, answer,
                            {"key": str(planted.key)})

    assert run("polite", "please wait") == (True, None)  # its own folder is there, read-only
    ok, error = run("says_true_then_exits")
    assert not ok and "exited before the end" in error
    assert run("snoops") == (False, None)
    ok, error = run("writes_home")
    assert not ok and "Read-only file system" in error and not (tmp_path / "planted.py").exists()


def test_a_sandbox_dies_with_its_evaluator(kind):
    """SIGKILL the evaluating process (an OOM kill, a forced cancel): its sandbox goes too."""
    tag = secrets.token_hex(6)
    evaluator = subprocess.Popen([sys.executable, "-c", (
        "import sys; from quantlab.quality.sandbox import run_python\n"
        "run_python('import os, sys\\nos.execv(sys.executable, [sys.executable, \"-c\", \"import time; "
        f"time.sleep(60)\", \"{tag}\"])', timeout_s=60)\n")],
        env={**os.environ}, stdout=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 30
        while not _tagged(tag) and time.monotonic() < end:
            time.sleep(0.1)
        assert _tagged(tag), "the sandbox never started"
        evaluator.send_signal(signal.SIGKILL)
        evaluator.wait(timeout=10)
        end = time.monotonic() + 5
        while _tagged(tag) and time.monotonic() < end:
            time.sleep(0.1)
        assert _tagged(tag) == []
    finally:
        evaluator.kill()
        evaluator.wait(timeout=10)


def test_model_code_runs_only_where_a_run_allowed_it(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    with pytest.raises(CodeExecutionRefused, match="quality.allow_code_execution"):
        score(HONEST)
    with pytest.raises(CodeExecutionRefused, match="QUANTLAB_CODE_SANDBOX='chroot'"):
        monkeypatch.setenv(ENV_VAR, "chroot")
        score(HONEST)


@pytest.fixture
def no_isolation(monkeypatch, tmp_path):
    """This host as one without bwrap and unshare: neither is on PATH."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    probe.cache_clear()
    yield
    probe.cache_clear()


def test_without_isolation_auto_is_refused_unless_the_recipe_says_unsandboxed(no_isolation):
    with pytest.raises(RecipeError, match="apt-get install bubblewrap") as err:
        resolve("auto")
    assert err.value.field == "quality.code_sandbox" and "quality.code_sandbox: unsandboxed" in str(err.value)
    with pytest.raises(RecipeError, match="quality.code_sandbox is bwrap, which does not work here"):
        resolve("bwrap")
    assert resolve("unsandboxed") == "unsandboxed"


def _ctx(tmp_path: Path, quality: dict) -> SimpleNamespace:
    """What the quality stage's preflight reads of its run: the recipe as loaded, nothing served."""
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({"name": "sandboxed", "model": {"source": "default"},
                                    "quantization": {"method": "rtn", "scheme": "W4A16", "group_size": 64},
                                    "quality": quality}))
    loaded = load_recipe(path)
    return SimpleNamespace(recipe=loaded.recipe, loaded=loaded, progress=lambda line: None)


def test_the_preflight_refuses_code_tasks_the_recipe_did_not_allow(tmp_path):
    from quantlab.quality import stage
    from quantlab.quality.work import code_sandbox

    ctx = _ctx(tmp_path, {"tasks": ["ql_lastword", "ql_code"]})
    with pytest.raises(RecipeError) as err:
        stage.preflight(ctx)
    assert err.value.field == "quality.allow_code_execution" and err.value.exit_code == 2
    assert "ql_code" in str(err.value) and "ql_lastword" not in str(err.value) and str(ctx.loaded.path) in str(err.value)
    assert code_sandbox(_ctx(tmp_path, {"tasks": ["ql_lastword"]})) is None  # no code task: nothing to allow
    assert code_sandbox(_ctx(tmp_path, {"tasks": ["ql_code"], "allow_code_execution": True,
                                        "code_sandbox": "unsandboxed"})) == "unsandboxed"


def test_the_preflight_refuses_code_tasks_where_nothing_isolates(tmp_path, no_isolation):
    from quantlab.quality.work import code_sandbox

    with pytest.raises(RecipeError, match="bubblewrap") as err:
        code_sandbox(_ctx(tmp_path, {"tasks": ["ql_code"], "allow_code_execution": True}))
    assert err.value.field == "quality.code_sandbox"


def test_a_traffic_row_with_a_python_check_executes_code(tmp_path, monkeypatch, default_model_dir):
    from quantlab.quality.work import code_sandbox

    monkeypatch.setenv("QUANTLAB_CACHE_DIR", str(tmp_path / "cache"))  # where the traffic suite is generated
    folder = tmp_path / "traffic"  # a folder of their own: the scorers' whole folder is shown to model code
    folder.mkdir()
    (folder / "scorers.py").write_text(SCORERS)
    (folder / "traffic.jsonl").write_text('{"id": "a", "prompt": "Ask me.", "check": {"python": "scorers:polite"}}\n'
                                          '{"id": "b", "prompt": "Tell me.", "check": {"contains": "x"}}\n')
    quality = {"suites": [], "traffic": [{"path": "traffic/traffic.jsonl"}], "kl": {"enabled": False}}

    def ctx(**more):
        c = _ctx(tmp_path, {**quality, **more})
        c.baseline_model = lambda: SimpleNamespace(path=default_model_dir)  # its tokenizer renders chat rows
        return c

    with pytest.raises(RecipeError, match="traffic_traffic execute code the model writes") as err:
        code_sandbox(ctx())
    assert err.value.field == "quality.allow_code_execution"
    assert code_sandbox(ctx(allow_code_execution=True, code_sandbox="unsandboxed")) == "unsandboxed"
    isolating = next((k for k in ISOLATING if probe(k) is None), None)
    if isolating is None or os.geteuid() != 0:
        return
    folder.chmod(0o700)  # as root, model code runs as nobody: a scorer it cannot read is refused at once
    with pytest.raises(RecipeError, match="cannot be read by other users") as err:
        code_sandbox(ctx(allow_code_execution=True, code_sandbox=isolating))
    assert err.value.field == "quality.traffic.0.path" and "chmod o+rX" in str(err.value)
    folder.chmod(0o755)
    assert code_sandbox(ctx(allow_code_execution=True, code_sandbox=isolating)) == isolating


@pytest.mark.parametrize("holds", ["cache", "settings", "runs", "home"])
def test_a_scorer_folder_that_holds_what_model_code_must_not_see_is_refused(tmp_path, monkeypatch, holds,
                                                                            default_model_dir):
    """The scorer's whole folder is bound into the sandbox: one holding quantlab's cache, its
    settings (the cache's secret), the runs or the home directory would show them."""
    from quantlab.quality.work import code_sandbox

    monkeypatch.setenv("QUANTLAB_CACHE_DIR", str(tmp_path / "elsewhere" / "cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "elsewhere" / "config"))
    monkeypatch.setenv("HOME", str(tmp_path / "elsewhere" / "home"))
    (tmp_path / "scorers.py").write_text(SCORERS)
    (tmp_path / "traffic.jsonl").write_text('{"id": "a", "prompt": "Ask me.", "check": {"python": "scorers:polite"}}\n')
    inside = {"cache": ("QUANTLAB_CACHE_DIR", "quantlab's cache folder", tmp_path / "cache"),
              "settings": ("XDG_CONFIG_HOME", "quantlab's settings folder", tmp_path / "config" / "quantlab"),
              "home": ("HOME", "the home directory", tmp_path)}
    if holds in inside:
        env, what, where = inside[holds]
        monkeypatch.setenv(env, str(where.parent if holds == "settings" else where))
    c = _ctx(tmp_path, {"suites": [], "traffic": [{"path": "traffic.jsonl"}], "kl": {"enabled": False},
                        "allow_code_execution": True, "code_sandbox": "unsandboxed"})
    c.baseline_model = lambda: SimpleNamespace(path=default_model_dir)
    if holds == "runs":
        what, where = "the runs folder", tmp_path / "runs"
        c.run = SimpleNamespace(path=where / "sandboxed" / "20250101-000000")
    with pytest.raises(RecipeError, match="in a folder of their own") as err:
        code_sandbox(c)
    assert err.value.field == "quality.traffic.0.path" and err.value.exit_code == 2
    assert f"{what} {where.resolve()}" in str(err.value) and f"folder {tmp_path.resolve()}," in str(err.value)


def test_a_task_says_it_executes_code_in_its_task_yaml(tmp_path):
    from quantlab.quality.suites import load_suite

    suite = tmp_path / "suite"
    shutil.copytree(SHIPPED / "default", suite, ignore=shutil.ignore_patterns("__pycache__"))
    assert load_suite(suite).code_tasks == {"ql_code"}
    code = suite / "code.yaml"
    code.write_text(code.read_text().replace("unsafe_code: true", "unsafe_code: sometimes"))
    with pytest.raises(RecipeError, match="unsafe_code: 'sometimes'; expected true"):
        load_suite(suite)
    code.write_text(code.read_text().replace("unsafe_code: sometimes", "unsafe_code: false"))
    assert load_suite(suite).code_tasks == set()
    mc = suite / "knowledge_mc.yaml"
    mc.write_text(mc.read_text() + "unsafe_code: true\n")
    with pytest.raises(RecipeError, match="only a generated answer is code to run"):
        load_suite(suite)


def test_every_shipped_recipe_with_a_code_task_allows_it():
    from quantlab.core.shipped import RECIPES
    from quantlab.quality.suites import load_suites
    from quantlab.quality.traffic import load_rows
    from quantlab.quality.work import code_tasks

    for path in sorted(RECIPES.glob("*.yaml")):
        loaded = load_recipe(path)
        spec = loaded.recipe.quality
        if spec is None:
            continue
        runs_code = code_tasks(load_suites(spec, loaded.base_dir)) or any(
            r.check and r.check["kind"] == "python" for t in spec.traffic for r in load_rows(loaded.resolve(t.path)))
        assert spec.allow_code_execution is bool(runs_code), path.name


def test_an_unsandboxed_run_says_so_in_the_headline_and_the_manifest_field():
    import json

    from quantlab.core.run import RunRecord
    from quantlab.reports.report import render_markdown, summary_lines

    data = json.loads((REPO / "tests" / "data" / "run-record-blocked.json").read_text())
    quality = {**data["stages"]["release"], "name": "quality", "artifacts": [],
               "result": {"stage": "quality", "tasks": [], "baseline_cached": False, "code_sandbox": "unsandboxed"}}
    record = RunRecord.model_validate({**data, "stages": {**data["stages"], "quality": quality}})
    first = [line for line in summary_lines(record, REPO) if line.startswith("decision: ")][0]
    assert first.startswith("decision: BLOCKED (model code ran UNSANDBOXED): ")
    assert "model code ran UNSANDBOXED (quality.code_sandbox)" in render_markdown(record)
    quality["result"]["code_sandbox"] = "bwrap"
    record = RunRecord.model_validate({**data, "stages": {**data["stages"], "quality": quality}})
    assert "UNSANDBOXED" not in render_markdown(record) and "ran in the bwrap sandbox" in render_markdown(record)


def test_a_bwrap_refused_by_apparmor_says_what_to_allow(monkeypatch, tmp_path):
    """Ubuntu 23.10+ (GitHub's ubuntu-latest) deny a non-root user's namespaces: the probe's
    reason names the sysctl and the docs' profile; root, other kinds and other hosts get nothing."""
    from quantlab.quality import sandbox
    restricted = tmp_path / "apparmor_restrict_unprivileged_userns"
    restricted.write_text("1\n")
    monkeypatch.setattr(sandbox, "USERNS_RESTRICTED", restricted)
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 1000)
    hint = sandbox.userns_hint("bwrap")
    assert "apparmor_restrict_unprivileged_userns" in hint and "bubblewrap under AppArmor" in hint
    assert "bubblewrap under AppArmor" in (Path(__file__).parents[3] / "docs" / "quality.md").read_text()
    assert sandbox.userns_hint("unshare") == ""
    restricted.write_text("0\n")
    assert sandbox.userns_hint("bwrap") == ""
    monkeypatch.setattr(sandbox, "USERNS_RESTRICTED", tmp_path / "absent")
    assert sandbox.userns_hint("bwrap") == ""
    restricted.write_text("1\n")
    monkeypatch.setattr(sandbox, "USERNS_RESTRICTED", restricted)
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 0)
    assert sandbox.userns_hint("bwrap") == ""
