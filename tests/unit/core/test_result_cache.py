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
