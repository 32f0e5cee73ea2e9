"""Your own traffic replayed through the real served endpoint (the session's tiny server,
no server started here): every check kind on real answers, a user scorer that raises and
one that hangs (those rows error, the run goes on and counts them), unchecked rows
compared with the baseline's answers, and a critical row that flips and blocks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, tiny_endpoint_recipe, validate, write_recipe

pytestmark = pytest.mark.slow

# The tiny random model writes noise, and baseline and candidate are the same server here,
# so no answer can regress by itself: the critical row's scorer passes the first answer it
# scores (the baseline's, evaluated first) and fails the next (the candidate's). Everything
# after the scorer (the flip, the gate, the decision) is the product's own path. Keeping that
# state needs a file beside the scorer, which the sandbox never lets a scorer write: this run
# names quality.code_sandbox: unsandboxed, and the report says so.
SCORERS = '''
import pathlib, time

def first_call_only(answer, row):
    mark = pathlib.Path(__file__).with_name("seen-" + row["id"])
    if mark.exists():
        return False
    mark.write_text("1")
    return True

def raises(answer, row):
    raise ValueError("bad scorer")

def hangs(answer, row):
    time.sleep(120)
    return True
'''


def test_traffic_replay_blocks_on_a_critical_row(tiny_server, tiny_served_checkpoint, tmp_path):
    server, _, _ = tiny_server
    folder = tmp_path / "traffic"
    folder.mkdir()
    (folder / "scorers.py").write_text(SCORERS)
    (folder / "obj.schema.json").write_text(json.dumps({"type": "object"}))
    rows = [
        {"id": "any", "prompt": "Hello", "check": {"regex": "(?s)."}, "slice": "basics"},
        {"id": "exact", "prompt": "Hello", "check": {"exact": "surely not this"}, "slice": "basics"},
        {"id": "contains", "messages": [{"role": "user", "content": "Hi"}], "check": {"contains": "zzzz-never"},
         "slice": "basics"},
        {"id": "schema", "prompt": "Give JSON", "check": {"json_schema": "obj.schema.json"}, "slice": "structured"},
        {"id": "raises", "prompt": "x", "check": {"python": "scorers:raises"}, "slice": "scored"},
        {"id": "hangs", "prompt": "y", "check": {"python": "scorers:hangs"}, "slice": "scored"},
        {"id": "vip", "prompt": "z", "check": {"python": "scorers:first_call_only"}, "slice": "scored",
         "critical": True},
        {"id": "free-1", "prompt": "Once upon a time"},
        {"id": "free-2", "messages": [{"role": "user", "content": "Tell me about cats."}]},
    ]
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = write_recipe(tmp_path, {
        **tiny_endpoint_recipe("tiny-traffic", server, tiny_served_checkpoint),
        "quality": {"suites": [], "kl": {"enabled": False},
                    "traffic": [{"path": "traffic/rows.jsonl", "max_tokens": 12, "scorer_timeout_s": 2}],
                    "allow_code_execution": True, "code_sandbox": "unsandboxed"},
        "release": {"policy": {"not_shown": "warn"}},
    })
    r = validate(recipe, tiny_served_checkpoint, tmp_path, relative_runs=True)
    assert r.returncode == 1, r.stderr[-3000:]  # blocked by the critical row alone
    [run_dir] = (tmp_path / "runs" / "tiny-traffic").iterdir()
    record = json.loads((run_dir / "run.json").read_text())
    q = record["stages"]["quality"]["result"]
    release = record["stages"]["release"]["result"]
    assert release["decision"] == "blocked"
    assert release["failed_gates"] == ["quality.critical_row@traffic_rows_scored:vip"], release["failed_gates"]
    tasks = {t["task"]: t for t in q["tasks"]}
    assert set(tasks) == {"traffic_rows_basics", "traffic_rows_structured", "traffic_rows_scored",
                          "traffic_rows_unchecked"}
    # the same answers on both sides: the regex passes, exact and contains fail, on both
    assert tasks["traffic_rows_basics"]["baseline"] == tasks["traffic_rows_basics"]["candidate"] == pytest.approx(1 / 3)
    # unchecked rows are reported, not gated; the same server answered alike
    assert not [g for g in q["gates"] if g["scope"] in ("traffic_rows_unchecked", "slice:traffic")]
    findings = {f["task"]: f for f in q["traffic"]}
    assert findings["traffic_rows_unchecked"]["n"] == 2 and findings["traffic_rows_unchecked"]["same_rate"] == 1.0
    # the scorer that raises and the one that hangs: errored on both roles, counted, the run went on
    assert findings["traffic_rows_scored"]["errored"] == {"baseline": 2, "candidate": 2}
    [vip] = findings["traffic_rows_scored"]["critical"]
    assert vip["verdict"] == "fail" and "passes on the baseline, fails on the candidate" in vip["evidence"]
    report = (run_dir / "report.md").read_text()
    assert "traffic_rows_scored:vip: FAIL" in report and "the check errored on 2 baseline" in report
    assert q["code_sandbox"] == "unsandboxed" and "**BLOCKED (model code ran UNSANDBOXED): " in report
    assert "decision: BLOCKED (model code ran UNSANDBOXED): " in r.stderr + r.stdout
    # recipes check reads every row too
    (folder / "rows.jsonl").write_text(json.dumps({"id": "x"}) + "\n")
    check = subprocess.run([sys.executable, "-m", "quantlab", "recipes", "check", recipe], capture_output=True,
                           text=True, cwd=REPO, timeout=120)
    text = "".join(check.stderr.split())  # the terminal may wrap a long path anywhere
    assert check.returncode == 2 and "rows.jsonl:1:row'x'hasneitherpromptnormessages" in text, check.stderr
