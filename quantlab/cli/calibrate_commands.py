"""`quantlab calibrate`: this host's performance noise for a recipe's workloads."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from quantlab.cli.base import app, exit_codes, progress

METRIC_NAMES = {"output_tokens_per_s": "throughput", "ttft_ms.p99": "P99 TTFT", "tpot_ms.p99": "P99 TPOT"}


@app.command()
def calibrate(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML file whose performance workloads are calibrated.")],
    repeats: Annotated[int, typer.Option(help="Paired A/A repeats (each one degree of freedom per point).")] = 10,
    min_df: Annotated[Optional[int], typer.Option(
        help="Do nothing when this host's store already holds at least this many degrees of freedom for every "
        "point and metric of the recipe.")] = None,
    runs_dir: Annotated[Path, typer.Option(help="Root folder for the A/A run's directory.")] = Path("runs"),
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show the engines' own output here.")] = False,
) -> None:
    """Calibrate this host's performance noise: the baseline's weights on both servers (an A/A run).

    Measures the recipe's workload points --repeats times on two servers of the baseline's weights and keeps
    each point's per-repeat log ratios in the cache; later runs of the recipe on this host pool them with their
    own repeats (performance.host_noise). Exit 0 calibrated, 2 bad input, 3 run failure, 130 interrupted."""
    from quantlab.pipeline.calibrate import calibrate as run_calibration
    from quantlab.recipe.file import load_recipe

    with exit_codes():
        loaded = load_recipe(recipe)
        done = run_calibration(loaded, runs_dir, repeats=repeats, min_df=min_df, progress=progress,
                               verbose=verbose)
        for note in done.notes:
            typer.echo(note)
        typer.echo("point            figure       added df  sd(log ratio)  store df  store sd")
        for r in done.rows:
            added = f"{r['added_sd']:.3f}" if r["added_sd"] is not None else "-"
            total = f"{r['sd']:.3f}" if r["sd"] is not None else "-"
            typer.echo(f"{r['workload'] + '/' + r['point']:<16} {METRIC_NAMES[r['metric']]:<12} "
                       f"{r['added_df']:>8}  {added:>13}  {r['df']:>8}  {total:>8}")
        if done.run_dir is not None:
            typer.echo(str(done.run_dir / "run.json"))
