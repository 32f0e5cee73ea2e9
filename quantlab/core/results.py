"""Typed results of the stages, as the run record stores them.

Pure pydantic models, no engine imports: gates, reports and the manifest read these.
Each result carries a `stage` literal so the record can hold any of them in one field
(a discriminated union); a new stage adds its model here and to `StageOutput`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from quantlab.core.verdicts import GateVerdict


class _Result(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FileFact(_Result):
    size: int
    sha256: str


class QuantizeResult(_Result):
    """What the quantize stage produced (the full detail is in the checkpoint's quantize.json)."""

    stage: Literal["quantize"] = "quantize"
    checkpoint: str = Field(description="Checkpoint folder, relative to the run directory.")
    method: str
    scheme: str | None
    layers_quantized: int
    calibration: dict[str, Any] | None
    quantization_config: dict[str, Any]
    size_bytes: int
    files: dict[str, FileFact]
    timings: dict[str, float]
    peak_rss_bytes: int
    versions: dict[str, str | None]
    model: dict[str, Any]
    gptq_max_loss: float | None = None
    compute_dtype: dict[str, Any] | None = Field(
        None, description="The dtype calibration ran in and why (dtype, requested, model_dtype, reason); the "
        "checkpoint is exported in model_dtype either way.")
    engine_warnings: list[str] = Field(default_factory=list)
    shims: list[str] = Field(default_factory=list)
    reused_from_cache: str | None = Field(None, description="Cache key of the earlier checkpoint reused (same "
                                          "inputs); its timings are those of the run that quantized it.")

    @property
    def weights_sha256(self) -> dict[str, str]:
        return {name: f.sha256 for name, f in self.files.items() if name.endswith(".safetensors")}


class CheckpointResult(_Result):
    """An existing checkpoint brought into a run by `quantlab validate` (copied, hashed)."""

    stage: Literal["checkpoint"] = "checkpoint"
    checkpoint: str = Field(description="Checkpoint folder, relative to the run directory.")
    source: str = Field(description="The folder it was copied from.")
    format: str = Field(description="compressed-tensors, gptq, awq, fp8, ... or unquantized.")
    quantization_config: dict[str, Any] | None
    size_bytes: int
    files: dict[str, FileFact]

    @property
    def weights_sha256(self) -> dict[str, str]:
        return {name: f.sha256 for name, f in self.files.items() if name.endswith(".safetensors")}


class EvidenceFile(_Result):
    role: str = Field(description="baseline or candidate.")
    kind: str = Field(description="lm-eval (a sample log or results file) or benchmark (a per-request result).")
    source: str = Field(description="The file as the user named it.")
    copied: str = Field(description="The copy judged, relative to the run directory.")
    size: int
    sha256: str


class EvidenceResult(_Result):
    """Evidence produced elsewhere (`quantlab decide`): every file copied into the run and
    hashed as copied, so what the checks judged is what the manifest names."""

    stage: Literal["evidence"] = "evidence"
    imported: str = Field(description="What the evidence is and who produced it.")
    files: list[EvidenceFile]
    evals: dict[str, list[str]] = Field(default_factory=dict, description="Per role: the lm-eval outputs the "
                                        "quality check reads (folders or results files), relative to the run "
                                        "directory.")
    bench: dict[str, list[str]] = Field(default_factory=dict, description="Per role: its benchmark files in the "
                                        "order given (its repeats), relative to the run directory.")
    facts: dict[str, Any] = Field(default_factory=dict, description="Per role and kind, what the files say of how "
                                  "they were made (model, versions, seeds, hardware; None where a file does not say).")


class CompatRecord(_Result):
    schemes: list[str] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    expected_kernels: list[str] = Field(default_factory=list, description="kernel_expectation's kernels (the "
                                        "same list, kept: records from before kernel_expectation have only it).")
    kernel_expectation: dict[str, Any] | None = Field(
        None, description="The kernels the scheme should get on this host (serving/kernels.py): kernels, host, "
        "known, why. None: nothing quantized, or a record from before quantlab kept it.")


class SmokeCompletion(_Result):
    prompt: str
    text: str
    finish_reason: str | None


class EngineFacts(_Result):
    """What one served engine reported about itself."""

    base_url: str
    served_model_name: str
    model_dir: str | None = Field(None, description="The folder quantlab served (None for an external endpoint).")
    vllm_version: str | None
    max_model_len: int | None
    smoke_completion: SmokeCompletion
    log: dict[str, Any] | None = Field(None, description="Facts from the server log (None: no log, external server).")
    log_missing: list[str] = Field(default_factory=list)
    startup_s: float | None
    facts_s: float


class ServeResult(_Result):
    stage: Literal["serve"] = "serve"
    mode: Literal["launch", "command", "endpoint"]
    device: str = Field(description="cpu | cuda | unknown (an external endpoint with serve.device auto).")
    engine_args: dict[str, Any] | None = Field(
        None, description="The engine arguments quantlab passed; None when it launched nothing.")
    identical_engine_args: bool | None = Field(
        None, description="True when quantlab launched both with the same arguments; None when it cannot know.")
    side_by_side: bool
    probe: dict[str, Any]
    compat: dict[str, CompatRecord]
    engines: dict[str, EngineFacts]
    dtype: dict[str, Any] | None = Field(
        None, description="What both servers computed in and why (dtype, requested, model_dtype, reason); "
        "float32 on a CPU without native bf16. None for an external endpoint.")
    kernel_path: dict[str, Any] | None = Field(
        None, description="The candidate's kernels against the expectation (serving/gates.kernel_path): expected, "
        "actual per layer type, KV-cache dtype, attention backend, status (pass, fail, inconclusive, not gated, "
        "not measured) and why.")
    gates: list[GateVerdict] = Field(default_factory=list, description="serve.kernel_path@primary, when judged.")
    exposed: str | None = Field(None, description="In words, when serve.host let other hosts reach the servers "
                                "(serve.expose: true); None: only this host could.")


class PerfPoint(_Result):
    workload: str
    point: str  # "c8" (8 in flight) or "r2" (2 requests/s, Poisson)
    concurrency: int | None = None
    rate: float | None = None
    baseline: dict[str, Any] = Field(description="Median over repeats of every metric.")
    candidate: dict[str, Any]
    baseline_repeats: list[dict[str, Any]]
    candidate_repeats: list[dict[str, Any]]
    comparison: dict[str, dict[str, Any]] = Field(description="candidate / baseline per metric, with spread.")
    monitor: dict[str, list[dict[str, Any]]] = Field(description="Engine and process samples, per role per repeat.")
    near_client_ceiling: bool = False
    raw_files: list[str] = Field(default_factory=list)
    intervals: dict[str, dict[str, Any]] = Field(default_factory=dict, description="Bootstrap intervals of the "
                                                 "gated figures: 'ratio:<metric>' and 'candidate:<metric>'.")


class PerfResult(_Result):
    stage: Literal["performance"] = "performance"
    interleaved: bool = Field(description="Baseline and candidate measured alternately (both servers up).")
    order: list[str] = Field(description="The order the blocks were measured in, e.g. baseline#1, candidate#1.")
    points: list[PerfPoint]
    client: dict[str, Any] | None = Field(None, description="The load generator's own ceiling on this machine.")
    client_cpu_share: float = Field(description="CPU seconds the load generator used per wall second, overall.")
    memory: dict[str, dict[str, Any]]
    cost: dict[str, dict[str, Any]] = Field(default_factory=dict)
    gates: list[GateVerdict] = Field(default_factory=list)
    plots: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    workload_context: dict[str, Any] = Field(default_factory=dict, description="Model, engine, hardware, settings.")
    unrepresentative: list[str] = Field(default_factory=list, description="Engine settings under which these "
                                        "figures are not what a production server would show (e.g. eager mode).")
    measured_together: list[str] | None = Field(None, description="In a comparison of several candidates: the "
                                                "servers up and measured in the same interleaved blocks (the "
                                                "baseline's blocks are shared); None in a single-candidate run.")
    comparison_order: list[str] | None = Field(None, description="In a comparison: every block in measuring "
                                               "order, candidates by name.")


class TaskComparison(_Result):
    """One eval task (or a slice's pooled tasks), candidate against baseline, paired."""

    task: str
    slice: str
    metric: str
    filter: str | None
    higher_is_better: bool
    n: int
    baseline: float
    candidate: float
    diff: float = Field(description="candidate - baseline, in the metric's units.")
    ci_low: float
    ci_high: float
    confidence: float
    recovery: float | None
    binary: bool = Field(description="Pass/fail per sample (McNemar applies).")
    worse: int | None = Field(None, description="Samples right for the baseline and wrong for the candidate.")
    better: int | None = None
    mcnemar_p: float | None = None
    answers_changed: int | None = Field(None, description="Samples whose (filtered) answer differs at all.")
    tasks: list[str] = Field(default_factory=list, description="For a slice: the tasks pooled.")


class QualityResult(_Result):
    stage: Literal["quality"] = "quality"
    tasks: list[TaskComparison]
    slices: list[TaskComparison] = Field(default_factory=list)
    kl: dict[str, Any] | None = Field(None, description="Next-token KL(baseline || candidate) summary.")
    baseline_cached: bool = Field(description="The baseline's results came from the baseline cache.")
    baseline_cache_key: str | None = None
    judged_on_these_items: int | None = Field(None, description="Distinct candidates (by weights) judged against "
                                              "these cached baseline answers so far, this one included.")
    skipped: list[str] = Field(default_factory=list, description="Tasks not run, with why.")
    seconds: dict[str, float] = Field(default_factory=dict, description="Wall time per role's evaluation.")
    lm_eval_version: str | None = None
    suites: list[dict[str, Any]] = Field(default_factory=list, description="Name, folder, sha256 of each suite.")
    raw_files: list[str] = Field(default_factory=list)
    flips_file: str | None = None
    plots: list[str] = Field(default_factory=list)
    gates: list[GateVerdict] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    plan: list[str] = Field(default_factory=list, description="What the gates could detect with these items, "
                            "said before the run (quality/planner.py): one line per comparison, then the run's.")
    traffic: list[dict[str, Any]] = Field(default_factory=list, description="Per traffic task: rows, checks "
                                          "errored, critical rows; unchecked rows' agreement with the baseline.")
    code_sandbox: str | None = Field(None, description="Where model code ran (quality/sandbox.py): bwrap, unshare "
                                     "or unsandboxed; None: no task executed model code.")


class StabilityResult(_Result):
    stage: Literal["stability"] = "stability"
    roles: dict[str, dict[str, Any]] = Field(description="Per role: batch, lengths, determinism, bad_requests, "
                                             "soak, seconds (every request accounted for).")
    max_model_len: int
    prompts: int
    prompt_tokens: int
    fallback: str = Field(description="What serves when the candidate is blocked.")
    baseline_cached: bool = Field(False, description="The baseline's probe results came from an earlier run.")
    fallback_rate: dict[str, Any] = Field(description="Share of requests (stability and performance) the "
                                          "candidate failed and the baseline answered.")
    gates: list[GateVerdict] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class LoadQualityLevel(_Result):
    """One role's answers at one level (concurrency 1, or a point's load) over the slice."""

    accuracy: float | None = Field(description="Right answers over the slice's documents (a document not answered "
                                   "or not scored is not right); None with no document.")
    correct: int
    documents: int = Field(description="Documents sent (the slice).")
    answered: int = Field(description="Documents with an answer, scored or not.")
    unscored: int = Field(0, description="Answered documents whose scorer gave no pass/fail.")
    seconds: float | None = Field(None, description="Wall time of this evaluation.")
    goodput: dict[str, Any] | None = Field(None, description="Correct answers within every SLO per second, its "
                                           "interval, the cost per correct answer (load_quality/goodput.Goodput).")


class LoadQualityRole(_Result):
    """One role at one point: its answers at load and at concurrency 1, and its flips between them."""

    load: LoadQualityLevel
    c1: LoadQualityLevel | None = Field(None, description="The same documents at concurrency 1 (None: not asked).")
    flips: dict[str, Any] | None = Field(None, description="The batch noise floor measured here: documents scored "
                                         "at both levels whose pass/fail changed (k, n, rate, low, high, "
                                         "confidence: Clopper-Pearson); None without answers at c1.")


class LoadQualityPoint(_Result):
    name: str = Field(description="'<workload>/<point>', the gates' scope.")
    workload: str
    point: str = Field(description="'c8' (8 in flight) or 'r2' (2 requests/s, Poisson), as the performance stage "
                       "names it.")
    concurrency: int | None = None
    rate: float | None = None
    roles: dict[str, LoadQualityRole] = Field(description="Per role (baseline, candidate).")
    raw_files: list[str] = Field(default_factory=list, description="Its samples and timed requests, relative to "
                                 "the run directory.")


class LoadQualityResult(_Result):
    """Quality at load: the slice's answers per point and role, the gates, goodput counting
    only correct answers, and the batch noise floor."""

    stage: Literal["load_quality"] = "load_quality"
    points: list[LoadQualityPoint]
    tasks: list[str] = Field(default_factory=list, description="The quality tasks sliced.")
    items: dict[str, int] = Field(default_factory=dict, description="Documents per task (its first ones).")
    plan: list[str] = Field(default_factory=list, description="How many documents a point and what they can "
                            "detect (load_quality/slice.planned_items), said before the run.")
    discordance: float | None = Field(None, description="The discordance the plan assumed (its source in `plan`).")
    floor: dict[str, dict[str, Any]] = Field(default_factory=dict, description="Per role: its batch noise floor "
                                             "in the cache (this run's and earlier ones, every point pooled).")
    seconds: dict[str, float] = Field(default_factory=dict, description="Wall time per role, every level.")
    lm_eval_version: str | None = None
    raw_files: list[str] = Field(default_factory=list)
    plots: list[str] = Field(default_factory=list)
    gates: list[GateVerdict] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class TargetOutcome(_Result):
    """One of serve.targets: what served where, how its greedy outputs compare with the
    primary target's, and (set by the release stage's decision) its gates."""

    name: str
    required: bool
    roles: list[str]
    status: Literal["checked", "unservable", "not_started"]
    reason: str | None = Field(None, description="Why it was not checked (unservable, or the server did not start).")
    mode: str
    device: str | None = None
    engine_args: dict[str, Any] | None = Field(None, description="The engine arguments quantlab passed there.")
    probe: dict[str, Any] = Field(default_factory=dict)
    compat: dict[str, CompatRecord] = Field(default_factory=dict)
    engines: dict[str, EngineFacts] = Field(default_factory=dict)
    kernel_path: dict[str, Any] | None = Field(None, description="The candidate's kernels there against the "
                                               "expectation (as ServeResult.kernel_path); its gate is "
                                               "serve.kernel_path@<name> among TargetsResult.gates.")
    batch_mismatch_rate: dict[str, float | None] = Field(default_factory=dict, description="Per role: outputs "
                                                         "that changed in a batch on this target.")
    cross_mismatch_rate: dict[str, float | None] = Field(default_factory=dict, description="Per role: greedy "
                                                         "outputs (sent alone) differing from the primary target's.")
    compared: dict[str, int] = Field(default_factory=dict)
    errors: dict[str, int] = Field(default_factory=dict, description="Per role: greedy requests that failed.")
    examples: list[dict[str, Any]] = Field(default_factory=list, description="Answers that differ from the "
                                           "primary target's (a few per role).")


class TargetsResult(_Result):
    stage: Literal["targets"] = "targets"
    primary: dict[str, Any] = Field(description="The primary target's batch mismatch rate per role, from the same "
                                    "prompts.")
    prompts: int
    max_tokens: int
    targets: dict[str, TargetOutcome]
    gates: list[GateVerdict] = Field(default_factory=list)


class ReleaseResult(_Result):
    stage: Literal["release"] = "release"
    decision: Literal["release", "blocked", "not_shown"]
    why: str
    fallback: str | None = None
    failed_gates: list[str] = Field(default_factory=list)
    not_shown_gates: list[str] = Field(default_factory=list, description="Required gates that could not decide.")
    not_shown_policy: dict[str, Any] | None = Field(None, description="release.policy's rules the decision was "
                                                    "made under (None: before quantlab had them).")
    rule_version: int | None = Field(None, description="The decision rule's version (None: rule 1).")
    error_budget: dict[str, Any] | None = Field(None, description="How the run's error rates were spent "
                                                "(release/error_budget.py), as the manifest records it.")
    targets: dict[str, Any] = Field(default_factory=dict, description="Per serve target: decision, why, required "
                                    "(only when the recipe names serve.targets).")
    manifest: str = Field(description="The manifest, relative to the run directory (inside the checkpoint).")
    environments: dict[str, Any] | None = Field(None, description="Per environment that ran: its SBOM and known "
                                                "vulnerabilities, as the manifest records them (None: a release "
                                                "from before SBOMs).")
    signed: bool
    signing_method: str
    public_key_fingerprint: str | None = None
    local_development_key: bool = False
    attestation: dict[str, Any] | None = Field(None, description="The in-toto attestation written beside the "
                                               "signature (file, sha256, predicate type); None: unsigned, or a "
                                               "release from before attestations.")
    gates: list[GateVerdict] = Field(default_factory=list)  # the release stage adds no gate of its own


StageOutput = Annotated[Union[QuantizeResult, CheckpointResult, EvidenceResult, ServeResult, QualityResult, PerfResult,
                              StabilityResult, LoadQualityResult, TargetsResult, ReleaseResult],
                        Field(discriminator="stage")]
