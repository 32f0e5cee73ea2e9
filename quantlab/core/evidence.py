"""Evidence made elsewhere (`quantlab decide`): the baseline's and the candidate's lm-eval
sample logs and benchmark result files, as the user names them, and where a decision's run
folder keeps its copies.

The run judges its copies, never the user's files: each is copied into `evidence/<role>/<kind>/`
and hashed as it is copied (release/evidence_stage.py), so the digests the manifest records are
of the bytes that were judged, whatever happens to the originals afterwards."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from quantlab.core.errors import RecipeError
from quantlab.core.roles import BASELINE, CANDIDATE

EVIDENCE_DIR = "evidence"  # in a run folder
EVALS = "lm-eval"  # lm-eval --output_path folders (results_*.json and samples_*.jsonl)
BENCH = "benchmark"  # vllm bench serve --save-detailed / GuideLLM report files
KINDS = (EVALS, BENCH)
OPTION = {EVALS: "--{role}-evals", BENCH: "--{role}-bench"}  # the command-line option that names each
IMPORTED_BY = ("imported: produced outside quantlab by the user's own lm-eval and benchmark runs, judged here "
               "by quantlab's gates; quantlab did not serve either model")


@dataclass(frozen=True)
class Evidence:
    """The files a decision is made on, by role: lm-eval output folders (or results files) and
    benchmark files, each role's benchmark files in the order given (its repeats)."""

    evals: dict[str, Path] = field(default_factory=dict)
    bench: dict[str, list[Path]] = field(default_factory=dict)

    @classmethod
    def given(cls, *, baseline_evals: Path | None = None, candidate_evals: Path | None = None,
              baseline_bench: list[Path] | None = None, candidate_bench: list[Path] | None = None) -> "Evidence":
        """From the command line: each role's evals together or neither, each role's benchmark
        files together or neither, at least one kind; every path exists."""
        evals = {r: Path(p) for r, p in ((BASELINE, baseline_evals), (CANDIDATE, candidate_evals)) if p is not None}
        bench = {r: [Path(p) for p in ps] for r, ps in ((BASELINE, baseline_bench), (CANDIDATE, candidate_bench))
                 if ps}
        for kind, got in ((EVALS, evals), (BENCH, bench)):
            if len(got) == 1:
                have = next(iter(got))
                other = CANDIDATE if have == BASELINE else BASELINE
                raise RecipeError(f"{OPTION[kind].format(role=have)} is given without "
                                  f"{OPTION[kind].format(role=other)}: a decision compares the candidate with its "
                                  "baseline on the same items, so give both", field=OPTION[kind].format(role=other))
        if not evals and not bench:
            raise RecipeError("no evidence given: name the baseline's and the candidate's lm-eval outputs "
                              "(--baseline-evals, --candidate-evals) and/or their benchmark files "
                              "(--baseline-bench, --candidate-bench)", field="--baseline-evals")
        for role, path in [(r, p) for r, p in evals.items()] + [(r, p) for r, ps in bench.items() for p in ps]:
            if not path.exists():
                kind = EVALS if evals.get(role) == path else BENCH
                raise RecipeError(f"{path} does not exist", file=str(path), field=OPTION[kind].format(role=role))
        return cls(evals=evals, bench=bench)

    def paths(self) -> list[tuple[str, str, Path]]:
        """(role, kind, path) of everything given, in a fixed order."""
        out = [(role, EVALS, self.evals[role]) for role in (BASELINE, CANDIDATE) if role in self.evals]
        return out + [(role, BENCH, p) for role in (BASELINE, CANDIDATE) for p in self.bench.get(role, [])]

    def as_record(self) -> dict:
        return {"evals": {r: str(p) for r, p in self.evals.items()},
                "bench": {r: [str(p) for p in ps] for r, ps in self.bench.items()}}


def copy_folder(run_path: Path, role: str, kind: str) -> Path:
    """Where a run keeps its copies of one role's files of one kind."""
    return Path(run_path) / EVIDENCE_DIR / role / kind
