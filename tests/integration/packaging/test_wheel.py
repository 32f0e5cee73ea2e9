"""quantlab as a package, not only as this checkout: the wheel built from the source,
installed with --no-deps into a virtual environment outside the repository, finds its
shipped recipes, calibration sets and eval suites (package data), checks every shipped
recipe and plans the demo recipe, offline. Its dependencies come from the project's own
environment through a path entry (not its site folder: the editable install there is not
loaded), so `quantlab` is the wheel's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
VLLM_PYTHON = Path(os.environ.get("QUANTLAB_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python")
DEADLINE_S = 120  # each command's; the whole check takes well under a minute here

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git to list the project's files")


def clean_env() -> dict[str, str]:
    """This environment without a path entry that could put the checkout's quantlab first."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    kw.setdefault("env", clean_env())
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=DEADLINE_S, stdin=subprocess.DEVNULL, **kw)
    assert r.returncode == 0, f"{cmd}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel built from a copy of the project's files (the checkout is left as it is),
    installed into a new virtual environment; returns its python."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    files = run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "quantlab", "pyproject.toml",
                 "README.md"], cwd=REPO).stdout.split()
    for rel in files:
        if (REPO / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp / "dist"),
         str(src)])
    [wheel] = (tmp / "dist").glob("quantlab-*.whl")
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)])
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    # the dependencies, as a plain path entry after the venv's own site folder
    (site / "zz-quantlab-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def test_the_wheel_is_the_quantlab_that_runs(installed):
    where = run([str(installed), "-c", "import quantlab, json; from quantlab.core.shipped import SHIPPED; "
                 "print(json.dumps([quantlab.__file__, str(SHIPPED)]))"], cwd=installed.parents[2]).stdout
    module, shipped = json.loads(where)
    venv = installed.parents[1]
    assert Path(module).is_relative_to(venv) and Path(shipped).is_relative_to(venv), (module, shipped)
    assert not (Path(shipped) / "eval_suites" / "standard" / "data").exists()  # built data is not shipped
    assert (Path(shipped) / "eval_suites" / "default" / "utils.py").is_file()


def test_the_installed_package_checks_its_recipes_and_plans_the_demo(installed, tmp_path):
    if not VLLM_PYTHON.is_file():
        pytest.skip(f"the serving environment is not built ({VLLM_PYTHON}): the plan's serving check needs it")
    quantlab = installed.parent / "quantlab"
    env = {**clean_env(), "QUANTLAB_VLLM_PYTHON": str(VLLM_PYTHON), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    listed = run([str(quantlab), "recipes", "list"], cwd=tmp_path, env=env).stdout
    shipped = Path(run([str(installed), "-c", "from quantlab.core.shipped import RECIPES; print(RECIPES)"],
                       cwd=tmp_path, env=env).stdout.strip())
    recipes = sorted(shipped.glob("*.yaml"))
    assert len(recipes) >= 10 and all(r.stem in listed for r in recipes)
    run([str(quantlab), "recipes", "check", *map(str, recipes)], cwd=tmp_path, env=env)
    # the demo recipe this host's engine can serve, as make demo picks it (AVX2-only: no W4A16 kernel)
    demo = run([str(quantlab), "recipes", "servable", str(shipped / "demo-gptq-w4a16.yaml"),
                str(shipped / "demo-smoothquant-gptq-w8a8.yaml")], cwd=tmp_path, env=env).stdout.strip()
    demo = demo.splitlines()[-1]
    plan = run([str(quantlab), "run", demo, "--dry-run", "--runs-dir", str(tmp_path / "runs")], cwd=tmp_path, env=env)
    assert "preflights passed" in plan.stdout and "quality" in plan.stdout, plan.stdout
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("run.json"))
