"""The baseline's eval results, cached across runs: validating a second candidate
against the same baseline reuses them (and needs no baseline server for quality).

The key is everything that can change the baseline's answers: its weights (or, for an
external endpoint, its URL and served name), the suite files, the tasks run and their
sample limit, the engine version and engine arguments, lm-eval's version, the seed and
the request concurrency (batching can change greedy outputs), and the KL settings.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from quantlab.models import cache_dir

COMPLETE = "complete.json"


def cache_key(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def cache_root() -> Path:
    return cache_dir() / "quality-baselines"


def lookup(key: str) -> Path | None:
    folder = cache_root() / key
    return folder if (folder / COMPLETE).is_file() else None


def store(key: str, source: Path, parts: dict[str, Any]) -> Path:
    """Copy a finished baseline result folder into the cache atomically (a reader never
    sees a half-copied entry; a concurrent writer of the same key loses harmlessly)."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    final = root / key
    if lookup(key):
        return final
    tmp = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=root))
    try:
        shutil.copytree(source, tmp, dirs_exist_ok=True)
        (tmp / COMPLETE).write_text(json.dumps(parts, indent=2, sort_keys=True, default=str))
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final
