"""Bad input is refused before anything is created: each command given a missing or bad
recipe, a missing checkpoint, a missing run to read answers from, or a Ray address nobody
answers at exits 2 and leaves no run folder, storage folder or output behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import RECIPES

GOOD = RECIPES / "gptq-w4a16.yaml"  # valid, with calibration data and checks


def closed_port() -> int:
    """A localhost port nobody listens at (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def everything(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@pytest.fixture
def place(tmp_path):
    (tmp_path / "bad.yaml").write_text("name: bad\nquantization: {method: gptq, scheme: W4A16, group_sise: 64}\n")
    (tmp_path / "a-file").write_text("not a folder")
    (tmp_path / "some-checkpoint").mkdir()
    return tmp_path


def refused(place: Path, *args) -> str:
    """Runs `quantlab ARGS` in `place`; asserts exit 2 and that nothing appeared there (the
    cache included: it lives in `place` too). Returns stderr."""
    before = everything(place)
    env = {**os.environ, "QUANTLAB_CACHE_DIR": str(place / "cache")}
    r = subprocess.run([sys.executable, "-m", "quantlab", *map(str, args)], cwd=place, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert everything(place) == before, f"created: {sorted(everything(place) - before)}\n{r.stderr[-1000:]}"
    return r.stderr


@pytest.mark.parametrize("command", [
    ["run", "{recipe}", "--runs-dir", "runs"],
    ["run", "{recipe}", "{recipe}", "--runs-dir", "runs"],
    ["validate", "{recipe}", "--checkpoint", "some-checkpoint", "--runs-dir", "runs"],
    ["quantize", "{recipe}", "--output", "out"],
    ["sensitivity", "{recipe}", "--runs-dir", "runs"],
    ["search", "{recipe}", "--runs-dir", "runs"],
], ids=lambda c: c[0] + ("-compare" if c.count("{recipe}") > 1 else ""))
@pytest.mark.parametrize("recipe", ["missing.yaml", "bad.yaml"])
def test_a_missing_or_bad_recipe_creates_nothing(place, command, recipe):
    stderr = refused(place, *[recipe if a == "{recipe}" else a for a in command])
    assert recipe in stderr


def test_validate_with_a_missing_checkpoint_creates_nothing(place):
    stderr = refused(place, "validate", GOOD, "--checkpoint", "nope", "--runs-dir", "runs")
    assert "nope" in stderr and "--checkpoint" in stderr


def test_sensitivity_with_a_missing_run_for_answers_creates_nothing(place):
    stderr = refused(place, "sensitivity", GOOD, "--answers-from", "nope", "--runs-dir", "runs")
    assert "--answers-from" in stderr and "run.json" in stderr


@pytest.mark.parametrize("command", ["run", "search"])
def test_an_unreachable_ray_address_creates_no_storage(place, command):
    address = f"127.0.0.1:{closed_port()}"
    stderr = refused(place, command, GOOD, "--ray", address, "--storage", "storage", "--runs-dir", "runs")
    assert f"--ray {address}: nothing answers there" in stderr


def test_a_bad_recipe_on_ray_is_named_before_the_cluster_is_tried(place):
    stderr = refused(place, "run", GOOD, "bad.yaml", "--ray", f"127.0.0.1:{closed_port()}", "--storage", "storage")
    assert "bad.yaml" in stderr and "group_sise" in stderr and "nothing answers" not in stderr


def test_storage_that_cannot_be_made_is_refused_before_the_cluster_is_tried(place):
    stderr = refused(place, "run", GOOD, "--ray", f"127.0.0.1:{closed_port()}", "--storage", "a-file/storage")
    assert "a-file is not a folder" in stderr and "nothing answers" not in stderr
