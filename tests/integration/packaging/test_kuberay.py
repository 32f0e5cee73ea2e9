"""The KubeRay example as the project ships it: a RayJob whose Ray version is the one
quantlab pins, whose pods run one image built by the project's own set-up (Dockerfiles
for CPU and CUDA nodes), and whose entrypoint is a quantlab command this CLI parses and,
with the image's folders mapped onto this checkout, plans as a --dry-run (no image is
built, no cluster joined)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
RAYJOB = REPO / "deploy" / "kuberay" / "rayjob.yaml"
DOCKER = REPO / "deploy" / "docker"
IMAGE_ROOT = "/opt/quantlab"  # where the Dockerfiles put the project
VLLM_PYTHON = Path(os.environ.get("QUANTLAB_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python")


def rayjob() -> dict:
    return yaml.safe_load(RAYJOB.read_text())


def pinned_ray() -> str:
    [version] = re.findall(r'"ray==([\d.]+)"', (REPO / "pyproject.toml").read_text())
    return version


def test_the_rayjob_runs_the_pinned_ray_on_one_image_with_shared_storage():
    job = rayjob()
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    spec = job["spec"]
    cluster = spec["rayClusterSpec"]
    assert cluster["rayVersion"] == pinned_ray()
    pods = [cluster["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in
                                                             cluster["workerGroupSpecs"]]
    images = {c["image"] for p in pods for c in p["containers"]}
    assert len(images) == 1, images  # every node runs the same quantlab and environments
    storage = {m["mountPath"] for p in pods for c in p["containers"] for m in c["volumeMounts"]}
    args = shlex.split(spec["entrypoint"])
    assert storage == {args[args.index("--storage") + 1]}  # the storage every node sees
    assert spec["shutdownAfterJobFinishes"] and spec["activeDeadlineSeconds"] > 0


def test_the_images_are_built_by_the_projects_own_set_up():
    for variant, device in (("cpu", "cpu"), ("cuda", "cuda")):
        text = (DOCKER / f"Dockerfile.{variant}").read_text()
        assert f"WORKDIR {IMAGE_ROOT}" in text and "bash scripts/setup.sh" in text
        assert f"QUANTLAB_SETUP_DEVICE={device}" in text and "QUANTLAB_VLLM_PYTHON=" in text
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".venv/", ".venv-vllm/", "runs/"} <= set(ignored)


def test_the_entrypoint_parses_and_plans_as_a_dry_run(tmp_path):
    import typer.main

    from quantlab.cli import app

    args = shlex.split(rayjob()["spec"]["entrypoint"])
    assert args[:2] == ["quantlab", "run"] and "--ray" in args and args[args.index("--ray") + 1] == "auto"
    command = typer.main.get_command(app)
    run = command.commands["run"]
    run.make_context("run", list(args[2:]))  # quantlab's own parser takes it as written
    if not VLLM_PYTHON.is_file():
        pytest.skip(f"the serving environment is not built ({VLLM_PYTHON}): the plan's serving check needs it")
    mapped = [a.replace(IMAGE_ROOT, str(REPO)).replace("/mnt/quantlab", str(tmp_path / "storage")) for a in args]
    recipes = [a for a in mapped[2:] if a.endswith(".yaml")]
    env = {**os.environ, "QUANTLAB_VLLM_PYTHON": str(VLLM_PYTHON), "HF_HUB_OFFLINE": "1", "RAY_ADDRESS": ""}
    servable = subprocess.run([sys.executable, "-m", "quantlab", "recipes", "servable", *recipes],
                              capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    if servable.returncode != 0:
        pytest.skip(f"this host's engine build serves none of the job's recipes (they are for its GPU nodes): "
                    f"{servable.stderr.strip()[-300:]}")
    r = subprocess.run([sys.executable, "-m", *mapped, "--dry-run"], capture_output=True, text=True, timeout=300,
                       env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "ray: would run 2 candidate(s) as tasks on the nodes of auto" in r.stdout
    assert r.stdout.count("preflights passed") + r.stdout.count("would be left out") == 2
    assert not (tmp_path / "storage").exists()  # a dry run writes nothing
