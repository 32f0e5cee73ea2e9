"""What a release records of evidence made elsewhere (`quantlab decide`): the manifest's
`evidence` entry (who produced it, every file judged with its sha256, how the checkpoint is
tied to it) and its runtime and hardware as the imported files say them, never this machine's.
Pure: read from the evidence stage's result."""

from __future__ import annotations

from typing import Any

from quantlab.core.results import CheckpointResult, EvidenceResult

CHECKPOINT_TIE = ("the checkpoint was given by the user (quantlab decide --checkpoint), copied in and hashed here; "
                  "that the imported evidence was produced by serving these files is the user's statement, not "
                  "checked by quantlab")


def evidence_record(evidence: Any, checkpoint: Any) -> dict[str, Any] | None:
    """The manifest's record of evidence made elsewhere (None: quantlab produced it)."""
    if not isinstance(evidence, EvidenceResult):
        return None
    return {"imported": evidence.imported, "files": [f.model_dump(mode="json") for f in evidence.files],
            "checkpoint": CHECKPOINT_TIE if isinstance(checkpoint, CheckpointResult) else None}


HARDWARE_FACTS = ("gpus", "cpu_model", "nvidia_driver_version", "cuda_runtime_version", "cudnn_version", "os", "device",
                  "hardware", "client_platform")


def imported_runtime(evidence: EvidenceResult) -> tuple[dict[str, Any], dict[str, Any]]:
    """The manifest's runtime and hardware of a decision on imported evidence: what each role's
    files say (None where they do not), never this machine's."""
    runtime, hardware = {"imported": True}, {"imported": True}
    for role, kinds in evidence.facts.items():
        for kind, facts in kinds.items():
            rows = facts if isinstance(facts, list) else [facts]
            runtime.setdefault(role, {})[kind] = [{k: v for k, v in row.items() if k not in HARDWARE_FACTS}
                                                  for row in rows]
            hardware.setdefault(role, {})[kind] = [{k: row.get(k) for k in HARDWARE_FACTS if k in row}
                                                   for row in rows]
    return runtime, hardware
