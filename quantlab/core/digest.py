"""One canonical JSON form and its sha256: cache keys, stage inputs and recorded
identities all hash the same bytes for the same content."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(obj: Any) -> str:
    """Sorted keys, no spaces, anything not JSON (paths, dates) as its str()."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def json_sha256(obj: Any) -> str:
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()


def inputs_hash(inputs: dict[str, Any]) -> str:
    return json_sha256(inputs)


def stage_digest(record: Any) -> str:
    """What a later stage depends on in an earlier one: its inputs and its result."""
    result = record.result.model_dump(mode="json") if record.result is not None else None
    return json_sha256({"status": record.status, "inputs": record.inputs_sha256, "result": result})
