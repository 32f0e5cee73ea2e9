"""`quantlab run`'s options for several candidates: --checkpoint's names, --family's
members, and --alone, which only a single run takes."""

from __future__ import annotations

from pathlib import Path

from quantlab.core.errors import RecipeError


def refuse_alone(alone: bool, *, several: bool) -> None:
    """--alone takes a single run out of its stream (pipeline/streams.py). A comparison
    (several recipes, --checkpoint, --ray) and a search take no stream position yet: they
    are judged as a family at the recipe's alpha divided by its size, so --alone would
    change nothing there, and is refused rather than silently ignored."""
    if alone and several:
        raise RecipeError("--alone judges one run alone, outside the stream of decisions against its baseline; a "
                          "comparison (several recipes, --checkpoint or --ray) takes no stream position yet: it is "
                          "judged as a family, every interval gate at the recipe's alpha divided by the number of "
                          "candidates, and nothing is counted across comparisons (docs/decisions.md). Drop --alone, "
                          "or run one recipe with it", field="--alone")


def declared_family(name: str, size: int, recipes: list[Path], checkpoints: dict[str, Path]):
    """--family NAME --family-size N: these candidates joined to the family (before any work)."""
    from quantlab.pipeline.families import join_family
    from quantlab.recipe.file import load_recipe

    members = {}
    for path in recipes:
        loaded = load_recipe(path)
        members[loaded.recipe.name] = {"recipe_sha256": loaded.content_hash}
    for cand, folder in checkpoints.items():
        members[cand] = {"checkpoint": str(Path(folder).resolve())}
    return join_family(name, size, members)


def named_checkpoints(values: list[str] | None) -> dict[str, Path]:
    """--checkpoint NAME=DIR (or DIR, named after its folder) -> {name: folder}."""
    import re

    named: dict[str, Path] = {}
    for value in values or []:
        name, sep, folder = value.partition("=")
        if not sep or Path(value).is_dir():  # a folder whose path holds '=' is a folder
            folder, name = value, re.sub(r"[^a-z0-9._-]+", "-", Path(value).resolve().name.lower()).strip("-._")
        if not name or not folder:
            raise RecipeError(f"--checkpoint {value!r}: expected NAME=DIR or DIR", field="--checkpoint")
        if name in named:
            raise RecipeError(f"--checkpoint: two checkpoints are named '{name}' ({named[name]} and {folder}); "
                              "name them apart with NAME=DIR", field="--checkpoint")
        named[name] = Path(folder)
    return named
