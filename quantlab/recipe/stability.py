"""The recipe's `stability` section: which robustness checks run, their sizes, their
gates, and the fallback a blocked candidate names. Pure pydantic."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BatchSweep(_Strict):
    concurrency: list[int] = Field(default_factory=lambda: [4, 16], description="Batch sizes the same greedy "
                                   "prompts are sent in, after each was answered alone.")

    @field_validator("concurrency")
    @classmethod
    def _levels(cls, v: list[int]) -> list[int]:
        if not v or any(c < 2 or c > 1024 for c in v):
            raise ValueError(f"concurrency levels must be 2..1024 (1 is the reference); got {v}")
        return v


class LengthSweep(_Strict):
    fractions: list[float] = Field(default_factory=lambda: [0.25, 0.5, 0.9, 1.0], description="Prompt + output "
                                   "length as fractions of the served max_model_len (1.0 = exactly the limit).")
    past_limit: bool = Field(True, description="Also send a prompt just past the limit: a 4xx is expected, "
                             "and the server must stay healthy.")

    @field_validator("fractions")
    @classmethod
    def _fractions(cls, v: list[float]) -> list[float]:
        if any(f <= 0 or f > 1 for f in v):
            raise ValueError(f"fractions must be in (0, 1]; got {v}")
        return v


class Determinism(_Strict):
    repeats: int = Field(3, ge=2, le=50, description="Times each greedy (and each seeded sampled) request is sent.")
    sampled_temperature: float = Field(0.8, gt=0, le=2)
    seed: int = 1234


class Soak(_Strict):
    requests: int = Field(64, ge=1, le=1_000_000)
    concurrency: int = Field(8, ge=1, le=1024)
    max_tokens: int = Field(32, ge=1, le=4096)


class StabilityGates(_Strict):
    max_batch_mismatch_excess: float | None = Field(0.25, ge=0, le=1, description="Candidate's batch mismatch rate "
                                                    "minus the baseline's (vLLM promises no batch invariance, so "
                                                    "the baseline is the reference, not zero).")
    max_length_failures: int | None = Field(0, ge=0, description="Requests within the limit that failed, or a "
                                            "past-the-limit request not answered with a 4xx.")
    max_server_errors: int | None = Field(0, ge=0, description="Bad requests answered with a 5xx, a dropped "
                                          "connection or a 200 (accepted, not refused), or after which /health "
                                          "failed.")
    max_determinism_mismatch: float | None = Field(0.0, ge=0, le=1, description="Share of repeated greedy "
                                                   "requests whose text differed from the first answer.")
    max_soak_error_rate: float | None = Field(0.0, ge=0, le=1)
    max_rss_growth_mb: float | None = Field(512, ge=0, description="Server memory growth over the soak (second "
                                            "half's peak minus the first sample).")


class StabilitySpec(_Strict):
    prompts: int = Field(8, ge=1, le=256, description="Greedy prompts used by the batch sweep and determinism.")
    max_tokens: int = Field(32, ge=1, le=4096, description="Output tokens per check request.")
    request_timeout_s: float = Field(120, gt=0, le=3600)
    batch: BatchSweep | None = Field(default_factory=BatchSweep)
    lengths: LengthSweep | None = Field(default_factory=LengthSweep)
    determinism: Determinism | None = Field(default_factory=Determinism)
    bad_requests: bool = True
    soak: Soak | None = Field(default_factory=Soak)
    gates: StabilityGates = Field(default_factory=StabilityGates)
    concurrent_roles: bool = Field(True, description="With serve.side_by_side, probe the baseline and the "
                                   "candidate at the same time. false: one after the other.")
    baseline_cache: bool = Field(True, description="Reuse the baseline's probe results from an earlier run with "
                                 "the same baseline weights, probe settings, engine, arguments and hardware.")
    fallback: str = Field("baseline", description="What serves if the candidate is blocked: 'baseline', or the "
                          "folder or name of a previously released checkpoint (recorded with the decision).")
