"""Atomic file and directory output: nothing is ever half-written."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
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
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
