"""The cross-run result cache: atomic entries, misses on a different key, aliases."""

from __future__ import annotations

from quantlab.core import result_cache


def test_store_lookup_and_aliases(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTLAB_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "src"
    src.mkdir()
    (src / "baseline.json").write_text("{}")
    key = result_cache.cache_key({"max_model_len": 512})
    early = result_cache.cache_key({"max_model_len": None})
    assert result_cache.lookup(result_cache.STABILITY, key) is None
    folder = result_cache.store(result_cache.STABILITY, key, src, {"max_model_len": 512}, aliases=(early,))
    assert (folder / "baseline.json").is_file() and (folder / result_cache.COMPLETE).is_file()
    assert result_cache.lookup(result_cache.STABILITY, key) == folder
    assert result_cache.lookup(result_cache.STABILITY, early) == folder  # the early question finds it
    assert result_cache.lookup(result_cache.QUALITY, key) is None  # kinds do not mix
    assert result_cache.lookup(result_cache.STABILITY, result_cache.cache_key({"max_model_len": 2048})) is None
    assert not list((tmp_path / "cache" / result_cache.STABILITY).glob(".*"))  # no temp folder left


def test_a_writer_that_loses_the_race_for_a_key_keeps_the_winners_entry(tmp_path, monkeypatch):
    """Two nodes storing the same baseline at once (the shared cache of --ray): the second
    finds the first's finished entry when its rename fails, drops its own copy, and the
    entry a reader may be using is never removed."""
    monkeypatch.setenv("QUANTLAB_SHARED_CACHE", str(tmp_path / "shared"))
    key = result_cache.cache_key({"n": 1})
    first, second = tmp_path / "a", tmp_path / "b"
    for folder, text in ((first, "first"), (second, "second")):
        folder.mkdir()
        (folder / "baseline.json").write_text(text)
    entry = result_cache.store(result_cache.QUALITY, key, first, {"n": 1})
    assert entry.parent == tmp_path / "shared" / result_cache.QUALITY  # the shared kinds live there
    monkeypatch.setattr(result_cache, "lookup", lambda kind, k, **_: None)  # it looked before the first finished
    assert result_cache.store(result_cache.QUALITY, key, second, {"n": 1}) == entry
    assert (entry / "baseline.json").read_text() == "first"
    assert not list(entry.parent.glob(".*"))  # its own copy is gone


def test_an_interrupted_store_leaves_no_half_copied_folder(tmp_path, monkeypatch):
    import pytest

    from quantlab.core import folder_record

    monkeypatch.setenv("QUANTLAB_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "src"
    src.mkdir()
    (src / "x.json").write_text("{}")

    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(folder_record, "copy_files", interrupted)
    with pytest.raises(KeyboardInterrupt):
        result_cache.store(result_cache.STABILITY, "k", src, {})
    assert not list((tmp_path / "cache" / result_cache.STABILITY).iterdir())


def test_an_entry_holding_more_tasks_covers_a_run_that_asks_for_some_of_them(tmp_path, monkeypatch):
    """The same suites, limit, engine and KL settings, fewer tasks: the entry with the
    fewest tasks that holds them all; anything else that differs, or a task it lacks: none."""
    monkeypatch.setenv("QUANTLAB_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text("")
    rest = {"limit": 40, "engine_args": {"max_model_len": 2048}, "path": tmp_path}  # a Path, stored as a string
    big = {**rest, "tasks": ["a", "b", "c"]}
    small = {**rest, "tasks": ["b", "a"]}
    big_entry = result_cache.store(result_cache.QUALITY, result_cache.cache_key(big), src, big)
    assert result_cache.lookup_covering(result_cache.QUALITY, {**rest, "tasks": ["a"]}, "tasks") == (
        big_entry, big_entry.name, ["a", "b", "c"])
    small_entry = result_cache.store(result_cache.QUALITY, result_cache.cache_key(small), src, small)
    assert result_cache.lookup_covering(result_cache.QUALITY, {**rest, "tasks": ["a"]}, "tasks")[0] == small_entry
    assert result_cache.lookup_covering(result_cache.QUALITY, {**rest, "tasks": ["c"]}, "tasks")[0] == big_entry
    assert result_cache.lookup_covering(result_cache.QUALITY, {**rest, "tasks": ["a", "d"]}, "tasks") is None
    assert result_cache.lookup_covering(result_cache.QUALITY, {**rest, "limit": 20, "tasks": ["a"]}, "tasks") is None
    assert result_cache.lookup_covering(result_cache.STABILITY, {**rest, "tasks": ["a"]}, "tasks") is None


def test_a_setting_unset_in_the_lookup_matches_any_when_told_so(tmp_path, monkeypatch):
    """The demo's entry holds a code task scored in bwrap; a later run asking only for its
    other tasks has no sandbox part (None) and reuses it. One that asks for code in another
    sandbox does not."""
    monkeypatch.setenv("QUANTLAB_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text("")
    stored = {"limit": 40, "code_sandbox": "bwrap", "tasks": ["a", "code"]}
    entry = result_cache.store(result_cache.QUALITY, result_cache.cache_key(stored), src, stored)
    free = {"unset_matches_any": ("code_sandbox",)}
    lookup = result_cache.lookup_covering
    assert lookup(result_cache.QUALITY, {"limit": 40, "code_sandbox": None, "tasks": ["a"]}, "tasks", **free)[0] == entry
    assert lookup(result_cache.QUALITY, {"limit": 40, "code_sandbox": None, "tasks": ["a"]}, "tasks") is None
    assert lookup(result_cache.QUALITY, {"limit": 40, "code_sandbox": "unsandboxed", "tasks": ["code"]}, "tasks",
                  **free) is None
    assert lookup(result_cache.QUALITY, {"limit": 40, "code_sandbox": "bwrap", "tasks": ["code"]}, "tasks",
                  **free)[0] == entry
    assert lookup(result_cache.QUALITY, {"limit": 20, "code_sandbox": None, "tasks": ["a"]}, "tasks", **free) is None
    # a complete.json that is not an object (not written by quantlab) covers nothing and breaks nothing
    odd = tmp_path / "cache" / result_cache.QUALITY / "0123456789ab"
    odd.mkdir()
    (odd / result_cache.COMPLETE).write_text("[1, 2]")
    assert lookup(result_cache.QUALITY, {"limit": 40, "code_sandbox": None, "tasks": ["a"]}, "tasks", **free)[0] == entry


def test_a_writers_folder_before_its_rename_covers_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTLAB_CACHE_DIR", str(tmp_path / "cache"))
    parts = {"limit": 40, "tasks": ["a", "b"]}
    half = tmp_path / "cache" / result_cache.QUALITY / ".0123456789ab-xyz"
    half.mkdir(parents=True)
    (half / result_cache.COMPLETE).write_text(__import__("json").dumps(parts))
    assert result_cache.lookup_covering(result_cache.QUALITY, {"limit": 40, "tasks": ["a"]}, "tasks") is None
