"""The recipe's `quality` section (which suites, how to run them, the gates) and the
schema of a suite file (`suite.yaml` in a suite folder).

Pure pydantic (no engine imports); recipe.py adds `quality` as an optional section.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from quantlab.core.verdicts import renamed

TaskName = str


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class QualityGates(_Strict):
    """Applied to every task (and slice) unless task_gates/slice_gates override a field.
    Each gate is a non-inferiority test at its own margin: it passes only when the
    interval's worse end clears the margin, fails only when the whole (family-adjusted)
    interval is beyond it, and is inconclusive otherwise. Nothing passes on a point estimate."""

    min_recovery: float | None = Field(None, gt=0, le=2, description="Candidate score / baseline score (for "
                                       "lower-is-better metrics such as perplexity: baseline / candidate), tested "
                                       "as non-inferiority at the worsening it allows: (1 - r) x |baseline|.")
    max_drop: float | None = Field(None, ge=0, description="Largest allowed absolute worsening, in the metric's "
                                   "own units (0.05 = five points of accuracy), tested as non-inferiority at "
                                   "that margin.")
    non_inferiority_margin: float | None = Field(0.1, ge=0, le=1, description="Non-inferiority: the confidence "
                                                 "interval of the paired difference must stay above -margin x "
                                                 "|baseline| (pass); entirely below it fails; otherwise "
                                                 "inconclusive.")
    non_inferiority_min_margin: float | None = Field(None, ge=0, description="A floor under the non-inferiority "
                                                     "margin, in the metric's own units (0.05 = five points of "
                                                     "accuracy): margin = max(margin x |baseline|, this). A "
                                                     "relative margin alone shrinks to nothing on a task the "
                                                     "baseline mostly fails (10% of an 11% score is 1 point, "
                                                     "which no suite of a few hundred samples can show).")
    confidence: float = Field(0.95, gt=0.5, lt=1, description="Two-sided confidence of the paired bootstrap "
                              "interval.")
    min_samples: int = Field(20, ge=1, description="Fewer paired samples than this: every gate is inconclusive.")


def ni_margin(gates: "QualityGates", baseline: float) -> float | None:
    """The non-inferiority margin in the metric's units, or None when the gate is off."""
    if gates.non_inferiority_margin is None:
        return None
    return max(gates.non_inferiority_margin * abs(baseline), gates.non_inferiority_min_margin or 0.0)


class GateOverride(_Strict):
    min_recovery: float | None = Field(None, gt=0, le=2)
    max_drop: float | None = Field(None, ge=0)
    non_inferiority_margin: float | None = Field(None, ge=0, le=1)
    non_inferiority_min_margin: float | None = Field(None, ge=0)
    confidence: float | None = Field(None, gt=0.5, lt=1)
    min_samples: int | None = Field(None, ge=1)
    disabled: bool = Field(False, description="Report this task or slice without gating it.")

    def apply(self, base: QualityGates) -> QualityGates:
        values = base.model_dump()
        values.update({k: v for k, v in self.model_dump(exclude={"disabled"}).items() if v is not None})
        return QualityGates(**values)


class SuiteTask(_Strict):
    """One lm-eval task of a suite and how quantlab reads it."""

    task: TaskName = Field(description="lm-eval task name (a task YAML in the suite folder, or a hub task).")
    api: Literal["completions", "chat"] = Field("completions", description="completions: lm-eval "
                                               "local-completions (loglikelihood and generation); chat: "
                                               "local-chat-completions through the chat template.")
    metric: str = Field(description="The per-sample metric the gates judge (e.g. acc, exact_match, "
                        "word_perplexity).")
    filter: str | None = Field(None, description="lm-eval filter whose output is judged (default: the task's "
                               "first).")
    slice: str = Field("general", pattern=r"^[a-z0-9][a-z0-9_-]{0,31}$", description="Checklist slice the task "
                       "belongs to; each slice is also gated on its own.")
    min_model_len: int | None = Field(None, ge=1, description="Skip the task (with a note) when the served "
                                      "max_model_len is shorter.")
    limit: int | None = Field(None, ge=1, description="At most this many samples (the first ones) unless the "
                              "recipe sets quality.limit: a benchmark's size for a CPU run.")
    gated: bool = Field(True, description="false: reported only (a traffic file's rows without a check).")
    higher_is_better: bool | None = Field(None, description="The metric's direction, where its task YAML's "
                                          "metric_list does not say (and for hub tasks with a metric quantlab "
                                          "does not know): a gate must know which way is worse.")


class TrafficFile(_Strict):
    """One file of the user's own prompts (quality/traffic.py reads it)."""

    path: str = Field(description="JSONL of prompts, relative to the recipe.")
    name: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9_]{0,23}$", description="Names its tasks "
                             "(traffic_<name>_<slice>); default: the file's stem, lower-cased.")
    max_tokens: int = Field(256, ge=1, le=8192, description="Longest answer generated per row.")
    scorer_timeout_s: float = Field(10, gt=0, le=600, description="A python check's limit per row.")


class SuiteFile(_Strict):
    name: str
    description: str = ""
    tasks: list[SuiteTask] = Field(min_length=1)
    kl_texts: str | None = Field(None, description="JSONL of {'text': ...} rows for the next-token KL check, "
                                 "relative to the suite folder.")

    @model_validator(mode="after")
    def _unique(self) -> "SuiteFile":
        names = [t.task for t in self.tasks]
        if len(set(names)) != len(names):
            raise ValueError(f"task names must be unique in a suite; got {names}")
        return self


