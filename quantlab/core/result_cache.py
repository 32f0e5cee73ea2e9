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

Integrity: a reader never trusts an entry because of a record inside it. Each entry holds an
index of its files' sizes and sha256 (`index.json`), with an HMAC under this user's cache
secret (core/cache_secret) over the index, the entry's kind and key, and its complete.json.
An entry whose index is missing, not authenticated, or does not match its files on disk
(one added, missing or changed) is a miss with a warning (CacheEntryWarning), never reused;
a reused entry's files are hashed again as they are copied or read (copy_entry,
read_entry_file) and any difference stops the stage (IntegrityError, exit 3). An entry
made under another secret (another user's, an older quantlab's) is replaced by the next
store of its key.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quantlab.core import cache_secret, folder_record
from quantlab.core.digest import json_sha256
from quantlab.core.errors import IntegrityError, RecipeError
from quantlab.core.fsutil import remove_tree, write_text_atomic
from quantlab.core.layout import cache_dir

QUALITY = "quality-baselines"
STABILITY = "stability-baselines"
CHECKPOINTS = "checkpoints"

COMPLETE = "complete.json"
INDEX = "index.json"  # the entry's files' digests and their HMAC under the cache secret
INDEX_FORMAT = 1
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


class CacheEntryWarning(UserWarning):
    """A cached entry (or alias) that does not authenticate: it is not reused."""


def _not_listed(rel: str) -> bool:
    return rel in (COMPLETE, INDEX)


def _warn(what: Path, problem: str) -> None:
    warnings.warn(f"cached entry {what} is not reused: {problem}. It is evaluated again (and the entry replaced "
                  "when it is stored)", CacheEntryWarning, stacklevel=3)


def _index_body(kind: str, key: str, complete: bytes, files: dict[str, Any]) -> dict[str, Any]:
    return {"format": INDEX_FORMAT, "kind": kind, "key": key,
            "complete_sha256": hashlib.sha256(complete).hexdigest(), "files": files}


def _entry_problem(kind: str, folder: Path, *, deep: bool) -> tuple[str | None, dict[str, Any]]:
    """(what is wrong with an entry, or None; its authenticated files). `deep`: every file
    hashed (the small kinds); else sizes only (a checkpoint is hashed as it is copied)."""
    try:
        index = json.loads((folder / INDEX).read_bytes())
        complete = (folder / COMPLETE).read_bytes()
    except FileNotFoundError:
        return "it has no authenticated index (made by an older quantlab, or not by quantlab)", {}
    except (OSError, ValueError) as err:
        return f"its index cannot be read ({err})", {}
    if not isinstance(index, dict):
        return "its index is not a JSON object", {}
    files = index.get("files")
    if not isinstance(files, dict):
        return "its index lists no files", {}
    if not cache_secret.holds(_index_body(kind, folder.name, complete, files), index.get("hmac")):
        return ("its index is not authenticated by this user's cache secret (written by someone without it, or "
                "edited since)"), {}
    if deep:
        problems, _ = folder_record.differences(folder, files, skip=_not_listed)
    else:
        on_disk, others = folder_record.walk(folder)
        listed = [rel for rel in on_disk if not _not_listed(rel)]
        problems = [f"not a plain file: {rel}" for rel in others]
        problems += [f"added file: {rel}" for rel in listed if rel not in files]
        problems += [f"missing file: {rel}" for rel in files if rel not in listed]
        problems += [f"changed file: {rel} (its size)" for rel in listed
                     if rel in files and os.lstat(folder / rel).st_size != files[rel].get("size")]
    if problems:
        return "its files differ from its authenticated index: " + "; ".join(problems[:5]), {}
    return None, files


def entry_files(kind: str, folder: Path, *, warn: bool = True, deep: bool | None = None) -> dict[str, Any] | None:
    """An entry's files ({path: {size, sha256}}) as its authenticated index lists them, or None
    (with a CacheEntryWarning) when it does not authenticate or its files differ."""
    problem, files = _entry_problem(kind, Path(folder), deep=kind != CHECKPOINTS if deep is None else deep)
    if problem is not None:
        if warn:
            _warn(folder, problem)
        return None
    return files


def lookup(kind: str, key: str, *, warn: bool = True) -> Path | None:
    """The cached folder for a key, or for a key stored as an alias of another (see store);
    only an entry that authenticates (entry_files)."""
    folder = cache_root(kind) / key
    if (folder / COMPLETE).is_file():
        return folder if entry_files(kind, folder, warn=warn) is not None else None
    alias = cache_root(kind) / f"{key}.alias"
    if alias.is_file():
        target = _alias_target(kind, key, alias, warn=warn)
        if target is not None and target != key and (cache_root(kind) / target / COMPLETE).is_file():
            found = cache_root(kind) / target
            return found if entry_files(kind, found, warn=warn) is not None else None
    return None


def _alias_body(kind: str, alias: str, key: str) -> dict[str, Any]:
    return {"format": INDEX_FORMAT, "kind": kind, "alias": alias, "key": key}


def _alias_target(kind: str, alias: str, path: Path, *, warn: bool) -> str | None:
    """The key an alias file leads to, if its HMAC holds (an alias planted by someone without
    the secret could otherwise lead a lookup to another key's answers)."""
    try:
        doc = json.loads(path.read_text())
        key = doc["key"]
        ok = isinstance(key, str) and cache_secret.holds(_alias_body(kind, alias, key), doc.get("hmac"))
    except (OSError, ValueError, TypeError, KeyError):
        ok, key = False, None
    if not ok:
        if warn:
            _warn(path, "the alias is not authenticated by this user's cache secret")
        return None
    return key


