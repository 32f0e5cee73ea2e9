"""The predicate of quantlab's release attestation: what was evaluated, how, on what, and
what was decided, as an in-toto Statement v1 predicate (its type a versioned URI).

Pure: the model is built from a signed manifest (release/manifest.Manifest) and carries no
quantlab-only types, so anyone can validate it with the JSON Schema in the package
(`quantlab/shipped/schemas/`, printed by `quantlab manifest-schema --attestation`)
without installing quantlab. A new field is added as optional; a field removed or
changed in meaning is a new version of the type.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

PREDICATE_TYPE = "https://quantlab.dev/attestation/release-evaluation/v1"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
SCHEMA_FILE = "release-evaluation-v1.schema.json"  # in quantlab/shipped/schemas/


class _P(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FileDigest(_P):
    name: str = Field(description="The file's name in the released folder.")
    sha256: str


class Gate(_P):
    """One gate at one scope, as the decision read it."""

    id: str = Field(description="check.gate@scope, as decisions and reports name it.")
    check: str = Field(description="serve, quality, performance, stability or targets.")
    gate: str
    scope: str
    target: str | None = Field(description="The serve target it decides; null: the primary target.")
    metric: str | None = Field(description="The figure judged.")
    comparator: Literal["at_most", "at_least", "non_inferior"] | None
    limit: float = Field(description="The limit; for non_inferior the negated margin.")
    margin: float | None = Field(description="non_inferior: the largest worsening allowed, in the metric's units.")
    confidence: float | None = Field(description="Two-sided confidence of the pass side's interval.")
    fail_confidence: float | None = Field(description="Confidence of the fail side's interval (adjusted for the "
                                          "family of gates and looks).")
    samples: int | None = Field(description="Paired samples behind a quality verdict.")
    value: float | None = Field(description="The figure measured.")
    estimate: float | None = Field(description="The point estimate compared with the limit.")
    interval: list[float | None] | None = Field(description="[low, high] of the estimate at `confidence`.")
    test: str | None = Field(description="The interval or test used (tango-score, bca-bootstrap, "
                             "hierarchical-bootstrap, count, threshold).")
    verdict: Literal["pass", "fail", "inconclusive"]
    evidence: str = Field(description="What was compared, over which samples, and why the verdict is what it is.")


class Decision(_P):
    decision: Literal["release", "blocked", "not_shown"]
    why: str
    failed_gates: list[str]
    not_shown_gates: list[str]
    warned_gates: list[str]
    rule_version: int | None = Field(description="The decision rule's version (quantlab's release/decision.py).")
    policy: dict[str, Any] | None = Field(description="release.policy's rules the decision was made under.")
    fallback: str | None = Field(description="What to serve instead when not released.")
    targets: dict[str, dict[str, Any]] = Field(description="Per serve target: decision, required, why.")


class Suite(_P):
    name: str
    sha256: str = Field(description="Digest of the suite folder's files (task definitions and data).")


class Harness(_P):
    """What ran the evaluation."""

    quantlab: dict[str, Any] = Field(description="version, git_commit (null outside a checkout) and code_sha256: "
                                     "sha256 over the installed quantlab package's Python sources.")
    versions: dict[str, str | None] = Field(description="lm-eval, vllm, llm-compressor, compressed-tensors "
                                            "(quantize and serve), torch, transformers: the versions that ran.")


class Predicate(_P):
    manifest: FileDigest = Field(description="The signed quantlab manifest this attestation summarises.")
    model_signing_subject: FileDigest = Field(description="The subject of the OpenSSF model-signing statement "
                                              "over the same folder (the model's name and its root digest): "
                                              "tools join the two statements on it.")
    created_at: str
    recipe: dict[str, Any] = Field(description="name and sha256 of the recipe.")
    model: dict[str, Any] = Field(description="The unquantized source: kind and source.")
    quantization: dict[str, Any] = Field(description="method, scheme and the checkpoint's quantization_config.")
    calibration: dict[str, Any] | None = Field(description="The calibration set: files with sha256, sampling, "
                                               "the digest of the exact token ids.")
    suites: list[Suite] = Field(description="The eval suites the quality gates were judged on.")
    data: dict[str, Any] | None = Field(description="Digests of the data files and the seeds, as registered "
                                        "before any engine started.")
    registration: dict[str, Any] | None = Field(description="The gate set registered before the evidence: its "
                                                "statement's sha256, the gate set's digest and the one decided "
                                                "under; null: none was registered.")
    harness: Harness
    hardware: dict[str, Any] = Field(description="The device the checks ran on, from the serving environment's "
                                     "own probe: GPUs (name, compute capability, driver) or the CPU (model, ISA).")
    kernels: dict[str, Any] = Field(description="The kernel library the engine build loaded and, per served role, "
                                    "the linear kernels per layer type, attention backend and KV-cache dtype.")
    environments: dict[str, Any] | None = Field(None, description="The software bill of materials of each "
                                                "environment (file, sha256) and its known vulnerabilities.")
    evidence: dict[str, Any] | None = Field(None, description="Imported evidence (quantlab decide): its files with "
                                            "sha256, by role and kind, and who produced them; null: quantlab "
                                            "produced the evidence itself by serving both models.")
    gates: list[Gate]
    error_budget: dict[str, Any] | None = Field(description="How the run's error rates were spent.")
    decision: Decision
    run: dict[str, Any] = Field(description="Run id and, on a cluster, the node and job the checks ran on.")


def json_schema() -> dict[str, Any]:
    schema = Predicate.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = PREDICATE_TYPE
    schema["title"] = "quantlab release evaluation (in-toto predicate)"
    return schema
