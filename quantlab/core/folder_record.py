"""A folder's files as recorded: each plain file's size and sha256, found without following
links; a folder on disk compared with such a record, file by file; copies hashed as they
are written; and the modes a checkpoint holds while it is checked (read-only) and once
released (0644 files, 0755 folders)."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

Digest = dict[str, Any]  # {"size": bytes, "sha256": hex}: core.results.FileFact as a dict

READ_ONLY = (0o444, 0o555)  # (files, folders) while the checks run: no check can write into it
RELEASED = (0o644, 0o755)  # a deploy step running as another user can read what was released
_CHUNK = 1 << 20


def walk(folder: Path) -> tuple[list[str], dict[str, str]]:
    """(plain files, everything else) below `folder` as relative POSIX paths, sorted; links are
    never followed (a link to a folder is not entered) and are named with their target."""
    files: list[str] = []
    others: dict[str, str] = {}
    root = Path(folder)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        for name in [*dirnames, *filenames]:
            p = here / name
            rel = p.relative_to(root).as_posix()
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                others[rel] = f"a link to {os.readlink(p)}"
            elif stat.S_ISREG(st.st_mode):
                files.append(rel)
            elif not stat.S_ISDIR(st.st_mode):
                others[rel] = "not a plain file"
    return sorted(files, key=_order), dict(sorted(others.items(), key=lambda kv: _order(kv[0])))


def _order(rel: str) -> tuple[str, ...]:
    return tuple(rel.split("/"))  # as sorted Path objects order them (folder_files' order)


def file_digest(path: Path) -> Digest:
    """Size and sha256 of one plain file, read through a descriptor that refuses a link."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(f"{path} is not a plain file")
        h, size = hashlib.sha256(), 0
        while block := f.read(_CHUNK):
            h.update(block)
            size += len(block)
    return {"size": size, "sha256": h.hexdigest()}


def digests(folder: Path, *, skip: Callable[[str], bool] = lambda rel: False) -> dict[str, Digest]:
    """Every plain file below `folder` but those `skip` names, hashed (links are not files)."""
    return {rel: file_digest(Path(folder) / rel) for rel in walk(folder)[0] if not skip(rel)}


def differences(folder: Path, recorded: dict[str, Digest], *,
                skip: Callable[[str], bool] = lambda rel: False) -> tuple[list[str], dict[str, Digest]]:
    """The folder on disk against its record: (each file that is added, missing, changed or not a
    plain file, in words; the digests of the files found as recorded). Every file is hashed in
    full: a record is never trusted over the disk. `skip`: paths neither side counts."""
    files, others = walk(folder)
    problems = [f"not a plain file: {rel} ({what})" for rel, what in others.items() if not skip(rel)]
    want = {rel: d for rel, d in recorded.items() if not skip(rel)}
    found: dict[str, Digest] = {}
    for rel in files:
        if skip(rel):
            continue
        if rel not in want:
            problems.append(f"added file: {rel} (not in the record)")
            continue
        on_disk = file_digest(Path(folder) / rel)
        if on_disk["size"] != want[rel]["size"]:
            problems.append(f"changed file: {rel} ({on_disk['size']} bytes on disk, the record says "
                            f"{want[rel]['size']})")
        elif on_disk["sha256"] != want[rel]["sha256"]:
            problems.append(f"changed file: {rel} (sha256 {on_disk['sha256'][:12]}... on disk, the record says "
                            f"{want[rel]['sha256'][:12]}...)")
        else:
            found[rel] = on_disk
    problems += [f"missing file: {rel} (in the record)" for rel in want if rel not in files and rel not in others]
    return problems, found


def copy_hashed(src: Path, dst: Path) -> Digest:
    """Copy one plain file (never through a link), hashing the bytes as they are written: the
    digest is of what the copy holds. `dst` must not exist."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(src, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as f, open(dst, "xb") as out:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(f"{src} is not a plain file")
        h, size = hashlib.sha256(), 0
        while block := f.read(_CHUNK):
            out.write(block)
            h.update(block)
            size += len(block)
    return {"size": size, "sha256": h.hexdigest()}


def copy_files(src: Path, dst: Path, names: Iterable[str]) -> dict[str, Digest]:
    """Each named file of `src` copied to the same place below `dst`, hashed as written."""
    return {rel: copy_hashed(Path(src) / rel, Path(dst) / rel) for rel in names}


def set_modes(folder: Path, modes: tuple[int, int]) -> None:
    """(file mode, folder mode) on everything below `folder` and on itself; links untouched."""
    file_mode, dir_mode = modes
    root = Path(folder)
    if not root.is_dir() or root.is_symlink():
        return
    os.chmod(root, dir_mode)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                os.chmod(p, dir_mode)
        for name in filenames:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                os.chmod(p, file_mode)


def lock(folder: Path) -> None:
    """Read-only (files 0444, folders 0555) while the checks run."""
    set_modes(folder, READ_ONLY)


def release_modes(folder: Path) -> None:
    """Ordinary modes (files 0644, folders 0755): released, or the run is over."""
    set_modes(folder, RELEASED)
