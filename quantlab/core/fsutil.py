"""Atomic file and directory output (nothing is ever half-written), hashing, and files
that must stay private to their owner."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_trusting_stat(path: Path, index: Path) -> str:
    """sha256 of a file, hashed once and then trusted while its size, mtime and inode are
    unchanged (the index is a JSON file of those). For cache checks and cache keys of
    large files that do not change (the default model, a baseline's weights); never for
    what a signature or manifest vouches for, which is always hashed in full."""
    path = Path(path).resolve()
    st = path.stat()
    stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
    try:
        known = json.loads(Path(index).read_text())
    except (OSError, ValueError):
        known = {}
    entry = known.get(str(path))
    if isinstance(entry, dict) and entry.get("stat") == stamp and isinstance(entry.get("sha256"), str):
        return entry["sha256"]
    digest = sha256_file(path)
    known[str(path)] = {"stat": stamp, "sha256": digest}
    try:
        write_json_atomic(Path(index), known)
    except OSError:
        pass  # an unwritable cache only costs the next caller a re-hash
    return digest


def safetensors_bytes(*folders: Path) -> int:
    """The size of the weights in these folders (their *.safetensors files)."""
    return sum(p.stat().st_size for d in folders for p in Path(d).glob("*.safetensors"))


def write_text_atomic(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json_atomic(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


@contextlib.contextmanager
def atomic_directory(final: Path, *, replace: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success rename it to `final`.

    On any exception the temporary directory is removed and `final` is untouched.
    With replace=True an existing `final` is swapped out only after the new one is
    complete."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists() and not replace:
        raise FileExistsError(final)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; the result is an ordinary folder
    try:
        yield tmp
        if final.exists():
            old = final.with_name(f".{final.name}.old-{os.getpid()}")
            os.replace(final, old)
            os.replace(tmp, final)
            remove_tree(old)  # a checkpoint is read-only while it is checked (folder_record.lock)
        else:
            os.replace(tmp, final)
    except BaseException:
        remove_tree(tmp)
        raise


def remove_tree(path: Path) -> None:
    """Remove a folder and everything in it, read-only ones included (a folder without write
    permission keeps its entries from rmtree); what cannot be removed is left, silently."""

    def writable_then_retry(func, failed, _exc) -> None:
        with contextlib.suppress(OSError):
            parent = os.path.dirname(failed)
            os.chmod(parent, stat.S_IMODE(os.lstat(parent).st_mode) | stat.S_IRWXU)
            if not os.path.islink(failed) and os.path.isdir(failed):
                os.chmod(failed, stat.S_IMODE(os.lstat(failed).st_mode) | stat.S_IRWXU)
            func(failed)

    if os.path.islink(path) or not os.path.isdir(path):
        with contextlib.suppress(OSError):
            os.unlink(path)
        return
    with contextlib.suppress(OSError):
        if sys.version_info >= (3, 12):
            shutil.rmtree(path, onexc=writable_then_retry)
        else:
            shutil.rmtree(path, onerror=writable_then_retry)


class NotPrivate(Exception):
    """A file that must be its owner's alone is not (another owner, group or world access, a link)."""


def private_flaw(st: os.stat_result) -> str | None:
    """Why a secret's file (a key, the cache's secret) is not its owner's alone: "link" or
    "special" (not a plain file), "owner" (another user's), "mode" (the group or others have a
    permission); None when it is. Anyone else who could write it could plant one, anyone else
    who could read it could forge what it authenticates."""
    if not stat.S_ISREG(st.st_mode):
        return "link" if stat.S_ISLNK(st.st_mode) else "special"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return "owner"
    if stat.S_IMODE(st.st_mode) & 0o077:
        return "mode"
    return None


def check_private_file(path: Path) -> None:
    """Raises NotPrivate saying why `path` (never followed if a link) is not this user's alone."""
    st = os.lstat(path)
    flaw = private_flaw(st)
    if flaw in ("link", "special"):
        raise NotPrivate(f"{path} is not a plain file (a link or a special file)")
    if flaw == "owner":
        raise NotPrivate(f"{path} is owned by user id {st.st_uid}, not by this user ({os.getuid()})")
    if flaw == "mode":
        raise NotPrivate(f"{path} has mode {stat.S_IMODE(st.st_mode):04o}: group or others may access it "
                         "(expected 0600)")


def create_private_file(path: Path, data: bytes) -> bool:
    """Create `path` holding `data`, mode 0600 from its first byte, atomically and never over
    an existing file or link (another process may create it at the same moment: its file is
    kept). The folder is created 0700 when missing. Returns whether this call created it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # fails if anything (a file, a link) is there: no clobbering, no following
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
