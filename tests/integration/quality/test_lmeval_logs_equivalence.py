"""An lm-eval run written to disk by lm-eval's own tracker (as its CLI does with
--output_path --log_samples) reads back, through quality/lmeval_logs, into exactly the rows
and summary quantlab's lm-eval child writes from the same run's samples in memory: the
restored shapes (loglikelihood pairs, rolling floats, arguments, targets) give the same
compact rows for a multiple-choice, a single-continuation, a generation (with few-shot
examples and a filter) and a perplexity task of the default suite."""

from __future__ import annotations

import json

import pytest

from quantlab.core.shipped import EVAL_SUITES
from quantlab.quality.lmeval import read_samples
from quantlab.quality.lmeval_logs import read_eval_log, write_quantlab_form
from quantlab.quality.sample_format import compact_sample

pytestmark = pytest.mark.slow

TASKS = ["ql_knowledge_mc", "ql_lastword", "ql_arithmetic", "ql_chat", "ql_prose_ppl"]


def test_the_written_log_gives_the_rows_the_child_writes(tiny_model_dir, tmp_path, monkeypatch):
    import lm_eval
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    suite = EVAL_SUITES / "default"
    monkeypatch.chdir(suite)  # the task YAML name their data relative to the working folder
    tracker = EvaluationTracker(output_path=str(tmp_path / "lm-eval"))
    r = lm_eval.simple_evaluate(
        model="hf", model_args={"pretrained": str(tiny_model_dir), "dtype": "float32"}, device="cpu",
        batch_size=4, tasks=TASKS, task_manager=TaskManager(include_path=str(suite), include_defaults=False),
        limit=4, log_samples=True, evaluation_tracker=tracker, random_seed=1234, numpy_random_seed=1234,
        torch_random_seed=1234, fewshot_random_seed=1234, bootstrap_iters=0)
    # quantlab's child: each task's samples compacted in memory, written as JSON lines
    own = {task: [json.loads(json.dumps(compact_sample(s), default=str)) for s in r["samples"][task]]
           for task in TASKS}
    # lm-eval's CLI: the same results through its tracker (which flattens the samples as it writes)
    samples = r.pop("samples")
    tracker.save_results_aggregated(results=r, samples=samples)
    for task in r["configs"]:
        tracker.save_results_samples(task_name=task, samples=samples[task])

    log = read_eval_log(tmp_path / "lm-eval", TASKS)
    write_quantlab_form(log, tmp_path / "quantlab", TASKS)
    for task in TASKS:
        rows, summary = read_samples(tmp_path / "quantlab", task)
        assert rows == own[task], task
        assert summary["results"] == json.loads(json.dumps(r["results"][task], default=str))
        assert summary["higher_is_better"] == r["higher_is_better"][task] and summary["n_samples"] == 4
    kinds = {task: type(own[task][0]["answer"]).__name__ for task in TASKS}
    assert kinds == {"ql_knowledge_mc": "str", "ql_lastword": "str", "ql_arithmetic": "str", "ql_chat": "str",
                     "ql_prose_ppl": "float"}
    assert own["ql_knowledge_mc"][0]["target"] == log.tasks["ql_knowledge_mc"].rows[0]["target"] == 1
    assert log.tasks["ql_chat"].n_shot == 2 and log.lm_eval_version == lm_eval.__version__
