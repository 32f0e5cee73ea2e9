"""What `quantlab run --dry-run` prints: a recipe's plan, or each candidate's for a comparison."""

from __future__ import annotations

from pathlib import Path

import typer


from quantlab.core.errors import RecipeError
from quantlab.cli.base import progress


def print_plans(recipes: list[Path], runs_dir: Path, *, ray: str | None, storage: Path | None) -> None:
    """A comparison's dry run: each candidate's plan, or why it would be left out (a
    scheme this host's engine cannot serve); bad input if none is left. With --ray, what
    would run on the cluster (nothing is joined or started)."""
    from quantlab.recipe.file import load_recipe

    loaded = [load_recipe(r) for r in recipes]  # every file valid before any plan
    if ray:
        from quantlab.executors.ray import storage_for

        where = storage_for(ray, storage, runs_dir)
        typer.echo(f"ray: would run {len(loaded)} candidate(s) as tasks on the nodes of {ray} (quantize, serve "
                   f"and the checks there; the choice and signing here), storage {where}; nothing is joined or "
                   "started in a dry run, and each candidate's preflights run again on its node")
    from quantlab.recipe.family import Family

    # the plans at the confidences the comparison judges by (a candidate refused below shrinks the family)
    family = Family(size=len(loaded), members=tuple(lr.recipe.name for lr in loaded)) if len(loaded) > 1 else None
    if family is not None:
        typer.echo(f"family of {family.size} candidates judged on the same items: every interval gate at confidence "
                   f"1 - (1 - c) / {family.size}; each plan below is at those confidences")
    planned = 0
    for lr in loaded:
        try:
            print_plan(lr, runs_dir, family=family)
            planned += 1
        except RecipeError as err:
            typer.echo(f"candidate {lr.recipe.name} ({lr.path}) would be left out: {err.message}")
    if not planned:
        raise RecipeError("no candidate of the comparison passes its preflights: nothing would run")


def print_plan(loaded, runs_dir: Path, checkpoint: Path | None = None, family=None) -> None:
    from quantlab.pipeline.commands import dry_run

    plan = dry_run(loaded, runs_dir, progress=progress, checkpoint=checkpoint, family=family)
    typer.echo(f"plan for {loaded.recipe.name} (preflights passed; nothing was started):")
    total, unknown = 0.0, []
    for step in plan:
        est = step["estimate_s"]
        if step["stage"] == "quantize" and step["reuses"]:
            est, when = 0.0, "~0 s (cached)"  # a copy of the cached checkpoint
        elif est is None:
            unknown.append(step["stage"])
            when = "no estimate (not run ok before)"
        else:
            when = f"~{est:.0f} s (run {step['from_run']})"
        total += est or 0.0
        why = step["why"] + (f"; {step['reuses']}" if step["reuses"] else "")
        typer.echo(f"  {step['stage']:<12} {when:<44} {why}")
        for line in step["details"]:
            typer.echo(f"      {line}")
    typer.echo(f"  estimated total: ~{total:.0f} s" + (f" plus {', '.join(unknown)}" if unknown else ""))
