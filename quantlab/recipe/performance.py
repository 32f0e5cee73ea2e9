"""The recipe's `performance` section: workloads, SLOs, gates and an optional price.

Pure pydantic (no engine imports); recipe.py adds it as an optional section.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Length = int | tuple[int, int]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _check_length(v: Length, what: str) -> Length:
    lo, hi = (v, v) if isinstance(v, int) else v
    if lo < 1 or hi < lo:
        raise ValueError(f"{what} must be a positive count or a range [min, max] with 1 <= min <= max; got {v}")
    return v


def max_length(v: Length) -> int:
    return v if isinstance(v, int) else v[1]


class Workload(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,31}$", description="Short slug; names the result files.")
    api: Literal["completions", "chat"] = Field(
        "completions", description="completions: /v1/completions with the prompt as token ids (exact lengths); "
        "chat: /v1/chat/completions through the model's chat template.")
    prompt_tokens: Length = Field(128, description="Prompt length in tokens: a count or [min, max] (uniform).")
    output_tokens: Length = Field(64, description="Tokens generated per request (EOS ignored): a count or [min, max].")
    dataset: str | None = Field(
        None, description="JSONL of prompts ('text' or 'messages' rows), relative to the recipe; replaces the "
        "synthetic prompts (prompt_tokens is then the cut-off length).")
    concurrency: list[int] = Field(default_factory=lambda: [1, 8], description="Closed-loop points: requests "
                                   "in flight at once.")
    request_rates: list[float] = Field(default_factory=list, description="Open-loop points: requests per "
                                       "second with Poisson arrivals.")
    num_requests: int = Field(32, ge=1, le=100_000, description="Measured requests per point.")
    duration_s: float | None = Field(None, gt=0, description="Stop sending after this long (whichever of "
                                     "num_requests and duration_s comes first).")
    warmup_requests: int = Field(2, ge=0, le=1000, description="Requests sent to each server before its first "
                                 "measured point of this workload (at most 16 output tokens each), not counted; "
                                 "at least one full batch at the highest concurrency (0 = no warm-up).")
    request_timeout_s: float = Field(300, gt=0, le=3600, description="A request slower than this is timed out.")
    seed: int = 0

    @field_validator("prompt_tokens")
    @classmethod
    def _prompt(cls, v: Length) -> Length:
        return _check_length(v, "prompt_tokens")

    @field_validator("output_tokens")
    @classmethod
    def _output(cls, v: Length) -> Length:
        return _check_length(v, "output_tokens")

    @model_validator(mode="after")
    def _points(self) -> "Workload":
        if not self.concurrency and not self.request_rates:
            raise ValueError("a workload needs at least one point: 'concurrency' levels or 'request_rates'")
        if any(c < 1 or c > 4096 for c in self.concurrency):
            raise ValueError(f"concurrency levels must be 1..4096; got {self.concurrency}")
        if any(r <= 0 for r in self.request_rates):
            raise ValueError(f"request_rates must be positive requests per second; got {self.request_rates}")
        return self


class SLO(_Strict):
    """Per-request limits; a request that meets all of them counts towards goodput."""

    ttft_ms: float | None = Field(None, gt=0, description="Time to first token.")
    tpot_ms: float | None = Field(None, gt=0, description="Mean time per output token after the first.")
    e2e_ms: float | None = Field(None, gt=0, description="Whole-request latency.")


class PerfGates(_Strict):
    """Each gate is checked at every workload point. Ratios are candidate / baseline,
    medians over the paired repeats, judged with their bootstrap interval (see
    performance.confidence); unset gates are not checked."""

    min_throughput_ratio: float | None = Field(0.8, gt=0, description="Output tokens/s, candidate / baseline.")
    max_p99_ttft_ratio: float | None = Field(1.5, gt=0, description="P99 TTFT, candidate / baseline.")
    max_p99_tpot_ratio: float | None = Field(1.5, gt=0, description="P99 TPOT, candidate / baseline.")
    max_p99_ttft_ms: float | None = Field(None, gt=0, description="Absolute limit on the candidate's P99 TTFT.")
    max_p99_tpot_ms: float | None = Field(None, gt=0, description="Absolute limit on the candidate's P99 TPOT.")
    max_error_rate: float | None = Field(0.0, ge=0, le=1, description="Failed or timed-out share of requests.")


class PerformanceSpec(_Strict):
    workloads: list[Workload] = Field(min_length=1)
    repeats: int = Field(2, ge=1, le=20, description="Baseline and candidate are measured alternately "
                         "(A, B, A, B, ...) this many times each, so machine drift cancels.")
    max_repeats: int | None = Field(None, ge=1, le=50, description="Measure more paired repeats, one at a time, "
                                    "of the workload points whose gates are not shown yet (their interval "
                                    "includes the limit), up to this many; unset: exactly `repeats`. Needs "
                                    "serve.side_by_side.")
    confidence: float = Field(0.95, gt=0.5, lt=1, description="A ratio or latency gate passes when its one-sided "
                              "bootstrap bound at this confidence is within the limit; it fails only when the "
                              "family-adjusted bound is beyond it; otherwise it is not shown.")
    bootstrap_draws: int = Field(4000, ge=500, le=100_000, description="Draws of the hierarchical bootstrap "
                                 "(repeats, then requests within each) behind each gated figure's interval.")
    slo: SLO = Field(default_factory=SLO)
    gates: PerfGates = Field(default_factory=PerfGates)
    price_per_hour: float | None = Field(None, gt=0, description="Hardware price per hour (any currency) for "
                                         "cost per million output tokens and per successful request.")
    host_noise: bool = Field(True, description="Pool this host's calibrated between-repeat spread (A/A repeats "
                             "from `quantlab calibrate` and earlier runs' baseline repeats, kept in the cache per "
                             "host, engine, baseline and workload point) with the run's own repeats, so a run of 2-3 "
                             "repeats judges with tens of degrees of freedom; false: the run's own repeats alone.")
    client_check: bool = Field(True, description="Measure the load generator's own ceiling on this machine "
                               "against a stub server first (about 3 s), to flag points near it.")

    @model_validator(mode="after")
    def _unique_names(self) -> "PerformanceSpec":
        names = [w.name for w in self.workloads]
        if len(set(names)) != len(names):
            raise ValueError(f"workload names must be unique; got {names}")
        if self.max_repeats is not None and self.max_repeats < self.repeats:
            raise ValueError(f"max_repeats ({self.max_repeats}) is the most repeats adaptive measuring may take, "
                             f"so it cannot be below repeats ({self.repeats}); raise it or leave it unset")
        return self
