"""A resumed run and the stream's register (pipeline/streams.py): a decision is made once
(a closed one re-judged takes a new position, its outcome is never rewritten), the run
folder's stream.json is checked against the register, and a run with no check verdict is
closed void, left out of the rule's count."""

import json
from types import SimpleNamespace

import pytest

from quantlab.core.errors import RecipeError
from quantlab.pipeline import streams
from quantlab.pipeline.streams import (RUN_FILE, close_decision, decide_position, read_history, resumed_position,
                                       stream_folder, take_position)
from quantlab.recipe.stream import LORD, SHIPPED_GAMMAS, SHIPPED_W0, rederive

PARTS = {"baseline": "b" * 64, "suites": ["s"]}


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(streams.CONTROL_ENV, raising=False)
    # the stream's parts come from the quality cache's key (tested with it); one fixed stream here
    monkeypatch.setattr(streams, "stream_parts", lambda ctx: dict(ctx.parts))


def _ctx(tmp_path, name="run-1", parts=PARTS):
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    recipe = SimpleNamespace(name="r", release=SimpleNamespace(stream_control=True, stream_method=LORD))
    return SimpleNamespace(run=SimpleNamespace(path=folder, record=SimpleNamespace(result=lambda stage: None)),
                           loaded=SimpleNamespace(recipe=recipe, content_hash="c" * 64), parts=parts)


def _decide(ctx, will_run=frozenset({"quality", "release"})):
    return decide_position(ctx, resumed=resumed_position(ctx), will_run=will_run)


def test_a_closed_decision_resumed_with_checks_to_run_takes_a_new_position(tmp_path):
    ctx = _ctx(tmp_path)
    first = _decide(ctx)
    close_decision(first, released=False)
    again = _decide(ctx)  # an edited recipe: its quality stage runs again
    assert (again.position, again.slot) == (2, 2)
    assert again.history == ((1, first.share, False),)
    assert json.loads((ctx.run.path / RUN_FILE).read_text())["register"] == 2
    assert read_history(first.key)[1]["replaces"] == 1
    # nothing decides again (a report re-drawn): the same decision
    assert _decide(ctx, will_run=frozenset()) == again


def test_an_open_decision_resumed_keeps_its_position(tmp_path):
    ctx = _ctx(tmp_path)
    first = _decide(ctx)
    assert _decide(ctx) == first
    assert len(read_history(first.key)) == 1


def test_a_change_of_the_streams_parts_takes_a_new_position(tmp_path):
    ctx = _ctx(tmp_path)
    first = _decide(ctx)
    ctx.parts = {**PARTS, "suites": ["other"]}
    moved = _decide(ctx)
    assert moved.key != first.key and moved.position == 1


def test_a_closed_decision_is_never_rewritten(tmp_path):
    d = take_position("0" * 32, {"run": "a"})
    close_decision(d, released=False)
    close_decision(d, released=False)  # the same outcome again changes nothing
    with pytest.raises(RecipeError, match="already closed as not released"):
        close_decision(d, released=True)
    assert read_history("0" * 32)[0]["released"] is False


def test_a_forged_run_file_is_refused_on_resume(tmp_path):
    ctx = _ctx(tmp_path)
    first = _decide(ctx)
    saved = ctx.run.path / RUN_FILE
    doc = json.loads(saved.read_text())
    doc["history"] = [{"t": 1, "share": 0.35, "released": True}]  # a forged earlier release
    doc["position"], doc["share"] = 2, 0.5
    saved.write_text(json.dumps(doc))
    with pytest.raises(RecipeError, match="does not match its decision in the register") as err:
        resumed_position(ctx)
    assert err.value.file == str(saved)
    doc["share"] = first.share  # the share kept, the history forged: the register's history is the one used
    saved.write_text(json.dumps(doc))
    kept, _ = resumed_position(ctx)
    assert kept.history == () and kept.position == 1
    other = _ctx(tmp_path, "run-2")  # another run folder pointing at this decision
    (other.run.path / RUN_FILE).write_text(saved.read_text())
    with pytest.raises(RecipeError, match="not of"):
        resumed_position(other)
    (stream_folder(first.key) / "1.json").write_text("{}")
    with pytest.raises(RecipeError, match="not authenticated"):
        resumed_position(ctx)


def test_a_void_decision_is_kept_but_not_counted(tmp_path):
    g, w0 = SHIPPED_GAMMAS[LORD], SHIPPED_W0
    crashed = take_position("0" * 32, {"run": "a"})
    close_decision(crashed, released=False, void=True)
    after = take_position("0" * 32, {"run": "b"})
    assert (after.slot, after.position, after.history) == (2, 1, ())
    assert after.share == pytest.approx(w0 * g.at(1))
    assert rederive(after.record(0.025))[1] == []
    assert read_history("0" * 32)[0]["void"] is True
    close_decision(crashed, released=False, void=True)  # void again: nothing to do
    with pytest.raises(RecipeError, match="already closed as void"):
        close_decision(crashed, released=True)
