"""Results cached across runs by everything that can change them: the baseline's
quality and stability results (validating a second candidate against the same baseline
reuses them, and when no enabled check needs the baseline server any more it is not
started) and quantized checkpoints. One folder per kind and key: `<cache>/<kind>/<key>/`.

Each stage's key holds everything that can change the baseline's results there. Quality:
its weights (or, for an external endpoint, its URL and served name), the suite files,
the tasks and their sample limit, the engine version and arguments, lm-eval's version,
the seed and the request concurrency (batching can change greedy outputs), the KL
settings, and the hardware (a cache shared by `--ray` nodes spans CPU and GPU kinds).
Stability: the weights, the probe settings (not the gates), the prompts, the
served max_model_len, the engine version and arguments, and the hardware. Checkpoints:
the quantize stage's inputs (model files, quantization and calibration sections,
calibration data), quantlab's code (a hash of its sources) and the quantization
libraries' versions.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quantlab.core.digest import json_sha256
from quantlab.core.errors import RecipeError
from quantlab.core.fsutil import write_text_atomic
from quantlab.core.layout import cache_dir

QUALITY = "quality-baselines"
STABILITY = "stability-baselines"
CHECKPOINTS = "checkpoints"

COMPLETE = "complete.json"
JUDGED = ".judged"  # <key>.judged/<candidate>.json: the candidates judged against an entry's answers


def cache_key(parts: dict[str, Any]) -> str:
    return json_sha256(parts)


# `--ray`: the checkpoints and the baseline's results in the storage folder every node sees
# (<folder>/<kind>/); the probe cache and the signing key stay each machine's own
SHARED_CACHE_ENV = "QUANTLAB_SHARED_CACHE"
SHARED_KINDS = (CHECKPOINTS, QUALITY, STABILITY)


def cache_root(kind: str) -> Path:
    import os

    if kind in SHARED_KINDS and os.environ.get(SHARED_CACHE_ENV):
        return Path(os.environ[SHARED_CACHE_ENV]) / kind
    return cache_dir() / kind


def lookup_parts(kind: str, parts: Callable[[], dict[str, Any]]) -> Path | None:
    """`lookup` by the key of what `parts()` returns; None also when the parts cannot be
    computed yet (a file a part hashes is missing, a recipe field is unusable)."""
    try:
        return lookup(kind, cache_key(parts()))
    except (RecipeError, OSError):
        return None


def lookup(kind: str, key: str) -> Path | None:
    """The cached folder for a key, or for a key stored as an alias of another (see store)."""
    folder = cache_root(kind) / key
    if (folder / COMPLETE).is_file():
        return folder
    alias = cache_root(kind) / f"{key}.alias"
    if alias.is_file():
        target = alias.read_text().strip()
        if target != key and (cache_root(kind) / target / COMPLETE).is_file():
            return cache_root(kind) / target
    return None


def lookup_covering(kind: str, parts: dict[str, Any], field: str) -> tuple[Path, str, list[Any]] | None:
    """An entry whose parts equal these in everything but `field`, a list holding every item
    of this one's and maybe more: (its folder, its key, its items), or None. The entry with the fewest
    items wins (then the key's order), so the answer does not depend on the listing's order.
    For the baseline's quality results: a run that asks for some of the tasks an earlier run
    evaluated, under the same suites, limit, seed, engine and KL settings, reuses their answers."""
    want = parts.get(field)
    if not isinstance(want, list):
        return None
    # compared as stored: complete.json went through json with default=str
    rest = json.loads(json.dumps({k: v for k, v in parts.items() if k != field}, sort_keys=True, default=str))
    found: list[tuple[int, str, Path, list[Any]]] = []
    root = cache_root(kind)
    for complete in root.glob(f"*/{COMPLETE}"):
        if complete.parent.name.startswith("."):  # a writer's folder before its rename (see store)
            continue
        try:
            stored = json.loads(complete.read_text())
        except (OSError, ValueError):
            continue
        have = stored.pop(field, None) if isinstance(stored, dict) else None
        if isinstance(have, list) and set(want) <= set(have) and stored == rest:
            found.append((len(have), complete.parent.name, complete.parent, have))
    if not found:
        return None
    _, key, folder, have = min(found, key=lambda f: f[:2])
    return folder, key, have


def store(kind: str, key: str, source: Path, parts: dict[str, Any], *, aliases: tuple[str, ...] = ()) -> Path:
    """Copy a finished result folder into the cache atomically (a reader never sees a
    half-copied entry). Two writers of one key (two nodes computing the same baseline at
    once): the first rename wins and the second's copy is dropped, never the entry a
    reader may be using.

    `aliases`: keys computed before the servers ran, from what the recipe says (e.g. no
    max_model_len, so no task skipped yet), that lead to this entry: the early question
    "will the baseline server be needed?" then gets the answer the run itself found."""
    root = cache_root(kind)
    root.mkdir(parents=True, exist_ok=True)
    final = root / key
    if not lookup(kind, key):
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=root))
        try:
            shutil.copytree(source, tmp, dirs_exist_ok=True)
            (tmp / COMPLETE).write_text(json.dumps(parts, indent=2, sort_keys=True, default=str))
            if final.exists() and not (final / COMPLETE).is_file():
                shutil.rmtree(final, ignore_errors=True)  # a left-over without its completion mark
            tmp.rename(final)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not _finished_by_another(final):  # not another writer's finished entry: a real failure
                raise
        except BaseException:  # Ctrl-C, a cancelled Ray task: no half-copied folder stays in the cache
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    for alias in aliases:
        if alias != key:
            write_text_atomic(root / f"{alias}.alias", key)
    return final


def mark_judged(kind: str, key: str, candidate: str, info: dict[str, Any]) -> int:
    """Record that `candidate` (a digest of its weights) was judged against the entry's
    answers; returns how many distinct candidates have been (this one included). Beside
    the entry, not in it: a run's copy of the entry stays what was compared. One file a
    candidate, so writers on several nodes never rewrite each other's."""
    folder = cache_root(kind) / f"{key}{JUDGED}"
    folder.mkdir(parents=True, exist_ok=True)
    mine = folder / f"{candidate}.json"
    if not mine.is_file():
        write_text_atomic(mine, json.dumps(info, sort_keys=True, default=str))
    return sum(1 for p in folder.glob("*.json"))


def _finished_by_another(final: Path, tries: int = 5) -> bool:
    """Whether a concurrent writer's entry is there, complete. Listed afresh a few times: on
    NFS a just-renamed folder can be missing from a cached lookup for a moment."""
    import os
    import time

    for _ in range(tries):
        try:
            if COMPLETE in os.listdir(final):
                return True
        except OSError:
            pass
        time.sleep(0.2)
    return False
