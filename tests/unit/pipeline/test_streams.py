"""The stream's register in the cache (pipeline/streams.py): concurrent runs never take
one position, a decision's outcome is what it passes on, an interrupted one passes
nothing, and a history edited or planted without the cache secret is refused."""

import json
import multiprocessing

import pytest

from quantlab.core.errors import RecipeError
from quantlab.pipeline.streams import close_decision, read_history, stream_folder, take_position
from quantlab.recipe.stream import LORD, METHOD, SHIPPED_GAMMAS, SHIPPED_W0, Gamma, rederive

KEY = "0" * 32


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTLAB_CACHE_DIR", str(tmp_path / "cache"))


def _take(n: int, queue) -> None:
    queue.put([take_position(KEY, {"run": f"racer-{i}"}).position for i in range(n)])


def test_concurrent_runs_never_take_one_position():
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    racers = [ctx.Process(target=_take, args=(5, queue)) for _ in range(4)]
    for p in racers:
        p.start()
    got = [t for _ in racers for t in queue.get(timeout=60)]
    for p in racers:
        p.join(timeout=60)
    assert sorted(got) == list(range(1, 21))
    assert [d["t"] for d in read_history(KEY)] == list(range(1, 21))


def test_an_outcome_passes_the_level_on_and_an_interrupted_run_passes_nothing():
    g = Gamma.front(0.9)
    first = take_position(KEY, {"run": "a"}, METHOD)
    assert (first.position, first.share) == (1, 0.9)
    close_decision(first, released=True, candidate="w1")
    second = take_position(KEY, {"run": "b"}, METHOD)
    assert second.share == pytest.approx(0.9 + g.at(2))
    # b is interrupted: never closed, so it released nothing
    third = take_position(KEY, {"run": "c"}, METHOD)
    assert third.share == pytest.approx(g.at(3))
    assert [h[2] for h in third.history] == [True, False]
    assert rederive(third.record(0.025))[1] == []
    assert read_history(KEY)[0]["candidate"] == "w1"


def test_an_edited_history_is_refused_and_says_so():
    d = take_position(KEY, {"run": "a"})
    close_decision(d, released=False)
    take_position(KEY, {"run": "b"})
    path = stream_folder(KEY) / "1.json"
    doc = json.loads(path.read_text())
    doc["released"] = True  # a blocked decision turned into a release, to pass its level on
    path.write_text(json.dumps(doc))
    with pytest.raises(RecipeError, match="1.json is not authenticated by this user's cache secret"):
        take_position(KEY, {"run": "c"})
    path.unlink()  # a decision removed from the middle
    with pytest.raises(RecipeError, match="decision 1 is missing"):
        read_history(KEY)


def test_lord_takes_its_position_from_the_releases_before_it():
    g, w0 = SHIPPED_GAMMAS[LORD], SHIPPED_W0
    first = take_position(KEY, {"run": "a"})  # the default method
    assert (first.method, first.share) == (LORD, pytest.approx(w0 * g.at(1)))
    close_decision(first, released=True)
    second = take_position(KEY, {"run": "b"}, LORD)
    close_decision(second, released=False)
    third = take_position(KEY, {"run": "c"}, LORD)
    # the release at 1 still earns at 3 although 2 was blocked
    assert third.share == pytest.approx(w0 * g.at(3) + (1 - w0) * g.at(2))
    assert rederive(third.record(0.025))[1] == []


def test_a_stream_keeps_its_first_method():
    take_position(KEY, {"run": "a"}, METHOD)
    with pytest.raises(RecipeError, match="judged by online-fallback, its first decision's method") as err:
        take_position(KEY, {"run": "b"}, LORD)
    assert err.value.field == "release.stream_method"