class KLSpec(_Strict):
    enabled: bool = True
    texts: str | None = Field(None, description="JSONL of {'text': ...} rows relative to the recipe (default: "
                              "the first suite's kl_texts).")
    max_texts: int = Field(32, ge=1, le=10_000)
    max_tokens: int = Field(256, ge=8, le=32_768, description="Each text is cut to this many tokens.")
    top_k: int = Field(20, ge=1, le=20, description="Log-probabilities per position (vLLM's default cap is 20).")
    max_mean_kl: float | None = Field(None, gt=0, description="Gate: mean per-token KL(baseline || candidate), "
                                      "nats.")
    min_same_top_rate: float | None = Field(None, ge=0, le=1, description="Gate: share of positions where both "
                                            "models' most likely next token is the same.")


class PooledSpec(_Strict):
    """One non-inferiority test over every gated pass/fail item of every task (stratified
    by task): a small drop spread over all tasks, which no task alone can see."""

    margin: float = Field(0.02, gt=0, le=0.5, description="Largest allowed worsening of the pooled pass rate, in "
                          "points (0.02 = two points).")
    confidence: float = Field(0.95, gt=0.5, lt=1, description="Two-sided confidence of its interval.")


class SequentialSpec(_Strict):
    """How `samples: auto` grows each task's sample: `first`, then x `growth` per look."""

    first: int = Field(40, ge=10, le=100_000, description="Samples per task at the first look.")
    growth: float = Field(2.0, gt=1, le=10, description="Each look evaluates up to this many times the "
                          "samples of the one before (the last look takes all the data there is).")


class QualitySpec(_Strict):
    suites: list[str] = Field(default_factory=lambda: ["default"], description="Shipped suite names "
                              "(eval_suites/<name>) or suite folders relative to the recipe.")
    hub_tasks: list[SuiteTask] = Field(default_factory=list, description="Standard lm-eval tasks (gsm8k, mmlu, "
                                       "...) downloaded from the hub: for machines with a network.")
    traffic: list[TrafficFile] = Field(default_factory=list, description="Your own prompts (JSONL), replayed "
                                       "on both models: rows with a check gated per slice, a critical row's "
                                       "regression blocks on its own, the rest compared with the baseline's answers.")
    tasks: list[TaskName] | None = Field(None, description="Run only these tasks of the suites.")
    limit: int | None = Field(None, ge=1, description="At most this many samples per task (the first ones).")
    samples: Literal["all", "auto"] = Field("all", description="all: the candidate answers every sample (up to "
                                            "limit). auto: evaluate until decided: the candidate answers the "
                                            "first samples of each task, then more at each look, and a task "
                                            "stops as soon as its gates (and its slice's) are decided; each look "
                                            "spends a share of 1 - confidence (O'Brien-Fleming-like: little "
                                            "early, most at the last look), so stopping early keeps the error "
                                            "rates. The baseline answers every sample (it is cached).")
    sequential: SequentialSpec = Field(default_factory=SequentialSpec)
    seed: int = 1234
    num_concurrent: int = Field(8, ge=1, le=256, description="Requests lm-eval keeps in flight.")
    concurrent_roles: bool = Field(True, description="With serve.side_by_side, evaluate the baseline and the "
                                   "candidate at the same time (each with num_concurrent requests in flight); "
                                   "1.29x faster on a 2-core CPU. false: one after the other.")
    request_timeout_s: float = Field(300, gt=0, le=3600)
    max_retries: int = Field(3, ge=0, le=10, description="Retries of a failed request before the task fails.")
    timeout_s: float = Field(3600, gt=0, description="Deadline for one model's whole evaluation.")
    gates: QualityGates = Field(default_factory=QualityGates)
    pooled: PooledSpec | None = Field(default_factory=PooledSpec, description="The pooled gate over every gated "
                                      "pass/fail item (quality.non_inferiority@pooled); null: none.")
    task_gates: dict[TaskName, GateOverride] = Field(default_factory=dict)
    slice_gates: dict[str, GateOverride] = Field(default_factory=dict)
    kl: KLSpec = Field(default_factory=KLSpec)
    allow_code_execution: bool = Field(False, description="Run code the model wrote: the tasks that execute "
                                       "model output (a task YAML with `unsafe_code: true`, such as the default "
                                       "suite's ql_code and the standard suite's std_humaneval, and traffic rows "
                                       "with a python check, whose scorer is handed the model's answer) run it in "
                                       "the code sandbox (quality.code_sandbox). false: a recipe selecting such a "
                                       "task is refused before any work, naming the tasks.")
    code_sandbox: Literal["auto", "bwrap", "unshare", "unsandboxed"] = Field(
        "auto", description="Where model code runs. auto: bubblewrap (bwrap) where it works, else unshare; refused "
        "when neither isolates on this host (install the Debian package bubblewrap). bwrap or unshare: that one, or "
        "refused. unsandboxed: no isolation (the user's rights, files and network; limits and a deadline only), "
        "recorded in the manifest and said in the report's headline.")
    baseline_cache: bool = Field(True, description="Reuse the baseline's results from an earlier run with the "
                                 "same baseline weights, suite, engine version and engine arguments.")
    bootstrap_iters: int = Field(2000, ge=100, le=100_000)

    @model_validator(mode="before")
    @classmethod
    def _current_task_names(cls, data):  # traffic tasks once named traffic_traffic_*: read, with a warning
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if isinstance(data.get("tasks"), list):
            data["tasks"] = [renamed(x, "quality.tasks") if isinstance(x, str) else x for x in data["tasks"]]
        if isinstance(data.get("task_gates"), dict):
            data["task_gates"] = {renamed(k, "quality.task_gates") if isinstance(k, str) else k: v
                                  for k, v in data["task_gates"].items()}
        return data
