"""Families declared across separate runs: `quantlab run ... --family NAME --family-size N`.

Runs judged one at a time against the same cached baseline answers are, to a reader of
their releases, a choice among candidates like a comparison's. A declared family fixes
its size before its first member is judged: every member, in whatever run, is judged at
confidence 1 - (1 - c) / N (recipe/family.py), and the family takes at most N distinct
members, so a wrong release anywhere in it stays at the recipe's alpha. A member is a
recipe's content (or an existing checkpoint folder judged by a recipe): running it again
is the same member, an edited recipe is a new one.

The registry is `<cache>/families/<name>/`: `family.json` (its size, written once) and one
file a member, so concurrent runs never rewrite each other's.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from quantlab.core.digest import json_sha256
from quantlab.core.errors import RecipeError
from quantlab.core.fsutil import write_text_atomic
from quantlab.core.layout import cache_dir
from quantlab.recipe.family import Family

FAMILIES_DIR = "families"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def join_family(name: str, size: int, members: dict[str, dict]) -> Family:
    """Register `members` (candidate name -> what identifies it) in the family `name` of
    `size`, creating it on first use; refused (exit 2) when the name is not a plain name,
    when the size differs from the family's, or when the family would hold more than its size."""
    if not NAME.match(name):
        raise RecipeError(f"--family {name!r}: expected a plain name (letters, digits, '.', '_', '-')",
                          field="--family")
    if size < 1:
        raise RecipeError(f"--family-size {size}: a family holds at least one candidate", field="--family-size")
    folder = cache_dir() / FAMILIES_DIR / name
    folder.mkdir(parents=True, exist_ok=True)
    declared = _declare(folder, size)
    if declared != size:
        raise RecipeError(f"family '{name}' was declared with --family-size {declared}, not {size}: its size is "
                          "fixed before its first member is judged (give the same size, or a new family name)",
                          field="--family-size")
    ids = {cand: json_sha256(what)[:32] for cand, what in members.items()}
    present = {p.stem for p in (folder / "members").glob("*.json")}
    new = sorted(set(ids.values()) - present)
    if len(present) + len(new) > size:
        raise RecipeError(f"family '{name}' holds {len(present)} of its {size} candidates: {len(new)} more would "
                          f"make it {len(present) + len(new)}, past the size its alpha was split over (a new "
                          "family name starts a new family; its manifests say so)", field="--family-size")
    for cand, key in ids.items():
        mine = folder / "members" / f"{key}.json"
        if not mine.is_file():
            write_text_atomic(mine, json.dumps({"candidate": cand, **members[cand]}, sort_keys=True, default=str))
    count = sum(1 for _ in (folder / "members").glob("*.json"))
    return Family(size=size, members=tuple(sorted(members)), kind="declared", id=name,
                  joined=count)


def _declare(folder: Path, size: int) -> int:
    """The family's size: written by its first run (O_EXCL: one writer wins), read by the rest."""
    path = folder / "family.json"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return int(json.loads(path.read_text())["size"])
    with os.fdopen(fd, "w") as f:
        json.dump({"size": size}, f)
    return size
