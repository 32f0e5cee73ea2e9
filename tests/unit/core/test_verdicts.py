"""A verdict's fields say what they hold (`check`, `evidence`); records written before
those names (`stage`, `detail`) are still read."""

from __future__ import annotations

import json
from pathlib import Path

from quantlab.core.run import RunRecord
from quantlab.core.verdicts import GateVerdict, all_verdicts, gate_id

OLD_RECORD = Path(__file__).resolve().parents[2] / "data" / "run-record-blocked.json"


def test_old_field_names_are_read_and_new_ones_written():
    old = {"stage": "quality", "gate": "non_inferiority", "scope": "ql_code", "verdict": "fail", "value": -0.2,
           "limit": -0.05, "detail": "candidate 0.30 vs baseline 0.50"}
    v = GateVerdict.model_validate(old)
    assert (v.check, v.evidence) == ("quality", "candidate 0.30 vs baseline 0.50")
    dumped = v.model_dump(mode="json")
    assert dumped["check"] == "quality" and dumped["evidence"].startswith("candidate")
    assert "stage" not in dumped and "detail" not in dumped
    assert GateVerdict.model_validate(dumped) == v


def test_a_run_record_from_before_the_rename_decides_the_same():
    data = json.loads(OLD_RECORD.read_text())
    assert '"detail"' in OLD_RECORD.read_text()  # written with the old names
    record = RunRecord.model_validate(data)
    verdicts = all_verdicts({name: record.result(name) for name in record.stages})
    assert verdicts and all(v.check in ("quality", "performance", "stability", "targets") for v in verdicts)
    assert all(gate_id(v).startswith(v.check + ".") and v.evidence for v in verdicts)
