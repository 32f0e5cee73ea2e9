"""The cache's secret: the key that authenticates each cached entry's index of file digests
(core/result_cache), so that an entry planted or edited by someone without it is not
reused. One per user, in quantlab's config folder (never in the cache folder, which may be
shared): created 0600 on first use, refused when another user owns it or others can read it.

A `--ray` task on another node uses the driver's secret, handed to it as the task's argument
(`use`): it lives in that worker's memory only, never in an environment variable (which every
child process, an engine or a sandboxed completion, would inherit), a record or a log."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path
from typing import Any

from quantlab.core.digest import canonical_json
from quantlab.core.errors import RecipeError
from quantlab.core.fsutil import NotPrivate, check_private_file, create_private_file
from quantlab.core.layout import config_dir

SECRET_FILE = "cache-secret"  # in config_dir(): 64 hex digits
_given: bytes | None = None  # the driver's, on a Ray node (use)


def secret_path() -> Path:
    return config_dir() / SECRET_FILE


def use(secret: bytes | None) -> None:
    """This process authenticates with `secret` (a Ray task: its driver's); None: the user's file again."""
    global _given
    _given = secret


def current() -> bytes:
    """The secret this process uses: the one handed to it, else this user's file (created once)."""
    if _given is not None:
        return _given
    path = secret_path()
    if not (path.exists() or path.is_symlink()):
        create_private_file(path, secrets.token_hex(32).encode() + b"\n")  # a racing creator's file is kept
    try:
        check_private_file(path)
        text = path.read_text().strip()
    except NotPrivate as err:
        raise RecipeError(f"the cache's secret is refused: {err}. It authenticates cached results; anyone who "
                          f"can read or write it can forge them. Remove it ({path}): quantlab makes a new one, "
                          "readable by you alone (cached entries made under the old one are then evaluated "
                          "again)", file=str(path)) from None
    except OSError as err:
        raise RecipeError(f"the cache's secret cannot be read ({err}); remove it and quantlab makes a new one",
                          file=str(path)) from None
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        raise RecipeError("the cache's secret is not 64 hex digits as quantlab writes it; remove the file and "
                          "quantlab makes a new one", file=str(path))
    return text.encode()


def sign(body: Any) -> str:
    """HMAC-SHA256 of a JSON body's canonical form under the current secret."""
    return hmac.new(current(), canonical_json(body).encode(), hashlib.sha256).hexdigest()


def holds(body: Any, mac: Any) -> bool:
    """Whether `mac` is sign(body) (compared in constant time)."""
    return isinstance(mac, str) and hmac.compare_digest(sign(body), mac)
