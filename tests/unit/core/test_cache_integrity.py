"""Cached entries are trusted only through an index authenticated under the user's cache
secret: a planted or edited entry (or alias) is a miss with a warning, a reused entry's
files are hashed against the index as they are copied or read, and the secret's file is
this user's alone."""

from __future__ import annotations

import json
import os
import stat

import pytest

from quantlab.core import cache_secret, result_cache
from quantlab.core.errors import IntegrityError, RecipeError


pytestmark = pytest.mark.usefixtures("own_cache")  # tests/conftest.py: a cache and secret of its own


def answers(folder, text="baseline answers"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ql_lastword.jsonl").write_text(text + "\n")
    (folder / "sub").mkdir(exist_ok=True)
    (folder / "sub" / "kl-topk.json").write_text("{}")
    return folder


PARTS = {"limit": 40, "tasks": ["ql_lastword"]}


def stored(tmp_path, kind=result_cache.QUALITY, parts=PARTS):
    key = result_cache.cache_key(parts)
    return key, result_cache.store(kind, key, answers(tmp_path / "src"), parts)


def test_the_secret_is_created_once_for_this_user_alone(tmp_path):
    secret = cache_secret.current()
    path = tmp_path / "config" / "quantlab" / cache_secret.SECRET_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert len(secret) == 64 and cache_secret.current() == secret
    assert not list(path.parent.glob(".*"))  # no temp file left


def test_a_secret_others_can_read_or_a_link_is_refused(tmp_path):
    cache_secret.current()
    path = cache_secret.secret_path()
    os.chmod(path, 0o640)
    with pytest.raises(RecipeError, match="mode 0640: group or others may access it"):
        cache_secret.current()
    os.chmod(path, 0o600)
    target = path.with_name("elsewhere")
    path.rename(target)
    path.symlink_to(target)
    with pytest.raises(RecipeError, match="not a plain file"):
        cache_secret.current()


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="giving a file to another user needs root")
def test_a_secret_another_user_owns_is_refused(tmp_path):
    path = cache_secret.secret_path()
    path.parent.mkdir(parents=True)
    path.write_text("0" * 64)
    os.chmod(path, 0o600)
    os.chown(path, 4321, 4321)
    with pytest.raises(RecipeError, match="owned by user id 4321"):
        cache_secret.current()


def test_a_stored_entry_is_found_and_its_index_lists_its_files(tmp_path):
    key, folder = stored(tmp_path)
    assert result_cache.lookup(result_cache.QUALITY, key) == folder
    index = json.loads((folder / result_cache.INDEX).read_text())
    assert sorted(index["files"]) == ["ql_lastword.jsonl", "sub/kl-topk.json"] and len(index["hmac"]) == 64


def test_an_entry_planted_without_the_secret_is_a_miss_with_a_warning(tmp_path):
    key = result_cache.cache_key(PARTS)
    planted = answers(tmp_path / "cache" / result_cache.QUALITY / key, "planted answers")
    (planted / result_cache.COMPLETE).write_text(json.dumps(PARTS))
    with pytest.warns(result_cache.CacheEntryWarning, match="no authenticated index"):
        assert result_cache.lookup(result_cache.QUALITY, key) is None
    # an index computed as quantlab does, under another secret, does not help
    cache_secret.use(b"f" * 64)
    result_cache.store(result_cache.QUALITY, key, planted, PARTS)
    cache_secret.use(None)
    with pytest.warns(result_cache.CacheEntryWarning, match="not authenticated by this user's cache secret"):
        assert result_cache.lookup(result_cache.QUALITY, key) is None
        assert result_cache.lookup_covering(result_cache.QUALITY, {"limit": 40, "tasks": []}, "tasks") is None
    # the next store of that key replaces it with this user's own
    entry = result_cache.store(result_cache.QUALITY, key, answers(tmp_path / "mine", "my answers"), PARTS)
    assert result_cache.lookup(result_cache.QUALITY, key) == entry
    assert (entry / "ql_lastword.jsonl").read_text() == "my answers\n"


@pytest.mark.parametrize("edit", ["changed", "added", "removed", "parts"])
def test_an_edited_entry_is_a_miss_with_a_warning(tmp_path, edit):
    key, folder = stored(tmp_path)
    if edit == "changed":
        (folder / "ql_lastword.jsonl").write_text("baseline answerZ\n")  # same size, other bytes
    elif edit == "added":
        (folder / "sub" / "extra.jsonl").write_text("")
    elif edit == "removed":
        (folder / "sub" / "kl-topk.json").unlink()
    else:  # complete.json edited so that another request's parts would match it
        (folder / result_cache.COMPLETE).write_text(json.dumps({**PARTS, "limit": 20}))
    with pytest.warns(result_cache.CacheEntryWarning, match="cached entry .* is not reused"):
        assert result_cache.lookup(result_cache.QUALITY, key) is None


def test_an_alias_planted_without_the_secret_leads_nowhere(tmp_path):
    key, folder = stored(tmp_path)
    other = result_cache.cache_key({"limit": 40, "tasks": ["ql_lastword"], "engine_args": {"seed": 1}})
    (folder.parent / f"{other}.alias").write_text(key)  # as an older quantlab wrote them: plain text
    with pytest.warns(result_cache.CacheEntryWarning, match="alias is not authenticated"):
        assert result_cache.lookup(result_cache.QUALITY, other) is None
    result_cache.store(result_cache.QUALITY, key, folder, PARTS, aliases=(other,))
    assert result_cache.lookup(result_cache.QUALITY, other) == folder


def test_a_checkpoint_entry_changed_after_lookup_is_refused_as_it_is_copied(tmp_path):
    """A checkpoint is too big to hash at every lookup (sizes only there): the copy hashes each
    file and compares it with the authenticated index."""
    key, folder = stored(tmp_path, result_cache.CHECKPOINTS)
    (folder / "ql_lastword.jsonl").write_text("baseline answerZ\n")  # same size: lookup cannot tell
    assert result_cache.lookup(result_cache.CHECKPOINTS, key) == folder
    with pytest.raises(IntegrityError, match=r"ql_lastword\.jsonl is not the file its authenticated index lists"):
        result_cache.copy_entry(result_cache.CHECKPOINTS, folder, tmp_path / "copy")


def test_copy_and_read_check_every_byte_and_copy_only_listed_files(tmp_path):
    key, folder = stored(tmp_path, result_cache.STABILITY)
    copied = result_cache.copy_entry(result_cache.STABILITY, folder, tmp_path / "copy", skip=("ql_*",))
    assert sorted(copied) == ["sub/kl-topk.json"] and not (tmp_path / "copy" / result_cache.INDEX).exists()
    assert result_cache.read_entry_file(result_cache.STABILITY, folder, "sub/kl-topk.json") == b"{}"
    (folder / "sub" / "kl-topk.json").write_text("[]")  # edited while the run uses the entry
    with pytest.raises(IntegrityError, match="kl-topk.json is not the file its authenticated index lists"):
        result_cache.read_entry_file(result_cache.STABILITY, folder, "sub/kl-topk.json")


def test_a_ray_node_given_the_drivers_secret_reads_the_drivers_entries(tmp_path):
    key, folder = stored(tmp_path)
    driver = cache_secret.current()
    cache_secret.use(b"0" * 64)  # a node with a secret of its own
    with pytest.warns(result_cache.CacheEntryWarning):
        assert result_cache.lookup(result_cache.QUALITY, key) is None
    cache_secret.use(driver)  # what the task receives as its argument
    assert result_cache.lookup(result_cache.QUALITY, key) == folder
