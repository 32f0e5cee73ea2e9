"""Families declared across runs (pipeline/families.py): a size fixed by the first run, at most that many members."""

import pytest

from quantlab.core.errors import RecipeError
from quantlab.core import result_cache
from quantlab.pipeline.families import join_family


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTLAB_CACHE_DIR", str(tmp_path / "cache"))


def test_a_declared_family_holds_its_size_and_no_more():
    first = join_family("rel-12", 2, {"a": {"recipe_sha256": "1"}})
    assert (first.size, first.joined, first.kind, first.id) == (2, 1, "declared", "rel-12")
    again = join_family("rel-12", 2, {"a": {"recipe_sha256": "1"}})  # the same recipe run again: one member
    assert again.joined == 1
    assert join_family("rel-12", 2, {"b": {"recipe_sha256": "2"}}).joined == 2
    with pytest.raises(RecipeError, match="holds 2 of its 2 candidates") as err:
        join_family("rel-12", 2, {"c": {"recipe_sha256": "3"}})
    assert err.value.field == "--family-size"
    with pytest.raises(RecipeError, match="declared with --family-size 2, not 5"):
        join_family("rel-12", 5, {"c": {"recipe_sha256": "3"}})
    # a comparison of two new candidates cannot join a family with room for one
    join_family("rel-13", 2, {"a": {"recipe_sha256": "1"}})
    with pytest.raises(RecipeError, match="2 more would make it 3"):
        join_family("rel-13", 2, {"b": {"recipe_sha256": "2"}, "c": {"recipe_sha256": "3"}})


def test_a_family_name_is_a_plain_name():
    with pytest.raises(RecipeError, match="plain name"):
        join_family("../x", 2, {"a": {}})
    with pytest.raises(RecipeError, match="at least one"):
        join_family("x", 0, {"a": {}})


def test_the_baseline_cache_counts_distinct_candidates_judged_on_its_answers():
    assert result_cache.mark_judged(result_cache.QUALITY, "k" * 64, "c1", {"recipe": "a"}) == 1
    assert result_cache.mark_judged(result_cache.QUALITY, "k" * 64, "c1", {"recipe": "a"}) == 1  # the same weights
    assert result_cache.mark_judged(result_cache.QUALITY, "k" * 64, "c2", {"recipe": "b"}) == 2
    assert result_cache.lookup(result_cache.QUALITY, "k" * 64) is None  # the count is beside the entry, not one
