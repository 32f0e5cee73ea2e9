"""Write-once cache entries authenticated under this user's cache secret (core/cache_secret):
one JSON file per contribution under `<cache>/<kind>/<key>/<name>`, never rewritten, with an
HMAC over the store's kind, the key, the file's name and its body. What the host's
performance noise (performance/noise_store) and the batch noise floor (quality/batch_floor)
keep: an entry written or edited by someone without the secret is skipped with a
CacheEntryWarning, never pooled."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

from quantlab.core import cache_secret, result_cache
from quantlab.core.fsutil import write_text_atomic


def safe_name(text: str) -> str:
    """`text` as a file-name part: as it is when plain, else a digest of it."""
    return text if re.fullmatch(r"[A-Za-z0-9._-]{1,80}", text) else result_cache.cache_key({"id": text})[:32]


def _signed(kind: str, key: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"store": kind, "key": key, "file": name, "body": body}


def write_once(kind: str, key: str, name: str, body: dict[str, Any]) -> Path | None:
    """Store `body` as entry `name` under `key`; None when that entry exists (never rewritten)."""
    path = result_cache.cache_root(kind) / key / name
    if path.exists():
        return None
    write_text_atomic(path, json.dumps({"body": body, "hmac": cache_secret.sign(_signed(kind, key, name, body))},
                                       sort_keys=True))
    return path


def read_all(kind: str, key: str, *, what: str, remedy: str) -> list[dict[str, Any]]:
    """Every authenticated entry's body under `key`, in file-name order; one that does not
    authenticate is skipped with a warning naming `what` it is and the `remedy`."""
    folder = result_cache.cache_root(kind) / key
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            doc = json.loads(path.read_text())
            body = doc["body"]
            ok = isinstance(body, dict) and cache_secret.holds(_signed(kind, key, path.name, body), doc.get("hmac"))
        except (OSError, ValueError, TypeError, KeyError):
            ok, body = False, None
        if not ok:
            warnings.warn(f"{what} entry {path} is not used: it is not authenticated by this user's cache secret "
                          f"(written by someone without it, or edited since). Remove it; {remedy}",
                          result_cache.CacheEntryWarning, stacklevel=3)
            continue
        out.append(body)
    return out
