"""Your own traffic: every row checked with a clear error, each check kind on real
answers (the user's scorer in a separate process: passing, raising, hanging), the
generated suite (an ordinary suite lm-eval loads), unchecked rows compared with the
baseline's answers, and a critical row that flips."""

from __future__ import annotations

import json

import pytest

from quantlab.core.errors import RecipeError
from quantlab.recipe.quality import TrafficFile
from quantlab.quality.suites import load_suite
from quantlab.quality.traffic import build_suite, compare_unchecked, critical_verdicts, load_rows
from quantlab.quality.traffic_checks import check_answer, first_json, score_checked

SCHEMA = {"type": "object", "required": ["name", "age"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}
SCORERS = '''
import time

def is_polite(answer, row):
    return "please" in answer.lower()

def raises(answer, row):
    raise RuntimeError("scorer bug")

def hangs(answer, row):
    time.sleep(60)
    return True

def not_bool(answer, row):
    return "yes"
'''


def write_traffic(folder, rows):
    (folder / "person.schema.json").write_text(json.dumps(SCHEMA))
    (folder / "scorers.py").write_text(SCORERS)
    path = folder / "traffic.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ROWS = [
    {"id": "capital", "prompt": "The capital of France is", "check": {"contains": "Paris"}, "slice": "facts",
     "critical": True},
    {"id": "json", "messages": [{"role": "user", "content": "Tom is 30. JSON with name and age."}],
     "check": {"json_schema": "person.schema.json"}, "slice": "structured"},
    {"id": "polite", "messages": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Ask me."}],
     "check": {"python": "scorers:is_polite"}, "slice": "facts"},
    {"id": "free", "prompt": "Tell me a story.", "reference": "Once upon a time"},
]


def test_rows_load_with_their_checks_resolved(tmp_path):
    rows = load_rows(write_traffic(tmp_path, ROWS))
    assert [r.id for r in rows] == ["capital", "json", "polite", "free"]
    assert rows[0].critical and rows[0].check == {"kind": "contains", "value": "Paris"}
    assert rows[1].check["value"] == SCHEMA  # the schema read, relative to the traffic file
    assert rows[2].check["value"]["module"] == "scorers" and rows[2].messages[0]["role"] == "system"
    assert rows[3].check is None and rows[3].slice == "traffic"


@pytest.mark.parametrize("row, message", [
    ({"id": "a"}, "neither prompt nor messages"),
    ({"id": "a", "prompt": "x", "messages": [{"role": "user", "content": "y"}]}, "both prompt and messages"),
    ({"prompt": "x"}, "every row needs an id"),
    ({"id": "a", "prompt": "x", "check": {"json_schema": "missing.json"}}, "missing.json not found"),
    ({"id": "a", "prompt": "x", "check": {"json_schema": "bad.json"}}, "bad.json is not JSON"),
    ({"id": "a", "prompt": "x", "check": {"json_schema": "notschema.json"}}, "not a valid JSON schema"),
    ({"id": "a", "prompt": "x", "check": {"regex": "("}}, "does not compile"),
    ({"id": "a", "prompt": "x", "check": {"python": "nomodule:f"}}, "nomodule.py not found"),
    ({"id": "a", "prompt": "x", "check": {"python": "scorers"}}, "expected 'module:function'"),
    ({"id": "a", "prompt": "x", "check": {"equals": "y"}}, "expected one of"),
    ({"id": "a", "prompt": "x", "critical": True}, "critical but has no check"),
    ({"id": "a", "messages": [{"role": "assistant", "content": "y"}]}, "last message must be the user's"),
    ({"id": "a", "prompt": "x", "slice": "Bad Slice"}, "slice 'Bad Slice'"),
    ({"id": "a", "prompt": "x", "weight": 2}, "unknown field(s) weight"),
])
def test_bad_rows_are_named_with_file_and_line(tmp_path, row, message):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "notschema.json").write_text(json.dumps({"type": 12}))
    path = write_traffic(tmp_path, [{"id": "ok", "prompt": "fine"}, row])
    with pytest.raises(RecipeError) as err:
        load_rows(path)
    assert message in str(err.value) and f"{path}:2" in str(err.value)


