"""`quantlab decide`: a release decision on evidence made elsewhere (lm-eval sample logs,
`vllm bench serve --save-detailed` and GuideLLM files from the user's own GPUs), by the
recipe's gates, with the same decision rule, ledger, stream, report and signed release as a run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from quantlab.cli.base import app, exit_codes
from quantlab.cli.run_commands import run_with_summary


@app.command()
def decide(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML file: its quality and performance sections are the "
                                           "gates (its quantization and serve sections are not used).")],
    baseline_evals: Annotated[Optional[list[Path]], typer.Option(
        help="The baseline's lm-eval output (the --output_path folder of a run with --log_samples, or one "
        "results_*.json in it); repeat it for a second run (lm-eval runs chat tasks apart: "
        "local-chat-completions), each task in one of them.")] = None,
    candidate_evals: Annotated[Optional[list[Path]], typer.Option(
        help="The candidate's lm-eval output(s), run with the same tasks, few-shot settings, seed and limit.")] = None,
    baseline_bench: Annotated[Optional[list[Path]], typer.Option(
        help="A benchmark result of the baseline: `vllm bench serve --save-result --save-detailed` JSON or a "
        "GuideLLM report; repeat it, one file per repeat.")] = None,
    candidate_bench: Annotated[Optional[list[Path]], typer.Option(
        help="A benchmark result of the candidate at the same workload point(s); as many repeats as the "
        "baseline's.")] = None,
    checkpoint: Annotated[Optional[Path], typer.Option(
        help="The candidate's checkpoint folder: copied in and hashed, and the release signed over it. Without "
        "it the decision is made and reported, and nothing is signed.")] = None,
    runs_dir: Annotated[Path, typer.Option(help="Root folder for run directories.")] = Path("runs"),
    alone: Annotated[bool, typer.Option("--alone", help="Judged alone at the recipe's alpha, not in the stream "
                                        "of decisions against this baseline's answers.")] = False,
) -> None:
    """Decide on evidence produced elsewhere: the candidate's lm-eval logs and benchmark files against the baseline's.

    The files are copied into the run folder and hashed; the quality logs are paired sample by
    sample (refused where they cannot be: other tasks, prompts, few-shot settings, seeds, limits or
    lm-eval versions), the benchmark files judged by the performance gates. The manifest names every
    file with its sha256 and says the evidence was imported.
    Exit 0 released, 1 blocked by a gate, 2 bad input, 3 run failure, 130 interrupted."""
    from quantlab.core.evidence import Evidence
    from quantlab.recipe.file import load_recipe

    with exit_codes():
        evidence = Evidence.given(baseline_evals=baseline_evals, candidate_evals=candidate_evals,
                                  baseline_bench=baseline_bench, candidate_bench=candidate_bench)
        run_with_summary(load_recipe(recipe), runs_dir, checkpoint=checkpoint, evidence=evidence, alone=alone)
