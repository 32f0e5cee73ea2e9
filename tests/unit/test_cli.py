"""The CLI as users call it: a subprocess, its exit code and its stderr."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml
from conftest import RECIPES, REPO


def ql(*args, cwd=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "quantlab", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd or REPO, timeout=timeout)


def test_version_and_help():
    assert ql("--version").stdout.startswith("quantlab ")
    r = ql("--help")
    assert r.returncode == 0 and "quantize" in r.stdout and "recipes" in r.stdout


def test_recipes_check_ok_and_failures(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"name": "bad", "quantization": {"method": "gptq", "scheme": "W4A16",
                                                                    "group_sise": 64}}))
    r = ql("recipes", "check", RECIPES / "rtn-w8a16.yaml", bad)
    assert r.returncode == 2
    assert "ok" in r.stdout and "rtn-w8a16.yaml" in r.stdout
    assert "quantization.group_sise" in r.stderr and "Did you mean 'group_size'" in r.stderr


def test_recipes_check_validates_calibration_rows(tmp_path):
    (tmp_path / "c.jsonl").write_text('{"text": "ok"}\n{"txt": "typo"}\n')
    f = tmp_path / "r.yaml"
    f.write_text(yaml.safe_dump({"name": "r", "quantization": {"method": "gptq", "scheme": "W8A16"},
                                 "calibration": {"datasets": [{"path": "c.jsonl"}]}}))
    r = ql("recipes", "check", f)
    assert r.returncode == 2 and "c.jsonl:2" in r.stderr


def test_recipes_schema_is_json_schema():
    r = ql("recipes", "schema")
    schema = json.loads(r.stdout)
    assert r.returncode == 0 and schema["title"] == "quantlab recipe"


def test_recipes_list_shows_every_shipped_recipe():
    r = ql("recipes", "list")
    assert r.returncode == 0
    for p in RECIPES.glob("*.yaml"):
        assert p.name in r.stdout
    assert "smoothquant+gptq W8A8" in r.stdout


def test_quantize_bad_input_exits_2_and_writes_nothing(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("name: r\nquantization: {method: awq, scheme: W8A8}\n")
    out = tmp_path / "out"
    r = ql("quantize", f, "--output", out)
    assert r.returncode == 2 and "AWQ protects" in r.stderr
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["r.yaml"]


def test_quantize_missing_recipe_exits_2(tmp_path):
    r = ql("quantize", tmp_path / "nope.yaml")
    assert r.returncode == 2 and "recipe file not found" in r.stderr


def test_unexpected_error_exits_3_with_one_line_and_the_traceback_on_file(tmp_path, monkeypatch):
    """A bug is a run failure (3), never 'blocked by a gate' (1): one line on the
    terminal, the traceback in a file it names."""
    from typer.testing import CliRunner

    from quantlab import cli

    from quantlab.pipeline import commands

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug deep inside")

    monkeypatch.setenv("QUANTLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(commands, "quantize_only", broken)
    r = CliRunner().invoke(cli.app, ["quantize", str(RECIPES / "rtn-w8a16.yaml"), "--output", str(tmp_path / "o")])
    assert r.exit_code == 3
    [line] = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert "unexpected ZeroDivisionError: a bug deep inside" in line
    [log] = (tmp_path / "cache" / "logs").glob("crash-*.txt")
    assert str(log) in r.stderr.replace("\n", "")
    assert "Traceback" in log.read_text() and "def broken" not in r.stderr and "broken" in log.read_text()


def test_unexpected_error_in_a_stage_is_recorded_with_its_traceback(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from quantlab import cli

    from quantlab.pipeline.stages import STAGES
    from quantlab.quantize import stage as quantize_stage

    def broken(ctx):
        raise KeyError("missing_key")

    for stage in STAGES:  # no model build, no serving probe
        monkeypatch.setattr(stage, "preflight", lambda ctx: None)
    monkeypatch.setattr(quantize_stage, "run", broken)
    r = CliRunner().invoke(cli.app, ["run", str(RECIPES / "gptq-w4a16.yaml"), "--runs-dir", str(tmp_path / "runs")])
    assert r.exit_code == 3, r.output
    [run_dir] = (tmp_path / "runs" / "gptq-w4a16").iterdir()
    record = json.loads((run_dir / "run.json").read_text())
    stage = record["stages"]["quantize"]
    assert record["status"] == "failed" and stage["status"] == "failed"
    assert "unexpected error in quantize: KeyError: 'missing_key'" in stage["error"]
    assert "Traceback" in (run_dir / stage["error_log"]).read_text()
    assert "serve" not in record["stages"]


def test_quantlab_serve_recipe_without_a_run_says_what_to_do(tmp_path):
    r = ql("serve", RECIPES / "gptq-w4a16.yaml", "--runs-dir", tmp_path)
    assert r.returncode == 2
    assert "no quantized checkpoint for 'gptq-w4a16'" in r.stderr and "--baseline" in r.stderr


def test_quantlab_serve_baseline_needs_a_recipe(tmp_path):
    r = ql("serve", tmp_path, "--baseline")
    assert r.returncode == 2 and "--baseline needs a recipe" in r.stderr


def test_checkpoint_candidates_bad_input_exits_2_naming_it(tmp_path):
    (tmp_path / "Vendor AWQ").mkdir()
    # a folder named after itself (slugged), a missing folder, two of one name
    r = ql("validate", RECIPES / "gptq-w4a16.yaml", "--checkpoint", tmp_path / "Vendor AWQ", "--checkpoint",
           f"b={tmp_path / 'nowhere'}", "--runs-dir", tmp_path / "runs")
    assert r.returncode == 2 and "checkpoint candidate 'b'" in r.stderr and "is not a folder" in r.stderr
    r = ql("run", RECIPES / "gptq-w4a16.yaml", "--checkpoint", f"x={tmp_path}", "--checkpoint", f"x={tmp_path}",
           "--runs-dir", tmp_path / "runs")
    assert r.returncode == 2 and "two checkpoints are named 'x'" in r.stderr
    r = ql("run", RECIPES / "gptq-w4a16.yaml", "--checkpoint", f"gptq-w4a16={tmp_path / 'Vendor AWQ'}",
           "--runs-dir", tmp_path / "runs")
    assert r.returncode == 2 and "two candidates are named 'gptq-w4a16'" in r.stderr
    assert not (tmp_path / "runs").exists()  # refused before any run folder


def test_run_on_a_recipe_without_checks_is_refused_before_any_work(tmp_path):
    """It used to serve both models and, with no gate, release: a signed release on no
    evidence. Now exit 2 at once (--dry-run and a real run alike), pointing to quantize."""
    f = tmp_path / "quantize-only.yaml"
    f.write_text(yaml.safe_dump({"name": "quantize-only", "quantization": {"method": "rtn", "scheme": "W4A16",
                                                                            "group_size": 64}}))
    for extra in (["--dry-run"], []):
        r = ql("run", f, "--runs-dir", tmp_path / "runs", *extra)
        assert r.returncode == 2, r.stderr
        assert "no check section" in r.stderr and "quantlab quantize quantize-only.yaml" in r.stderr
        assert "quantize-only.yaml" in r.stderr and "field 'quality'" in r.stderr
    assert not list((tmp_path / "runs").glob("quantize-only/*/checkpoint"))


def test_alone_is_refused_for_a_comparison(tmp_path):
    """A comparison takes no stream position, so --alone there is refused, not silently ignored."""
    r = ql("run", RECIPES / "rtn-w8a16.yaml", RECIPES / "gptq-w4a16.yaml", "--alone", "--runs-dir", tmp_path)
    assert r.returncode == 2, r.stderr
    assert "--alone" in r.stderr and "takes no stream position yet" in " ".join(r.stderr.split())
    assert not any(tmp_path.iterdir())  # refused before any work


def test_a_cached_entry_not_reused_is_said_once_per_command(monkeypatch, capsys):
    """The dry run looks an entry up twice (what a stage reuses, then its plan): the user reads
    one warning line, not two; another entry still gets its own."""
    from quantlab.cli import base
    from quantlab.core.result_cache import CacheEntryWarning

    monkeypatch.setattr(base, "_shown", set())
    for what in ("entry a", "entry a", "entry b"):
        base._show_warning(CacheEntryWarning(f"cached entry {what} is not reused"), CacheEntryWarning, "f.py", 1)
    said = capsys.readouterr().err
    assert said.count("entry a is not reused") == 1 and said.count("entry b is not reused") == 1
