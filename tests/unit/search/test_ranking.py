"""Sensitivity groups, ranking and rank agreement, and the held-out text it is measured
on (pure: no model)."""

from __future__ import annotations

import json

import pytest

from quantlab.core.errors import RecipeError
from quantlab.quantize.calibration import build_calibration_set, held_out_chunks
from quantlab.recipe.quantize import CalibrationSpec
from quantlab.search.groups import group_modules, layer_index, layer_of
from quantlab.search.ranking import markdown, rank_agreement, ranked, with_quantizer_loss

MODULES = ["model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj", "model.layers.1.self_attn.q_proj",
           "model.layers.10.mlp.up_proj"]


def test_modules_grouped_by_decoder_layer_or_alone():
    assert group_modules(MODULES, "layer") == {
        "model.layers.0": MODULES[:2], "model.layers.1": [MODULES[2]], "model.layers.10": [MODULES[3]]}
    assert list(group_modules(MODULES, "module")) == MODULES
    assert layer_of("lm_head") == "lm_head" and layer_index("model.layers.10") == 10 and layer_index("lm_head") is None
    with pytest.raises(ValueError, match="nothing quantized"):
        group_modules([], "layer")


def row(group, kl, modules=None):
    return {"group": group, "modules": modules or [group], "mean_kl": kl, "max_kl": kl, "top1_agreement": 0.9,
            "weight_rel_error": 0.01}


def test_groups_ranked_most_sensitive_first_with_their_share():
    rows = ranked([row("a", 0.1), row("b", 0.3), row("c", 0.0)])
    assert [(r["group"], r["rank"]) for r in rows] == [("b", 1), ("a", 2), ("c", 3)]
    assert rows[0]["kl_share"] == pytest.approx(0.75)
    with_loss = with_quantizer_loss(rows, {"a": 2.0, "b.x": 1.0})
    assert [r["quantizer_loss"] for r in with_loss] == [None, 2.0, None]
    assert with_quantizer_loss(rows, None) == rows
    result = {"recipe": "r", "proxy": "p", "texts": 2, "tokens": 16, "text_source": "s", "wall_s": 1.0,
              "forward_passes": 5, "dtype": "float32", "device": "cpu", "groups": with_loss,
              "all_quantized": {"mean_kl": 0.5, "top1_agreement": 0.8}}
    table = markdown(result, top=2)
    assert "| 1 | b |" in table and "| 2 | a |" in table and "1 more groups" in table and "quantizer loss" in table


def test_rank_agreement_of_two_scorings():
    proxy = {"a": 3.0, "b": 2.0, "c": 1.0, "d": 0.5}
    assert rank_agreement(proxy, {"a": 30, "b": 20, "c": 10, "d": 1})["spearman"] == pytest.approx(1.0)
    assert rank_agreement(proxy, {"a": 1, "b": 10, "c": 20, "d": 30})["kendall"] == pytest.approx(-1.0)
    assert rank_agreement(proxy, {"a": 1, "b": 2})["spearman"] is None


def test_spearmans_interval_narrows_with_groups_and_holds_the_truth():
    import random

    from quantlab.search.ranking import spearman_interval

    assert spearman_interval(0.5, 3) is None
    low4, high4 = spearman_interval(0.5, 4)
    low30, high30 = spearman_interval(0.5, 30)
    assert low4 < low30 < 0.5 < high30 < high4
    # coverage on a known correlation: 10 groups, scores a noisy copy of the truth
    from scipy.stats import spearmanr

    rng, held = random.Random(0), 0
    truth = [rng.gauss(0, 1) for _ in range(2000)]
    population = spearmanr(truth, [t + rng.gauss(0, 1) for t in truth]).statistic
    for _ in range(300):
        xs = [rng.gauss(0, 1) for _ in range(10)]
        rho = spearmanr(xs, [x + rng.gauss(0, 1) for x in xs]).statistic
        lo, hi = spearman_interval(rho, 10)
        held += lo <= population <= hi
    assert held / 300 >= 0.9


class WordTokenizer:
    """Words -> their lengths: enough to count tokens; calibration only calls it."""

    chat_template = None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [len(w) for w in text.split()]}


def test_held_out_text_is_the_rows_calibration_never_samples(tmp_path):
    data = tmp_path / "rows.jsonl"
    # row i (line i + 1) is 20 words of i + 1 letters: every token says which row it came from
    data.write_text("".join(json.dumps({"text": ("x" * (i + 1) + " ") * 20}) + "\n" for i in range(40)))
    spec = CalibrationSpec(datasets=[{"path": str(data)}], num_samples=10, max_seq_length=64, chat_template=False)
    tok = WordTokenizer()
    calib = build_calibration_set(spec, [data], tok)
    chunks, source = held_out_chunks(spec, [data], tok, count=4, tokens=16, seed=1)
    assert len(chunks) == 4 and all(len(c) == 16 for c in chunks)
    assert "not sampled for calibration" in source
    calibrated = {int(o.split(":")[1]) for o in calib.origins}  # line numbers
    held_out = {t for c in chunks for t in c}  # = line numbers too
    assert len(calibrated) == 10 and held_out and not held_out & calibrated
    # one row fills at most one sequence: 4 sequences of 16 come from 4 rows at least
    assert len(held_out) >= 4
    with pytest.raises(RecipeError, match="fewer than one sequence"):
        held_out_chunks(spec, [data], tok, count=4, tokens=10_000, seed=1)