def test_each_check_kind_on_answers(tmp_path, monkeypatch):
    from quantlab.quality.sandbox import ENV_VAR, ISOLATING, probe

    # the run's choice of sandbox for the user's scorer (test_sandbox.py tries to break out of it)
    monkeypatch.setenv(ENV_VAR, next((k for k in ISOLATING if probe(k) is None), "unsandboxed"))
    tmp_path.chmod(0o755)  # as root, the scorer runs as nobody: its folder must be readable by others
    rows = load_rows(write_traffic(tmp_path, ROWS))
    contains, schema, polite = rows[0].check, rows[1].check, rows[2].check
    assert check_answer(contains, " Paris, of course.", {}) == (True, None)
    assert check_answer(contains, " paris", {})[0] is False  # case matters; use a regex for (?i)
    assert check_answer({"kind": "exact", "value": "4"}, " 4\n", {}) == (True, None)
    assert check_answer({"kind": "regex", "value": r"(?i)\bparis\b"}, "PARIS!", {}) == (True, None)
    assert check_answer(schema, 'Sure: ```json\n{"name": "Tom", "age": 30}\n```', {}) == (True, None)
    assert check_answer(schema, '{"name": "Tom", "age": "thirty"}', {}) == (False, None)
    assert check_answer(schema, "no JSON here", {}) == (False, None)
    timed = {**polite, "timeout_s": 60}  # a generous deadline: a busy 2-core host starts the scorer slowly
    assert check_answer(timed, "Could you please wait?", {"id": "polite"}) == (True, None)
    assert check_answer(timed, "Wait.", {"id": "polite"}) == (False, None)
    raising = {**timed, "value": {**timed["value"], "function": "raises"}}
    ok, error = check_answer(raising, "x", {})
    assert not ok and "scorers:raises failed: RuntimeError: scorer bug" in error
    assert score_checked({"check": raising, "row": {}}, ["x"]) == {"passed": 0, "errored": 1}
    hanging = {**timed, "value": {**timed["value"], "function": "hangs"}, "timeout_s": 1}
    ok, error = check_answer(hanging, "x", {})
    assert not ok and "took over 1 s" in error
    wrong_type = {**timed, "value": {**timed["value"], "function": "not_bool"}}
    ok, error = check_answer(wrong_type, "x", {})
    assert not ok and "returned str, not a bool" in error
    assert first_json('a [1, 2] b {"x": 1}') == [1, 2]


class ChatTokenizer:
    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt and not tokenize
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


def test_the_generated_suite_is_an_ordinary_suite(tmp_path, monkeypatch):
    path = write_traffic(tmp_path, ROWS)
    folder = build_suite(TrafficFile(path=str(path), max_tokens=64), path, ChatTokenizer(), tmp_path / "cache")
    assert build_suite(TrafficFile(path=str(path), max_tokens=64), path, ChatTokenizer(), tmp_path / "cache") == folder
    suite = load_suite(folder)
    tasks = {t.task: t for t in suite.tasks}
    assert set(tasks) == {"traffic_facts", "traffic_structured", "traffic_unchecked"}
    assert tasks["traffic_facts"].metric == "passed" and tasks["traffic_facts"].gated
    assert tasks["traffic_unchecked"].metric == "answered" and not tasks["traffic_unchecked"].gated
    assert suite.code_tasks == {"traffic_facts"}  # its python check runs the user's scorer on the model's answer
    facts = [json.loads(x) for x in (folder / "data" / "traffic_facts.jsonl").read_text().splitlines()]
    assert [d["id"] for d in facts] == ["capital", "polite"]  # critical first
    assert facts[1]["prompt"] == "<system>Be kind.<user>Ask me.<assistant>"  # the chat template's rendering
    assert facts[1]["check"]["timeout_s"] == 10
    # a changed file is a new suite (its hash names the folder)
    path.write_text(path.read_text().replace("Paris", "Lyon"))
    assert build_suite(TrafficFile(path=str(path)), path, ChatTokenizer(), tmp_path / "cache") != folder

    from lm_eval.tasks import TaskManager, get_task_dict

    monkeypatch.chdir(folder)  # lm-eval runs in the suite folder (task YAML name data relative to it)
    loaded = get_task_dict(list(tasks), TaskManager(include_path=str(folder), include_defaults=False))
    docs = list(loaded["traffic_structured"].test_docs())
    assert docs[0]["prompt"].startswith("<user>Tom is 30.")


