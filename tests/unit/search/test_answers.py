"""Sensitivity's held-out text from a run's evaluation: prompts of the failed tasks with the
baseline's answers, only the answers scored; padding into batches; ranking by what keeping a
group buys back. A run folder is written here the way the quality stage writes one (its
record's gates and the baseline's sample files); the default model's tokenizer renders it."""

from __future__ import annotations

import json

import pytest

from quantlab.core.errors import RecipeError
from quantlab.search.answers import Sequence, failed_tasks, run_answers, whole
from quantlab.search.ranking import markdown, ranked

CHAT_PROMPT = repr((json.dumps([{"role": "user", "content": "Reply with JSON: name of Hiro."}]),))


def sample(prompt, raw, doc_id=0):
    return {"doc_id": doc_id, "prompt": prompt, "raw": raw, "answer": raw, "metrics": {}}


def write_run(folder, gates, samples):
    (folder / "quality" / "baseline").mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"stages": {"quality": {"result": {"gates": gates}}}}))
    for task, rows in samples.items():
        (folder / "quality" / "baseline" / f"{task}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


@pytest.fixture()
def run_dir(tmp_path):
    gates = [{"gate": "min_recovery", "scope": "ql_json", "verdict": "fail"},
             {"gate": "non_inferiority", "scope": "ql_json", "verdict": "fail"},
             {"gate": "min_recovery", "scope": "ql_sum", "verdict": "fail"},
             {"gate": "min_recovery", "scope": "ql_ok", "verdict": "pass"},
             {"gate": "max_mean_kl", "scope": "kl", "verdict": "fail"}]  # no samples: not a task
    samples = {
        "ql_json": [sample(CHAT_PROMPT, '{"name": "Hiro"}', i) for i in range(5)],
        "ql_sum": [sample("Q: 2 + 3\nA:", " 5"), sample("Q: 1 + 1\nA:", None),  # loglikelihood: no text
                   sample("x" * 4000, " 7"), sample("Q: 4 + 4\nA:", "  ")],  # cut prompt; empty answer
        "ql_ok": [sample("Say hi.", " hi")],
    }
    return write_run(tmp_path / "run", gates, samples)


def test_the_failed_tasks_prompts_with_the_baselines_answers(run_dir, tokenizer):
    assert failed_tasks(run_dir) == ["ql_json", "ql_sum"]
    seqs, source = run_answers(run_dir, tokenizer, tasks=None, count=4, tokens=256)
    # taken in turn: one completion sample is usable in ql_sum, the rest come from ql_json
    assert len(seqs) == 4 and "failed there: ql_json 3, ql_sum 1" in source
    chat = seqs[0]
    messages = [{"role": "user", "content": "Reply with JSON: name of Hiro."}]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    head = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    tail = tokenizer('{"name": "Hiro"}', add_special_tokens=False)["input_ids"]
    assert chat.ids == head + tail  # the chat template's prompt, then the answer
    # scored: the positions that predict the answer's tokens, and only those
    assert (chat.start, chat.end) == (len(head) - 1, len(head) + len(tail) - 1)
    completion = seqs[1]
    five = tokenizer(" 5", add_special_tokens=False)["input_ids"]
    assert completion.ids[-len(five):] == five and completion.end - completion.start == len(five)


def test_tasks_named_and_long_prompts_cut_from_the_front(run_dir, tokenizer):
    seqs, source = run_answers(run_dir, tokenizer, tasks=["ql_ok"], count=8, tokens=256)
    assert len(seqs) == 1 and "named: ql_ok 1" in source
    [short] = run_answers(run_dir, tokenizer, tasks=["ql_json"], count=1, tokens=16)[0]
    tail = tokenizer('{"name": "Hiro"}', add_special_tokens=False)["input_ids"]
    assert len(short.ids) == 16 and short.ids[-len(tail):] == tail  # the answer kept whole
    # no gate failed: every task's samples
    ok = write_run(run_dir.parent / "ok", [{"gate": "min_recovery", "scope": "ql_ok", "verdict": "pass"}],
                   {"ql_ok": [sample("Say hi.", " hi")]})
    assert "no gate failed there: every task" in run_answers(ok, tokenizer, tasks=None, count=8, tokens=64)[1]


def test_bad_answers_from(run_dir, tokenizer, tmp_path):
    with pytest.raises(RecipeError, match="no run.json there"):
        run_answers(tmp_path, tokenizer, tasks=None, count=4, tokens=64)
    with pytest.raises(RecipeError, match="ql_nope not evaluated .* it has ql_json, ql_ok, ql_sum"):
        run_answers(run_dir, tokenizer, tasks=["ql_nope"], count=4, tokens=64)
    lls = write_run(tmp_path / "lls", [{"gate": "min_recovery", "scope": "ql_mc", "verdict": "fail"}],
                    {"ql_mc": [sample("Q?", None)]})
    with pytest.raises(RecipeError, match="no generated answers"):
        run_answers(lls, tokenizer, tasks=None, count=4, tokens=64)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "run.json").write_text("{}")
    with pytest.raises(RecipeError, match="no baseline samples"):
        run_answers(empty, tokenizer, tasks=None, count=4, tokens=64)


def test_batches_pad_on_the_right_and_mark_only_the_scored_positions():
    from quantlab.search import measure

    seqs = [Sequence([5, 6, 7], 1, 2), Sequence([1, 2, 3, 4, 5], 0, 5)] + whole([[9] * 4000])
    batches = measure._batches(seqs, pad_id=0, device="cpu")
    assert len(batches) == 2  # 4,000 tokens do not share a batch of 4,096 with the others
    ids, attention, scored = batches[0]
    assert ids.tolist() == [[5, 6, 7, 0, 0], [1, 2, 3, 4, 5]]
    assert attention.tolist() == [[1, 1, 1, 0, 0], [1] * 5]
    assert scored.tolist() == [[False, True, False, False, False], [True] * 5]
    assert int(batches[1][2].sum()) == 4000


def test_restored_ranking_by_the_kl_keeping_a_group_takes_away():
    rows = ranked([{"group": "a", "modules": ["a"], "mean_kl": 0.30, "score": 0.02, "top1_agreement": 0.9,
                    "weight_rel_error": 0.01},
                   {"group": "b", "modules": ["b"], "mean_kl": 0.25, "score": 0.07, "top1_agreement": 0.9,
                    "weight_rel_error": 0.01},
                   {"group": "c", "modules": ["c"], "mean_kl": 0.33, "score": -0.01, "top1_agreement": 0.9,
                    "weight_rel_error": 0.01}])
    assert [r["group"] for r in rows] == ["b", "a", "c"]  # keeping c makes it worse: last, no share
    assert rows[0]["kl_share"] == pytest.approx(0.07 / 0.09) and rows[2]["kl_share"] == 0.0
    result = {"recipe": "r", "proxy": "p", "texts": 2, "tokens": 16, "text_source": "s", "wall_s": 1.0,
              "forward_passes": 5, "dtype": "float32", "device": "cpu", "groups": rows, "scored_positions": 9,
              "spec": {"method": "restored"}, "all_quantized": {"mean_kl": 0.32, "top1_agreement": 0.8}}
    table = markdown(result)
    assert "KL taken away" in table and "| 1 | b | 1 | 0.07 | 0.25 |" in table and "9 positions scored" in table
