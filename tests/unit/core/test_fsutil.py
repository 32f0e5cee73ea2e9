from __future__ import annotations

import pytest

from quantlab.core.fsutil import atomic_directory, write_text_atomic


def test_atomic_directory_appears_only_when_complete(tmp_path):
    final = tmp_path / "out"
    with atomic_directory(final) as tmp:
        (tmp / "a").write_text("1")
        assert not final.exists()
    assert (final / "a").read_text() == "1"
    assert list(tmp_path.iterdir()) == [final]


def test_atomic_directory_leaves_nothing_on_failure(tmp_path):
    final = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with atomic_directory(final) as tmp:
            (tmp / "half").write_text("x")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_atomic_directory_replace_keeps_old_until_new_is_done(tmp_path):
    final = tmp_path / "out"
    final.mkdir()
    (final / "old").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_directory(final, replace=True):
            raise RuntimeError("boom")
    assert (final / "old").is_file()
    with atomic_directory(final, replace=True) as tmp:
        (tmp / "new").write_text("new")
    assert sorted(p.name for p in final.iterdir()) == ["new"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_atomic_directory_refuses_existing_without_replace(tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(FileExistsError):
        with atomic_directory(tmp_path / "out"):
            pass


def test_write_text_atomic(tmp_path):
    p = tmp_path / "d" / "f.txt"
    write_text_atomic(p, "hi")
    write_text_atomic(p, "again")
    assert p.read_text() == "again" and [x.name for x in p.parent.iterdir()] == ["f.txt"]


def test_a_trusted_hash_is_computed_once_and_redone_when_the_file_changes(tmp_path, monkeypatch):
    import os

    from quantlab.core import fsutil

    f, index = tmp_path / "w.safetensors", tmp_path / "index.json"
    f.write_bytes(b"a" * 1000)
    calls = []
    real = fsutil.sha256_file
    monkeypatch.setattr(fsutil, "sha256_file", lambda p: calls.append(p) or real(p))
    first = fsutil.sha256_trusting_stat(f, index)
    assert first == real(f) and len(calls) == 1
    assert fsutil.sha256_trusting_stat(f, index) == first and len(calls) == 1  # trusted: same size, mtime, inode
    f.write_bytes(b"b" * 1000)  # same size, new content and mtime
    os.utime(f, ns=(1, 2))
    assert fsutil.sha256_trusting_stat(f, index) == real(f) != first and len(calls) == 2
    index.write_text("not json")  # a broken index is a miss, not an error
    assert fsutil.sha256_trusting_stat(f, index) == real(f) and len(calls) == 3
