"""`quantlab recipes ...`: check, servable, schema, list."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape


from quantlab.core.errors import QuantlabError, RecipeError
from quantlab.cli.base import SHIPPED_RECIPES, err, exit_codes, out, progress, recipes_app


@recipes_app.command("check")
def recipes_check(
    files: Annotated[list[Path], typer.Argument(help="Recipe files to validate.")],
    preflight: Annotated[bool, typer.Option(
        help="Also check the recipe against the model's layer layout (reads the model config, no "
        "weights; builds the default model once if needed) and whether the serving environment can "
        "serve the scheme it will export.")] = False,
) -> None:
    """Validate recipes: schema, method/scheme combination, calibration files."""
    from quantlab.quantize.calibration import read_rows
    from quantlab.recipe.file import load_recipe

    failed = 0
    with exit_codes():
        for f in files:
            try:
                loaded = load_recipe(f)
                for i, p in enumerate(loaded.calibration_paths()):
                    read_rows(p, field_path=f"calibration.datasets.{i}.path")
                if loaded.recipe.quality is not None:
                    from quantlab.quality.traffic import load_rows

                    for t in loaded.recipe.quality.traffic:  # every row checked, schemas and scorers found
                        load_rows(loaded.resolve(t.path))
                notes = []
                if preflight:
                    from quantlab.pipeline.commands import preflight_recipe

                    notes = preflight_recipe(loaded, progress=progress)
                out.print(f"[green]ok[/]   {f}", highlight=False)
                for note in notes:
                    out.print(f"     note: {escape(note)}", highlight=False)
            except QuantlabError as e:
                failed += 1
                err.print(f"[red]fail[/] {escape(str(e))}", highlight=False)
        if failed:
            raise typer.Exit(2)


@recipes_app.command("servable")
def recipes_servable(
    files: Annotated[list[Path], typer.Argument(help="Recipe files, in order of preference.")],
) -> None:
    """Print the first recipe whose scheme this host's serving engine can serve (for
    scripts: `quantlab run $(quantlab recipes servable a.yaml b.yaml)`); say on stderr why
    each one before it was passed over. Exit 2 when none can be served here."""
    from quantlab.pipeline.commands import first_servable

    with exit_codes():
        chosen, refused = first_servable(files)
        for f, why in refused.items():
            err.print(f"[yellow]passed over[/] {f}: {escape(why)}", highlight=False, soft_wrap=True)
        if chosen is None:
            raise RecipeError(f"none of {len(files)} recipe(s) can be served by the serving engine on this host "
                              "(reasons above)")
        if refused:
            err.print(f"[green]chosen[/] {chosen}: the first of the given recipes this host can serve",
                      highlight=False)
        sys.stdout.write(f"{chosen}\n")


@recipes_app.command("schema")
def recipes_schema() -> None:
    """Print the recipe JSON Schema (for editor completion and validation)."""
    from quantlab.recipe.file import json_schema

    sys.stdout.write(json.dumps(json_schema(), indent=2) + "\n")


@recipes_app.command("list")
def recipes_list(
    directory: Annotated[Path, typer.Option("--dir", help="Folder of recipes.")] = SHIPPED_RECIPES,
) -> None:
    """List recipes with their method, scheme and one-line description."""
    from quantlab.recipe.file import load_recipe

    if not directory.is_dir():
        err.print(f"no recipe folder at {directory}")
        raise typer.Exit(2)
    files = sorted(directory.glob("*.yaml"))
    width = max((len(f.name) for f in files), default=0)
    for f in files:
        try:
            r = load_recipe(f).recipe
            q = r.quantization
            what = f"{q.method} {q.scheme or ''}".strip() + (" +kv-fp8" if q.kv_cache else "")
            first = (r.description.strip().splitlines() or [""])[0]
            out.print(f"{f.name:<{width}} {what:<26} {first}", highlight=False, soft_wrap=True)
        except QuantlabError as e:
            out.print(f"{f.name:<{width}} [red]invalid[/]: {escape(str(e).splitlines()[0])}", highlight=False)
