"""The serving-environment probe is kept on disk and redone when what it reports could
have changed: packages installed or removed in that environment, device variables."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from quantlab.serving import vllm_probe


@pytest.fixture
def venv(tmp_path, monkeypatch) -> Path:
    """A virtual-environment layout whose python is this interpreter (it has torch)."""
    monkeypatch.setenv("QUANTLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    root = tmp_path / "venv"
    (root / "bin").mkdir(parents=True)
    site = root / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (site / "outer.pth").write_text("\n".join(p for p in sys.path if p.endswith("site-packages")) + "\n")
    (root / "pyvenv.cfg").write_text(f"home = {Path(sys.executable).resolve().parent}\n")
    (root / "bin" / "python").symlink_to(Path(sys.executable).resolve())
    return root / "bin" / "python"


def test_probe_is_reused_until_the_environment_or_device_variables_change(venv, monkeypatch):
    first = vllm_probe.probe_serving_env(venv)  # a real probe in that Python
    assert first["versions"]["torch"] and first["cpu"]["count"] >= 1
    assert len(list((Path(vllm_probe.cache_dir()) / "probes").glob("*.json"))) == 1

    calls = []

    def probe_again(python, *, timeout):
        calls.append(python)
        return {**first, "again": len(calls)}

    monkeypatch.setattr(vllm_probe, "_run_probe", probe_again)
    assert vllm_probe.probe_serving_env(venv) == first and calls == []  # from the cache

    site = venv.parent.parent / "lib" / "python3.11" / "site-packages"
    (site / "newpkg-1.0.dist-info").mkdir()  # an install changes the folder
    assert vllm_probe.probe_serving_env(venv)["again"] == 1
    assert vllm_probe.probe_serving_env(venv)["again"] == 1  # cached again

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # devices hidden
    assert vllm_probe.probe_serving_env(venv)["again"] == 2


def test_a_python_outside_a_virtual_environment_is_probed_every_time(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTLAB_CACHE_DIR", str(tmp_path / "cache"))
    calls = []
    monkeypatch.setattr(vllm_probe, "_run_probe", lambda python, *, timeout: calls.append(python) or {"n": 1})
    loose = tmp_path / "bin" / "python"
    loose.parent.mkdir()
    loose.symlink_to(sys.executable)
    vllm_probe.probe_serving_env(loose)
    vllm_probe.probe_serving_env(loose)
    assert len(calls) == 2 and not (tmp_path / "cache" / "probes").exists()
