"""`quantlab verify --here` through the CLI, with this host's real serving environment probed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from quantlab.core.layout import MANIFEST_FILE
from quantlab.release.manifest import generate_keypair, read_manifest, sign_folder
from tests.unit.release.test_manifest import make_release, verdict


def test_verify_here_exits_1_naming_the_isa_the_release_was_recorded_on(tmp_path):
    """The real serving environment probed on this host; the release says it was validated
    on another kernel library."""
    from quantlab.recipe.serve import ServeSpec
    from quantlab.serving.vllm_probe import probe_serving_env, serving_python

    probe = probe_serving_env(serving_python(ServeSpec()))
    library = probe["engine_kernels"].get("library")
    if library is None:
        pytest.skip(f"the serving environment names no CPU kernel library here ({probe.get('device')})")
    other = "_C_AVX2" if library != "_C_AVX2" else "_C"
    priv, pub = tmp_path / "k.pem", tmp_path / "k.pub.pem"
    generate_keypair(priv, pub)
    folder = make_release(tmp_path / "ckpt", [verdict("a", "pass")])
    m = json.loads((folder / MANIFEST_FILE).read_text())
    m["hardware"] = {"device": "cpu", "cpu": probe["cpu"], "gpus": []}
    m["runtime"] = {"versions": probe["versions"], "engine_kernels": {**probe["engine_kernels"], "library": other}}
    (folder / MANIFEST_FILE).write_text(json.dumps(m))
    sign_folder(folder, method="key", private_key=priv)
    assert read_manifest(folder).runtime["engine_kernels"]["library"] == other

    def verify(*args):
        return subprocess.run([sys.executable, "-m", "quantlab", "verify", str(folder), "--public-key", str(pub),
                               "--here", "--allow-legacy", *args],  # make_release writes a 0.1.0-format manifest
                              capture_output=True, text=True, timeout=300)

    r = verify()
    assert r.returncode == 1 and "HOST NOT COVERED" in r.stderr, r.stderr
    assert f"cpu-kernel-library: validated on {other}" in r.stderr and f"this host has {library}" in r.stderr
    assert f"this host: {probe['cpu'].get('model', 'CPU')}" in r.stdout  # reported, never compared
    r = verify("--allow", "cpu-kernel-library")
    assert r.returncode == 0 and "host covered" in r.stdout and "accepted: cpu-kernel-library" in r.stdout
    r = verify("--allow", "cpu-model")
    assert r.returncode == 2 and "not a class" in r.stderr
