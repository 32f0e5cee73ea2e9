"""Suite loading: the shipped suite loads; bad suites are refused naming file and field."""

from __future__ import annotations

import shutil

import pytest

from quantlab.core.errors import RecipeError
from quantlab.quality.suites import SHIPPED, load_suite, load_suites
from quantlab.recipe.quality import QualitySpec


def test_shipped_default_suite_covers_the_checklist():
    suite = load_suite(SHIPPED / "default")
    slices = {t.slice for t in suite.tasks}
    assert slices == {"general", "knowledge", "structured", "long-context", "chat", "code", "safety"}
    assert suite.kl_texts.is_file() and len(suite.sha256) == 64
    assert {t.api for t in suite.tasks} == {"completions", "chat"}


@pytest.fixture
def suite_copy(tmp_path):
    dst = tmp_path / "mine"
    shutil.copytree(SHIPPED / "default", dst)
    return dst


def test_a_missing_data_file_names_the_task(suite_copy):
    (suite_copy / "data" / "lastword.jsonl").unlink()
    with pytest.raises(RecipeError, match="ql_lastword.*data/lastword.jsonl.*does not exist"):
        load_suite(suite_copy)


def test_a_gated_metric_no_task_produces_is_refused(suite_copy):
    text = (suite_copy / "suite.yaml").read_text().replace("metric: acc, slice: general", "metric: accuracy, "
                                                                                         "slice: general")
    (suite_copy / "suite.yaml").write_text(text)
    with pytest.raises(RecipeError, match="gates metric 'accuracy'.*lists: acc") as err:
        load_suite(suite_copy)
    assert err.value.field == "tasks.0.metric"


def test_a_task_yaml_error_names_the_file(suite_copy):
    (suite_copy / "code.yaml").write_text("task: ql_code\n  bad: [indent\n")
    with pytest.raises(RecipeError, match="code.yaml.*does not parse"):
        load_suite(suite_copy)


def test_a_task_without_yaml_and_unknown_names_in_the_recipe(suite_copy, tmp_path):
    (suite_copy / "safety.yaml").unlink()
    with pytest.raises(RecipeError, match="'ql_safety' has no task YAML"):
        load_suite(suite_copy)
    with pytest.raises(RecipeError, match="eval suite 'nope' not found"):
        load_suites(QualitySpec(suites=["nope"]), tmp_path)
    with pytest.raises(RecipeError, match="quality.tasks names ql_nothing"):
        load_suites(QualitySpec(tasks=["ql_nothing"]), tmp_path)
    with pytest.raises(RecipeError, match="slice 'maths'"):
        load_suites(QualitySpec(slice_gates={"maths": {}}), tmp_path)


def test_a_loglikelihood_task_cannot_use_the_chat_api(suite_copy):
    text = (suite_copy / "suite.yaml").read_text().replace("{task: ql_lastword, api: completions",
                                                           "{task: ql_lastword, api: chat")
    (suite_copy / "suite.yaml").write_text(text)
    with pytest.raises(RecipeError, match="chat API only generates"):
        load_suite(suite_copy)


def test_a_metric_whose_direction_is_unknown_is_refused_at_load(suite_copy):
    """A summary without higher_is_better used to be read as higher-is-better: a gate on
    a lower-is-better metric would then read a regression as a gain."""
    suite = load_suite(suite_copy)
    assert suite.directions["ql_code"] is True and suite.directions["ql_prose_ppl"] is False
    text = (suite_copy / "code.yaml").read_text()
    (suite_copy / "code.yaml").write_text(text.replace("higher_is_better: true", "weight_by_size: false"))
    with pytest.raises(RecipeError, match="'pass', whose direction is not known.*higher_is_better") as err:
        load_suite(suite_copy)
    assert err.value.field == "tasks.10.higher_is_better"
    suite_file = suite_copy / "suite.yaml"
    suite_file.write_text(suite_file.read_text().replace("metric: pass, slice: code",
                                                         "metric: pass, slice: code, higher_is_better: true"))
    assert load_suite(suite_copy).directions["ql_code"] is True  # the suite says it
    spec = QualitySpec.model_validate({"suites": [], "hub_tasks": [{"task": "mine", "metric": "my_score"}]})
    with pytest.raises(RecipeError, match="direction is not known"):
        load_suites(spec, suite_copy)
    spec = QualitySpec.model_validate({"suites": [], "hub_tasks": [
        {"task": "mine", "metric": "my_score", "higher_is_better": False}, {"task": "gsm8k", "metric": "exact_match"}]})
    assert load_suites(spec, suite_copy)[0].directions == {"mine": False, "gsm8k": True}
