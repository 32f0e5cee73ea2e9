"""The recipe's `selection` section: how one checkpoint is chosen among several
candidates judged against one baseline (pure pydantic; read by `quantlab run a.yaml b.yaml ...`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Rule = Literal["cost_per_success", "least_memory", "highest_throughput", "weighted"]
# what a weighted score may weigh; each figure is normalised across the candidates (best = 1)
WEIGHABLE = ("cost_per_success", "memory", "throughput", "quality")


class SelectionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rule: Rule = Field("cost_per_success", description="Among the candidates released by every required gate: "
                       "cost_per_success (the lowest cost per successful answer at the workload's SLO; needs "
                       "performance.price_per_hour), least_memory (peak memory), highest_throughput (output "
                       "tokens/s at the reference point), weighted (a score from `weights`).")
    unservable: Literal["skip", "stop"] = Field("skip", description="A candidate whose preflight refuses it (e.g. "
                                                "a scheme this host cannot serve): skip (judge the others, list it "
                                                "as refused) or stop (the whole comparison exits 2).")
    at_once: int | None = Field(None, ge=1, description="How many candidates are served at once beside the one "
                                "baseline (default: all, or as many as this host's memory holds). The others wait "
                                "for the next group; each group's load is its own interleaved sweep, and each "
                                "performance record names the servers measured together.")
    weights: dict[str, float] = Field(default_factory=dict, description="rule 'weighted': figure -> weight, "
                                      f"figures: {', '.join(WEIGHABLE)}.")

    @model_validator(mode="after")
    def _weights(self) -> "SelectionSpec":
        unknown = sorted(set(self.weights) - set(WEIGHABLE))
        if unknown:
            raise ValueError(f"selection.weights: unknown figure(s) {unknown}; expected some of {list(WEIGHABLE)}")
        if self.rule == "weighted" and not any(w > 0 for w in self.weights.values()):
            raise ValueError("selection.rule 'weighted' needs selection.weights with at least one positive weight, "
                             "e.g. {cost_per_success: 1, quality: 1}")
        if self.rule != "weighted" and self.weights:
            raise ValueError(f"selection.weights is only read by rule 'weighted'; the rule is '{self.rule}'")
        return self
