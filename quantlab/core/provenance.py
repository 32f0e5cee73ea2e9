"""Which quantlab made a result: its version, its commit, and a hash of its own code."""

from __future__ import annotations

import functools
import hashlib
import subprocess
from pathlib import Path
from typing import Any

from quantlab.core.version import __version__


@functools.lru_cache(maxsize=1)
def quantlab_code_sha256() -> str:
    """sha256 over quantlab's own Python sources (path and content of each): what a
    cached product of quantlab's code must match. Unlike the commit, it ignores changes to
    docs, tests and recipes, and it sees uncommitted edits."""
    package = Path(__file__).resolve().parents[1]  # the quantlab package, every subpackage
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def git_commit() -> str | None:
    """The commit of quantlab's own checkout, if it runs from one (not of a repository
    that merely contains the environment it is installed in)."""
    here = Path(__file__).resolve().parents[1]
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, timeout=10,
                             cwd=here)
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() / "quantlab" != here:
            return None
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, cwd=here)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10, cwd=here)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "") if head.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def quantlab_identity() -> dict[str, Any]:
    """version, commit (None outside a checkout) and the sha256 of the installed package's sources."""
    return {"version": __version__, "git_commit": git_commit(), "code_sha256": quantlab_code_sha256()}
