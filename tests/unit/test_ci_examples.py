"""The CI examples in docs/ci/ are safe by construction and true to the CLI: the pull
request workflow holds no key, secret or OIDC identity and signs nothing; only the
protected-branch workflow signs, keyless, and verifies that identity; every quantlab
command line in them parses with the real CLI, and the recipe each writes loads."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from quantlab.recipe.file import load_recipe
from tests.unit.test_docs import argv, command_lines, parse

REPO = Path(__file__).resolve().parents[2]
CI = REPO / "docs" / "ci"
PR = CI / "github-actions-pr-gate.yml"
RELEASE = CI / "github-actions-release.yml"
GPU_DECIDE = CI / "github-actions-gpu-decide.yml"


def workflow(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as true
    return data


def uncommented(path: Path) -> str:
    return re.sub(r"(^|\s)#.*", "", path.read_text())


def steps(data: dict) -> list[tuple[str, dict]]:
    return [(name, step) for name, job in data["jobs"].items() for step in job.get("steps", [])]


def test_the_ci_folder_holds_the_three_workflows():
    assert sorted(p.name for p in CI.glob("*.yml")) == sorted([GPU_DECIDE.name, PR.name, RELEASE.name])


def test_the_gpu_decide_workflow_signs_nothing_and_runs_no_pull_request():
    code, data = uncommented(GPU_DECIDE), workflow(GPU_DECIDE)
    assert set(data["on"]) == {"workflow_dispatch"}  # a persistent GPU runner: never a pull request's code
    assert data["permissions"] == {"contents": "read"}
    assert "secrets." not in code and "id-token" not in code and "--checkpoint" not in code
    assert " decide " in code and " verify " not in code


@pytest.mark.parametrize("path", [PR, RELEASE, GPU_DECIDE], ids=lambda p: p.name)
def test_every_quantlab_command_line_parses(path):
    lines = [line for _, step in steps(workflow(path)) for line in str(step.get("run", "")).splitlines()]
    commands = command_lines(lines, 1)
    assert commands, f"{path.name} runs no quantlab command"
    problems = [f"`{line}`: {why}" for _, line in commands for args in argv(line) if (why := parse(args))]
    assert not problems, problems


def test_the_pull_request_workflow_holds_nothing_worth_taking():
    code, data = uncommented(PR), workflow(PR)
    assert set(data["on"]) == {"pull_request"}  # never pull_request_target: the base's secrets and write token
    assert data["permissions"] == {"contents": "read"}
    assert "secrets." not in code and "id-token" not in code
    for name, job in data["jobs"].items():
        assert "environment" not in job and "permissions" not in job, name  # nothing widened per job
        assert "self-hosted" not in str(job["runs-on"]), f"{name}: a pull request's code on a persistent runner"
    for name, step in steps(data):
        if str(step.get("uses", "")).startswith("actions/checkout"):
            assert step.get("with", {}).get("persist-credentials") is False, name
        assert "verify" not in str(step.get("run", "")), "nothing is signed here, so nothing is verified"


def test_only_the_protected_branch_signs_keyless():
    code, data = uncommented(RELEASE), workflow(RELEASE)
    assert set(data["on"]) == {"push", "workflow_dispatch"} and data["on"]["push"]["branches"] == ["main"]
    assert data["permissions"] == {"contents": "read"}
    assert "secrets." not in code and ".pem" not in code  # no key anywhere
    signing = [job for job in data["jobs"].values() if job.get("permissions", {}).get("id-token") == "write"]
    assert len(signing) == 1
    job = signing[0]
    assert job["environment"] and job["if"] == "github.ref == 'refs/heads/main'"
    verify = [line for _, step in steps(data) for line in command_lines(str(step.get("run", "")).splitlines(), 1)
              if " verify " in line[1]]
    assert verify and all("--sigstore-identity" in line and "--sigstore-issuer" in line for _, line in verify)
    assert job["env"]["SIGNER"].endswith("${{ github.workflow_ref }}")  # this file on main, nothing else


def _overlay(path: Path, tmp_path: Path) -> Path:
    """Runs the workflow's step that writes the recipe quantlab runs (printf and recipes
    check), as the runner would, for a shipped recipe; returns the file it wrote."""
    step = next(s for _, s in steps(workflow(path)) if "RUNNER_TEMP" in str(s.get("run", "")) and "printf" in
                str(s.get("run", "")))
    script = step["run"].replace(".venv/bin/quantlab", f"{sys.executable} -m quantlab")
    env = {**os.environ, "GITHUB_WORKSPACE": str(REPO), "RUNNER_TEMP": str(tmp_path), "RECIPE": "recipes/gptq-w4a16.yaml"}
    r = subprocess.run(["bash", "-e", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    written = [p for p in tmp_path.glob("*.yaml")]
    assert len(written) == 1
    return written[0]


def test_the_pull_request_run_is_unsigned_whatever_the_recipe_says(tmp_path):
    recipe = load_recipe(_overlay(PR, tmp_path)).recipe
    assert recipe.name == "gptq-w4a16" and recipe.signing.method == "none" and recipe.signing.private_key is None


def test_the_release_run_signs_with_sigstore_and_no_key_or_token_variable(tmp_path):
    signing = load_recipe(_overlay(RELEASE, tmp_path)).recipe.signing
    assert signing.method == "sigstore"
    assert signing.private_key is None and signing.identity_token_env is None and signing.password_env is None


@pytest.mark.parametrize("path", [PR, RELEASE], ids=lambda p: p.name)
def test_each_run_has_its_code_sandbox_before_it(path):
    """The shipped recipes run code tasks, refused at the preflight without isolation: on a
    GitHub-hosted Ubuntu the job installs bwrap and gives it an AppArmor profile first."""
    for name, job in workflow(path)["jobs"].items():
        runs = [str(step.get("run", "")) for step in job.get("steps", [])]
        run_at = [i for i, text in enumerate(runs) if re.search(r"quantlab run\b", text)]
        if not run_at:
            continue
        sandbox_at = [i for i, text in enumerate(runs)
                      if "install -y -q bubblewrap" in text and "apparmor_parser -r" in text and "userns," in text]
        assert sandbox_at and sandbox_at[0] < run_at[0], f"{path.name}: job {name} runs quantlab with no bwrap step"
