"""`quantlab sensitivity` on the tiny model: a layer broken on purpose for 4-bit rounding
(one large weight in every group, so the rest of each group rounds to zero) is ranked
first; the W8A8 scheme's activations are quantized too; bad input exits 2."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO, tiny_variant, write_recipe

from tests.integration.search.conftest import BROKEN


def sensitivity(recipe, tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "quantlab", "sensitivity", recipe, "--runs-dir", tmp_path / "runs",
                           "--texts", "4", "--tokens", "64", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=600)


def test_the_broken_module_is_ranked_first(tmp_path, outlier_model):
    recipe = write_recipe(tmp_path, tiny_variant("gptq-w4a16", outlier_model))
    r = sensitivity(recipe, tmp_path, "--granularity", "module")
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(open(r.stdout.strip().splitlines()[-1]).read())
    rows = result["groups"]
    assert rows[0]["group"] == BROKEN and rows[0]["rank"] == 1, [(x["group"], x["mean_kl"]) for x in rows[:4]]
    # well ahead of the next (measured: 5.4x its KL, 6.7x its weight error): a broken part, not noise
    assert rows[0]["mean_kl"] > 3 * rows[1]["mean_kl"] and rows[0]["weight_rel_error"] > 3 * rows[1]["weight_rel_error"]
    assert len(rows) == 14 and {x["group"] for x in rows} >= {BROKEN, "model.layers.0.self_attn.q_proj"}
    assert result["all_quantized"]["mean_kl"] >= rows[0]["mean_kl"] * 0.5
    assert result["forward_passes"] == len(rows) + 2 and result["texts"] == 4 and result["tokens"] == 64
    assert result["input_activation_args"] is None  # W4A16: weights only
    folder = tmp_path / "runs" / "sensitivity" / "gptq-w4a16"
    [run] = folder.iterdir()
    assert (run / "sensitivity.png").is_file() and BROKEN in (run / "sensitivity.md").read_text()
    assert f"| 1 | {BROKEN} |" in r.stderr  # the table's top rows on the terminal


def test_layers_of_a_w8a8_recipe_with_activations(tmp_path, tiny_model_dir):
    recipe = write_recipe(tmp_path, tiny_variant("smoothquant-gptq-w8a8", tiny_model_dir))
    r = sensitivity(recipe, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(open(r.stdout.strip().splitlines()[-1]).read())
    assert [x["group"] for x in sorted(result["groups"], key=lambda x: x["group"])] == ["model.layers.0",
                                                                                           "model.layers.1"]
    assert result["input_activation_args"]["strategy"] == "token" and result["input_activation_args"]["dynamic"]
    # 8-bit moves a model less than 4-bit: every layer keeps most top tokens
    assert all(x["top1_agreement"] > 0.8 and x["mean_kl"] > 0 for x in result["groups"])


def test_bad_input_exits_2(tmp_path, tiny_model_dir):
    data = tiny_variant("rtn-w8a16", tiny_model_dir)
    data.pop("calibration", None)
    r = sensitivity(write_recipe(tmp_path, data), tmp_path)
    assert r.returncode == 2 and "no calibration section" in r.stderr
    r = sensitivity(write_recipe(tmp_path, tiny_variant("gptq-w4a16", tiny_model_dir)), tmp_path,
                    "--granularity", "block")
    assert r.returncode == 2 and "--granularity" in r.stderr


def test_answers_of_a_run_with_each_module_kept_in_turn(tmp_path, outlier_model):
    """Held-out text from a run's evaluation (the failed task's prompts and the baseline's
    answers, as the quality stage records them) and the `restored` method: everything else
    4-bit, each module kept in turn; keeping the broken one takes the most KL away."""
    run = tmp_path / "blocked-run"
    (run / "quality" / "baseline").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"stages": {"quality": {"result": {"gates": [
        {"gate": "min_recovery", "scope": "ql_json_extract", "verdict": "fail"}]}}}}))
    people = [("Hiro", 31, "Lisbon"), ("Mina", 22, "Nairobi"), ("Olga", 43, "Oslo"), ("Kemi", 44, "Munich")]
    rows = [{"doc_id": i, "prompt": repr((json.dumps([{"role": "user", "content": f"{n} is {a} and lives in {c}. "
                                                        "Reply with only a JSON object."}]),)),
             "raw": json.dumps({"name": n, "age": a, "city": c})} for i, (n, a, c) in enumerate(people)]
    (run / "quality" / "baseline" / "ql_json_extract.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = tiny_variant("gptq-w4a16", outlier_model)
    data["quantization"] = {"method": "rtn", "scheme": "W4A16", "group_size": 64}
    data.pop("calibration")  # round-to-nearest, and answers for held-out text: no calibration files read
    r = subprocess.run([sys.executable, "-m", "quantlab", "sensitivity", write_recipe(tmp_path, data), "--runs-dir",
                        tmp_path / "runs", "--answers-from", run, "--method", "restored", "--granularity", "module"],
                       capture_output=True, text=True, cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(open(r.stdout.strip().splitlines()[-1]).read())
    assert result["texts"] == 4 and "failed there: ql_json_extract 4" in result["text_source"]
    assert result["forward_passes"] == 14 + 2 and 0 < result["scored_positions"] < 4 * 64
    rows = result["groups"]
    assert rows[0]["group"] == BROKEN, [(x["group"], x["score"]) for x in rows[:4]]
    assert rows[0]["score"] > 3 * max(rows[1]["score"], 0) and rows[0]["mean_kl"] < result["all_quantized"]["mean_kl"]
    assert "KL taken away" in r.stderr
    bad = subprocess.run([sys.executable, "-m", "quantlab", "sensitivity", write_recipe(tmp_path, data), "--runs-dir",
                          tmp_path / "runs", "--tasks", "ql_chat"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert bad.returncode == 2 and "--answers-from" in bad.stderr