def lookup_covering(kind: str, parts: dict[str, Any], field: str, *,
                    unset_matches_any: tuple[str, ...] = ()) -> tuple[Path, str, list[Any]] | None:
    """An entry whose parts equal these in everything but `field`, a list holding every item
    of this one's and maybe more: (its folder, its key, its items), or None. A part named in
    `unset_matches_any` that is None here matches whatever the entry has (a setting that
    touched only items this lookup does not ask for). The entry with the fewest
    items wins (then the key's order), so the answer does not depend on the listing's order.
    For the baseline's quality results: a run that asks for some of the tasks an earlier run
    evaluated, under the same suites, limit, seed, engine and KL settings, reuses their answers."""
    want = parts.get(field)
    if not isinstance(want, list):
        return None
    # compared as stored: complete.json went through json with default=str
    free = {k for k in unset_matches_any if parts.get(k) is None}
    rest = json.loads(json.dumps({k: v for k, v in parts.items() if k != field and k not in free},
                                 sort_keys=True, default=str))
    found: list[tuple[int, str, Path, list[Any]]] = []
    root = cache_root(kind)
    for complete in root.glob(f"*/{COMPLETE}"):
        if complete.parent.name.startswith("."):  # a writer's folder before its rename (see store)
            continue
        try:
            stored = json.loads(complete.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(stored, dict):  # not an entry quantlab wrote
            continue
        have = stored.pop(field, None)
        for k in free:
            stored.pop(k, None)
        if isinstance(have, list) and set(want) <= set(have) and stored == rest \
                and entry_files(kind, complete.parent) is not None:  # authenticated: complete.json is in its HMAC
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
    if not lookup(kind, key, warn=False):
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=root))
        try:
            # the index lists the bytes the copy holds, hashed as they are written
            files = folder_record.copy_files(source, tmp, folder_record.walk(source)[0])
            complete = json.dumps(parts, indent=2, sort_keys=True, default=str).encode()
            (tmp / COMPLETE).write_bytes(complete)
            body = _index_body(kind, key, complete, files)
            (tmp / INDEX).write_text(json.dumps({**body, "hmac": cache_secret.sign(body)}, indent=1, sort_keys=True))
            if final.exists() and entry_files(kind, final, warn=False, deep=False) is None:
                _set_aside(final)  # a left-over without its completion mark, or made under another secret
            tmp.rename(final)
        except OSError:
            remove_tree(tmp)
            if not _finished_by_another(final):  # not another writer's finished entry: a real failure
                raise
        except BaseException:  # Ctrl-C, a cancelled Ray task: no half-copied folder stays in the cache
            remove_tree(tmp)
            raise
    for alias in aliases:
        if alias != key:
            body = _alias_body(kind, alias, key)
            write_text_atomic(root / f"{alias}.alias", json.dumps({**body, "hmac": cache_secret.sign(body)}))
    return final


def _set_aside(final: Path) -> None:
    """Move an entry that does not authenticate out of its key's place, then remove it (a
    reader mid-copy of it fails its own check; another writer racing here loses the rename)."""
    aside = final.with_name(f".{final.name[:12]}-stale-{os.getpid()}-{os.urandom(4).hex()}")
    try:
        os.rename(final, aside)
    except OSError:
        return
    remove_tree(aside)


def copy_entry(kind: str, folder: Path, dest: Path, *, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """An entry's files into `dest` (each file replaced there), hashed as they are written and
    compared with the entry's authenticated index: only listed files are copied, never through
    a link. `skip`: glob patterns; a file is skipped when any part of its path matches one.
    Returns {path: {size, sha256}} of what was copied; a difference raises IntegrityError."""
    files = entry_files(kind, folder, warn=False, deep=False)
    if files is None:
        raise IntegrityError(f"the cached entry {folder} no longer matches its authenticated index (changed while "
                             "this run used it); remove it and run again")
    wanted = [rel for rel in files if not any(fnmatch.fnmatch(part, pat) for part in rel.split("/") for pat in skip)]
    copied = {}
    for rel in wanted:
        (Path(dest) / rel).unlink(missing_ok=True)
        try:
            copied[rel] = folder_record.copy_hashed(Path(folder) / rel, Path(dest) / rel)
        except OSError as err:
            raise IntegrityError(f"the cached entry {folder}: {rel} cannot be copied ({err})") from None
        if copied[rel] != {"size": files[rel]["size"], "sha256": files[rel]["sha256"]}:
            raise IntegrityError(f"the cached entry {folder}: {rel} is not the file its authenticated index lists "
                                 f"(sha256 {copied[rel]['sha256'][:12]}... copied, {files[rel]['sha256'][:12]}... "
                                 "listed); it was changed after it was stored: remove the entry and run again")
    return copied


def read_entry_file(kind: str, folder: Path, rel: str) -> bytes:
    """One file of an entry, checked against its authenticated index (IntegrityError if not)."""
    files = entry_files(kind, folder, warn=False, deep=False)
    if files is None or rel not in files:
        raise IntegrityError(f"the cached entry {folder}: {rel} is not in its authenticated index (the entry "
                             "changed while this run used it); remove it and run again")
    fd = os.open(Path(folder) / rel, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as f:
        data = f.read()
    if hashlib.sha256(data).hexdigest() != files[rel]["sha256"]:
        raise IntegrityError(f"the cached entry {folder}: {rel} is not the file its authenticated index lists; it "
                             "was changed after it was stored: remove the entry and run again")
    return data


def discard(folder: Path) -> None:
    """Remove a cached entry found broken (its files not those its index lists)."""
    _set_aside(Path(folder))


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
