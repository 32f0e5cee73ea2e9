"""The slice: documents per task in proportion to what each task has (largest remainders,
at least one each, never more than it has, the same on every run), and the planned size with
what it can detect."""

from __future__ import annotations

import itertools
import random

import pytest

from quantlab.load_quality.slice import allocate, largest_remainders, planned_items, slice_docs
from quantlab.quality.planner import items_to_show
from quantlab.quality.samples import Docs
from quantlab.quality.stats import ni_pass_probability
from quantlab.recipe.load_quality import LoadQualitySpec


def test_shares_follow_each_tasks_documents_by_largest_remainders():
    # quotas of 20 over 100 + 50 + 3 = 153: 13.07, 6.54, 0.39 -> c's below one is set to one, the other
    # 19 shared over 150: 12.67 and 6.33 -> floors 12 and 6, the one left to a's larger remainder
    assert allocate({"a": 100, "b": 50, "c": 3, "d": 0}, 20) == {"a": 13, "b": 6, "c": 1, "d": 0}
    # 10 over 30 + 30 + 40: 3, 3, 4 exactly
    assert allocate({"x": 30, "y": 30, "z": 40}, 10) == {"x": 3, "y": 3, "z": 4}
    # 10 over 3 x 30: 3.33 each, the one left goes to the first name (equal remainders, equal sizes)
    assert allocate({"b": 30, "a": 30, "c": 30}, 10) == {"a": 4, "b": 3, "c": 3}


def test_every_document_when_the_total_covers_them_and_none_when_zero():
    assert allocate({"a": 5, "b": 7}, 12) == {"a": 5, "b": 7}
    assert allocate({"a": 5, "b": 7}, 400) == {"a": 5, "b": 7}
    assert allocate({"a": 5, "b": 7}, 0) == {"a": 0, "b": 0}
    with pytest.raises(ValueError):
        allocate({"a": 5}, -1)


def test_fewer_documents_than_tasks_go_to_the_largest():
    assert allocate({"a": 100, "b": 50, "c": 3, "d": 1}, 3) == {"a": 2, "b": 1, "c": 0, "d": 0}
    assert allocate({"a": 100, "b": 50, "c": 3, "d": 1}, 4) == {"a": 1, "b": 1, "c": 1, "d": 1}


def test_the_rules_hold_over_many_draws_and_do_not_depend_on_the_order():
    rng = random.Random(7)
    for _ in range(400):
        sizes = {f"t{i}": rng.choice([0, 1, 2, 5, 17, 60, 300]) for i in range(rng.randint(1, 6))}
        total = rng.randint(0, sum(sizes.values()) + 5)
        got = allocate(sizes, total)
        assert sum(got.values()) == min(total, sum(sizes.values()))
        assert all(0 <= got[t] <= sizes[t] for t in sizes)
        live = [t for t in sizes if sizes[t]]
        if total >= len(live):
            assert all(got[t] >= 1 for t in live)
        for order in itertools.islice(itertools.permutations(sizes), 6):
            assert allocate({t: sizes[t] for t in order}, total) == got


def test_without_the_floor_of_one_each_share_is_within_one_of_its_quota():
    sizes = {"a": 211, "b": 97, "c": 45, "d": 12}
    for total in range(31, 365):  # from 31 on every quota is at least one (d's: 31 x 12 / 365)
        got = allocate(sizes, total)
        for t, size in sizes.items():
            assert abs(got[t] - total * size / 365) < 1, (total, t)
    # below, the one given to d comes out of the others' shares: 4 is one each
    assert allocate(sizes, 4) == {"a": 1, "b": 1, "c": 1, "d": 1}


def test_largest_remainders_in_exact_integers():
    # 7 x (1/3, 1/3, 1/3) = 2.33 each: one more to the first name
    assert largest_remainders({"c": 1, "a": 1, "b": 1}, 7) == {"a": 3, "b": 2, "c": 2}
    assert largest_remainders({}, 3) == {}


def test_the_slice_is_each_tasks_first_documents():
    assert slice_docs({"a": 13, "b": 0, "c": 1}) == {"a": Docs(0, 13), "c": Docs(0, 1)}


def test_auto_is_the_planners_size_with_its_power_said():
    spec = LoadQualitySpec()
    n, line = planned_items(spec, 0.05)
    assert n == items_to_show(0.05, 0.05, 0.95, at_least=40) == 224
    p = ni_pass_probability(224, 0.05, 0.025, 0.025, 0.95)
    held = 1 - ni_pass_probability(224, 0.05, 0.025, 0.125, 0.95)
    assert p >= 0.8
    assert line.startswith("224 paired documents a point (auto): at a discordance of 5.0%")
    assert f"with probability {p:.0%}" in line and f"not released with probability {held:.0%}" in line
    assert "short of" not in line


def test_auto_is_capped_by_max_items_and_said_so():
    spec = LoadQualitySpec(max_items=100)
    n, line = planned_items(spec, 0.05)
    p = ni_pass_probability(100, 0.05, 0.025, 0.025, 0.95)
    assert n == 100 and "capped by load_quality.max_items" in line
    assert f"with probability {p:.0%}" in line and p < 0.8 and "short of 80%: about 224 documents" in line


def test_a_smaller_floor_needs_fewer_documents_and_never_fewer_than_min_items():
    n_low, _ = planned_items(LoadQualitySpec(), 0.01)
    assert n_low == items_to_show(0.05, 0.01, 0.95, at_least=40) < 224
    n_tiny, _ = planned_items(LoadQualitySpec(min_items=150), 0.001)
    assert n_tiny >= 150


def test_a_given_size_is_kept_and_its_power_said():
    spec = LoadQualitySpec(items=100)
    n, line = planned_items(spec, 0.05)
    assert n == 100 and "(load_quality.items)" in line
    assert f"{ni_pass_probability(100, 0.05, 0.025, 0.025, 0.95):.0%}" in line
    n, line = planned_items(spec, 0.05, available=60)
    assert n == 60 and "every document the tasks have" in line