def sample(doc_id, raw, **metrics):
    return {"doc_id": doc_id, "raw": raw, "prompt": "p", "metrics": metrics}


def test_unchecked_rows_against_the_baselines_answers():
    base = [sample(0, "Paris is the capital."), sample(1, "Once upon a time, a fox."), sample(2, "Yes")]
    cand = [sample(0, "paris is the capital"), sample(1, "A fox lived in a hole."), sample(2, "Yes")]
    found = compare_unchecked("t", base, cand)
    assert found["n"] == 3 and found["same_rate"] == pytest.approx(2 / 3)
    assert found["most_changed"][0]["doc_id"] == 1 and found["most_changed"][0]["chrf"] < 60
    assert 0 < found["mean_chrf"] < 100


def test_a_critical_row_that_flips_blocks_on_its_own():
    docs = [{"id": "capital", "critical": True}, {"id": "other", "critical": False},
            {"id": "both-fail", "critical": True}, {"id": "errored", "critical": True}]
    base = [sample(0, "", passed=1, errored=0), sample(1, "", passed=1, errored=0),
            sample(2, "", passed=0, errored=0), sample(3, "", passed=1, errored=0)]
    cand = [sample(0, "", passed=0, errored=0), sample(1, "", passed=0, errored=0),
            sample(2, "", passed=0, errored=0), sample(3, "", passed=0, errored=1)]
    verdicts = {v.scope: v for v in critical_verdicts("traffic_x_facts", docs, base, cand)}
    assert set(verdicts) == {"traffic_x_facts:capital", "traffic_x_facts:both-fail", "traffic_x_facts:errored"}
    assert verdicts["traffic_x_facts:capital"].verdict == "fail"
    assert "passes on the baseline, fails on the candidate" in verdicts["traffic_x_facts:capital"].evidence
    assert verdicts["traffic_x_facts:both-fail"].verdict == "pass"  # no regression: the baseline fails it too
    assert verdicts["traffic_x_facts:errored"].verdict == "inconclusive"  # fail closed: not shown
    missing = critical_verdicts("t", docs[:1], base[:1], [])
    assert missing[0].verdict == "inconclusive" and "not answered" in missing[0].evidence


def test_a_recipe_naming_the_old_doubled_traffic_tasks_is_read_with_a_warning():
    from quantlab.core.verdicts import OldNameWarning
    from quantlab.recipe.quality import QualitySpec
    from quantlab.recipe.release import ReleasePolicySpec

    with pytest.warns(OldNameWarning, match="'quality.non_inferiority@traffic_traffic_facts' is an old name"):
        policy = ReleasePolicySpec(gates={"quality.non_inferiority@traffic_traffic_facts": "warn"})
    assert policy.gates == {"quality.non_inferiority@traffic_facts": "warn"}
    with pytest.warns(OldNameWarning, match="quality.tasks: 'traffic_traffic_facts'"):
        spec = QualitySpec(tasks=["traffic_traffic_facts", "ql_code"])
    assert spec.tasks == ["traffic_facts", "ql_code"]
    assert QualitySpec(tasks=["traffic_q3_facts"]).tasks == ["traffic_q3_facts"]  # a name of its own is kept
