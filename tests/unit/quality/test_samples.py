"""How many items of each quality task are evaluated (quality/samples.py), and the one
form they reach lm-eval in (quality/lmeval.lm_eval_docs)."""

from __future__ import annotations

import pytest

from quantlab.quality.lmeval import lm_eval_docs
from quantlab.quality.samples import Docs, TaskSamples, cache_limit, evaluated_docs, look_rule, task_samples
from quantlab.quality.suites import SHIPPED, Suite, load_suite
from quantlab.recipe.quality import QualitySpec, SuiteTask

DEFAULT = load_suite(SHIPPED / "default")
TASKS = {t.task: t for t in DEFAULT.tasks}


def test_the_recipe_limit_takes_the_first_items_of_every_task():
    spec = QualitySpec(limit=40)
    sample = task_samples(spec, DEFAULT, TASKS["ql_arithmetic"])  # 406 in its data
    assert sample == TaskSamples(items=40, counted=True, docs=Docs(0, 40), looks=(40,))
    # lm-eval is sent the limit itself (it stops at a task's last document on its own); the
    # count the planner sizes on is the smaller of the limit and what the data holds
    assert set(evaluated_docs(spec, [(DEFAULT, t) for t in DEFAULT.tasks]).values()) == {Docs(0, 40)}
    assert {t.task: task_samples(spec, DEFAULT, t).items for t in DEFAULT.tasks} == {
        t.task: min(40, task_samples(QualitySpec(), DEFAULT, t).items) for t in DEFAULT.tasks}
    assert cache_limit(spec) == 40  # the baseline cache's key part, as it always was


def test_a_task_with_fewer_documents_than_the_limit_takes_them_all():
    sample = task_samples(QualitySpec(limit=300), DEFAULT, TASKS["ql_passkey_1300w"])  # 20 in its data
    # lm-eval is asked for 300 and stops at the 20th by itself
    assert (sample.items, sample.counted, sample.docs) == (20, True, Docs(0, 300))


def test_no_limit_evaluates_every_document_as_lm_eval_reads_them():
    """Counted for the planner, but lm-eval is not cut at quantlab's count of the lines."""
    sample = task_samples(QualitySpec(), DEFAULT, TASKS["ql_arithmetic"])
    assert (sample.items, sample.docs, sample.looks) == (406, Docs(0, None), (406,))


def test_a_suite_tasks_own_limit_unless_the_recipe_sets_one():
    """The standard suite's limits, sized for a CPU run (suite.yaml's `limit`)."""
    own = SuiteTask(task="ql_arithmetic", metric="acc", limit=100)
    assert task_samples(QualitySpec(), DEFAULT, own).docs == Docs(0, 100)
    assert task_samples(QualitySpec(limit=30), DEFAULT, own).docs == Docs(0, 30)
    over = task_samples(QualitySpec(limit=5000), DEFAULT, own)
    assert (over.items, over.docs) == (406, Docs(0, 5000))


def test_a_hub_task_uncounted_asks_lm_eval_for_at_most_the_limit():
    hub = Suite("hub", None, [SuiteTask(task="hub_task", metric="acc")])
    task = hub.tasks[0]
    assert task_samples(QualitySpec(limit=50), hub, task) == TaskSamples(50, False, Docs(0, 50), (50,))
    assert task_samples(QualitySpec(), hub, task) == TaskSamples(None, False, Docs(0, None), ())
    assert lm_eval_docs("hub_task", Docs(0, 50).to_json()) == {"limit": 50, "samples": None}


def test_auto_looks_grow_from_first_and_end_at_what_the_baseline_answered():
    spec = QualitySpec(limit=80, samples="auto", sequential={"first": 20, "growth": 2})
    sample = task_samples(spec, DEFAULT, TASKS["ql_arithmetic"], answered=80)
    assert sample.looks == (20, 40, 80)
    assert [sample.look_docs(k) for k in range(3)] == [Docs(0, 20), Docs(20, 40), Docs(40, 80)]
    assert task_samples(spec, DEFAULT, TASKS["ql_arithmetic"], answered=15).looks == (15,)
    assert look_rule(spec)(150) == [20, 40, 80, 150] and look_rule(QualitySpec()) is None


def test_each_docs_reaches_lm_eval_as_the_same_documents():
    assert lm_eval_docs("t", None) == {"limit": None, "samples": None}
    assert lm_eval_docs("t", Docs(0, 20).to_json()) == {"limit": 20, "samples": None}
    assert lm_eval_docs("t", Docs(20, 24).to_json()) == {"limit": None, "samples": {"t": [20, 21, 22, 23]}}
    assert Docs.from_json(Docs(3, None).to_json()) == Docs(3, None) and Docs(20, 24).size == 4
    with pytest.raises(ValueError, match="need an end"):
        lm_eval_docs("t", Docs(5, None).to_json())


def test_an_empty_run_of_documents_is_refused_not_read_as_every_document():
    # lm-eval reads a limit of 0 as no limit: a look with nothing to evaluate must not reach it
    for empty in ([0, 0], [5, 5]):
        with pytest.raises(ValueError, match="no documents to evaluate"):
            lm_eval_docs("ql_lastword", empty)
