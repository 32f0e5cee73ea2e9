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
    """The files a decision is made on, by role: lm-eval outputs (folders or results files: one,
    or a completions run and a chat run) and benchmark files, each role's benchmark files in
    the order given (its repeats)."""

    evals: dict[str, list[Path]] = field(default_factory=dict)
    bench: dict[str, list[Path]] = field(default_factory=dict)

    @classmethod
    def given(cls, *, baseline_evals: Paths = None, candidate_evals: Paths = None, baseline_bench: Paths = None,
              candidate_bench: Paths = None) -> "Evidence":
        """From the command line: each role's evals together or neither, each role's benchmark
        files together or neither, at least one kind; every path exists."""
        evals = {r: _paths(p) for r, p in ((BASELINE, baseline_evals), (CANDIDATE, candidate_evals)) if p}
        bench = {r: _paths(p) for r, p in ((BASELINE, baseline_bench), (CANDIDATE, candidate_bench)) if p}
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
        for kind, got in ((EVALS, evals), (BENCH, bench)):
            for role, paths in got.items():
                for path in paths:
                    if not path.exists():
                        raise RecipeError(f"{path} does not exist", file=str(path),
                                          field=OPTION[kind].format(role=role))
        return cls(evals=evals, bench=bench)

    def paths(self) -> list[tuple[str, str, Path]]:
        """(role, kind, path) of everything given, in a fixed order."""
        return [(role, kind, p) for kind, got in ((EVALS, self.evals), (BENCH, self.bench))
                for role in (BASELINE, CANDIDATE) for p in got.get(role, [])]

    def as_record(self) -> dict:
        return {"evals": {r: [str(p) for p in ps] for r, ps in self.evals.items()},
                "bench": {r: [str(p) for p in ps] for r, ps in self.bench.items()}}


Paths = Path | str | list[Path] | None


def _paths(given: Paths) -> list[Path]:
    return [Path(p) for p in given] if isinstance(given, list) else [Path(given)]


def copy_folder(run_path: Path, role: str, kind: str) -> Path:
    """Where a run keeps its copies of one role's files of one kind."""
    return Path(run_path) / EVIDENCE_DIR / role / kind
