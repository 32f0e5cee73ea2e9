"""A folder compared with its record file by file (added, missing, changed, not a plain
file), copies hashed as written, the modes of a checked and of a released checkpoint, and
removal of a read-only tree."""

from __future__ import annotations

import os
import stat

import pytest

from quantlab.core import folder_record
from quantlab.core.fsutil import atomic_directory, remove_tree


def tree(folder):
    (folder / "tok").mkdir(parents=True)
    (folder / "config.json").write_text('{"a": 1}')
    (folder / "model.safetensors").write_bytes(b"w" * 100)
    (folder / "tok" / "tokenizer.json").write_text("{}")
    return folder


def test_an_untouched_folder_matches_its_record(tmp_path):
    folder = tree(tmp_path / "ck")
    record = folder_record.digests(folder)
    assert list(record) == ["config.json", "model.safetensors", "tok/tokenizer.json"]
    assert folder_record.differences(folder, record) == ([], record)


def test_every_difference_is_named(tmp_path):
    folder = tree(tmp_path / "ck")
    record = folder_record.digests(folder)
    (folder / "config.json").write_text('{"a": 2}')  # same size, other bytes
    (folder / "model.safetensors").write_bytes(b"w" * 99)
    (folder / "tok" / "tokenizer.json").unlink()
    (folder / "tok" / "modeling_evil.py").write_text("")
    (folder / "tok" / "tokenizer.json").symlink_to(tmp_path)  # a link where a file was
    problems, found = folder_record.differences(folder, record)
    assert sorted(problems) == sorted([
        f"not a plain file: tok/tokenizer.json (a link to {tmp_path})",
        "added file: tok/modeling_evil.py (not in the record)",
        "changed file: model.safetensors (99 bytes on disk, the record says 100)",
        f"changed file: config.json (sha256 {folder_record.file_digest(folder / 'config.json')['sha256'][:12]}... on "
        f"disk, the record says {record['config.json']['sha256'][:12]}...)"])
    assert found == {}
    (folder / "tok" / "tokenizer.json").unlink()
    assert "missing file: tok/tokenizer.json (in the record)" in folder_record.differences(folder, record)[0]
    assert folder_record.differences(folder, record, skip=lambda rel: rel.startswith("tok/"))[0] == [
        p for p in folder_record.differences(folder, record)[0] if "tok/" not in p]


def test_a_copy_is_hashed_as_written_and_never_through_a_link(tmp_path):
    folder = tree(tmp_path / "ck")
    copied = folder_record.copy_files(folder, tmp_path / "copy", ["config.json", "tok/tokenizer.json"])
    assert copied == {k: v for k, v in folder_record.digests(folder).items() if k != "model.safetensors"}
    (folder / "link.json").symlink_to(folder / "config.json")
    with pytest.raises(OSError):
        folder_record.copy_hashed(folder / "link.json", tmp_path / "copy" / "link.json")


def test_locked_then_released_modes_and_a_read_only_tree_is_removed(tmp_path):
    folder = tree(tmp_path / "ck")
    folder_record.lock(folder)

    def modes():
        return {stat.S_IMODE(p.stat().st_mode) for p in [folder, *folder.rglob("*")] if p.is_dir()}, \
            {stat.S_IMODE(p.stat().st_mode) for p in folder.rglob("*") if p.is_file()}

    assert modes() == ({0o555}, {0o444})
    if os.getuid() != 0:  # root writes whatever the modes say; the release's hashing is the guard there
        with pytest.raises(PermissionError):
            (folder / "added.py").write_text("")
    folder_record.release_modes(folder)
    assert modes() == ({0o755}, {0o644})
    folder_record.lock(folder)
    with atomic_directory(folder, replace=True) as tmp:  # quantize again over a locked checkpoint
        (tmp / "new").write_text("")
    assert [p.name for p in tmp_path.iterdir()] == ["ck"] and [p.name for p in folder.iterdir()] == ["new"]
    folder_record.lock(folder)
    remove_tree(folder)
    assert not folder.exists()


def test_a_private_file_is_created_once_0600_and_checked(tmp_path):
    from quantlab.core.fsutil import NotPrivate, check_private_file, create_private_file

    path = tmp_path / "secrets" / "s"
    assert create_private_file(path, b"one") and not create_private_file(path, b"two")
    assert path.read_bytes() == b"one" and stat.S_IMODE(path.stat().st_mode) == 0o600
    check_private_file(path)
    os.chmod(path, 0o604)
    with pytest.raises(NotPrivate, match="0604"):
        check_private_file(path)
    path.unlink()
    path.symlink_to(tmp_path)
    assert not create_private_file(path, b"three")  # never written through a link
    with pytest.raises(NotPrivate, match="not a plain file"):
        check_private_file(path)
