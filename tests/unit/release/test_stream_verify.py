"""`verify` re-derives a release's stream level from the history its manifest records
(release/stream_consistency.py): a release made at its position's level verifies; the
level forged upward (a blocked decision's level claimed as passed on), or gates judged
looser than the recorded level, are problems; a manifest without a stream entry verifies
only as the format before streams (0.2.0). The releases are made by quantlab's own functions
(registered_release.build), signed again after each edit as a key holder can."""

from __future__ import annotations

from quantlab.recipe.stream import LORD, METHOD, NO_STREAM, Gamma, StreamDecision, rederive
from quantlab.release.verify import verify_release
from tests.unit.release.registered_release import build, resign

G = Gamma.front(0.9)
# decision 3 of its stream: 1 released (0.9), 2 blocked at 0.95, so gamma_3 alone
DECISION = StreamDecision(key="k" * 32, position=3, share=G.at(3), method=METHOD, gamma=G,
                          history=((1, 0.9, True), (2, 0.9 + G.at(2), False)))


def problems(r) -> list[str]:
    return verify_release(r.folder, public_key=r.public_key, require_attestation=True).problems


def test_a_release_at_its_stream_level_verifies(tmp_path):
    r = build(tmp_path, stream=DECISION)
    entry = r.manifest()["error_budget"]["stream"]
    assert (entry["position"], entry["method"]) == (3, "online-fallback")
    assert entry["level"] == round(0.05 * G.at(3), 10)
    assert problems(r) == []


def test_a_forged_level_is_refused(tmp_path):
    r = build(tmp_path, stream=DECISION)

    def claim_the_passed_on_level(m):
        m["error_budget"]["stream"].update(share=0.95 + G.at(3), level=0.05 * (0.95 + G.at(3)))
    resign(r, claim_the_passed_on_level)
    found = problems(r)
    assert any("online fallback rule gives 0.0166667" in p for p in found), found


def test_gates_judged_looser_than_the_recorded_level_are_refused(tmp_path):
    """A run judged at the recipe's alpha whose manifest claims a stream position."""
    r = build(tmp_path)

    def add_stream(m):
        m["error_budget"]["stream"] = DECISION.record(0.05)
    resign(r, add_stream)
    found = problems(r)
    assert any("not the one its gates were judged at" in p for p in found), found


def test_a_manifest_without_a_stream_entry_verifies_only_as_the_format_before_streams(tmp_path):
    """quantlab 0.3.0 records every release's place in its stream: a manifest of it without
    the entry had it removed. A 0.2.0 manifest (the format before streams) has none."""
    r = build(tmp_path, no_stream_entry=True)
    found = problems(r)
    assert any("error_budget.stream: missing" in p for p in found), found

    def as_0_2_0(m):
        m["quantlab"]["version"] = "0.2.0"
    resign(r, as_0_2_0)
    assert problems(r) == []


LORD_DECISION = StreamDecision(key="k" * 32, position=3, method=LORD, gamma=Gamma.front(0.5), w0=0.7,
                               share=0.7 * Gamma.front(0.5).at(3) + 0.3 * Gamma.front(0.5).at(2),
                               history=((1, 0.35, True), (2, 0.325, False)))


def test_a_lord_release_verifies_and_a_forged_lord_level_is_refused(tmp_path):
    r = build(tmp_path, stream=LORD_DECISION)
    assert r.manifest()["error_budget"]["stream"]["method"] == "lord++"
    assert problems(r) == []

    def claim_what_a_release_would_earn(m):  # decision 2 was blocked; the level claims gamma_1 from it
        entry = m["error_budget"]["stream"]
        entry.update(share=entry["share"] + 0.5, level=0.05 * (entry["share"] + 0.5))
    resign(r, claim_what_a_release_would_earn)
    found = problems(r)
    assert any("LORD++ gives 0.133333" in p for p in found), found


def test_no_stream_with_quality_verdicts_is_refused(tmp_path):
    r = build(tmp_path)
    assert any(g["check"] == "quality" for g in r.manifest()["gates"])

    def claim_no_stream(m):
        m["error_budget"]["stream"] = StreamDecision(control=NO_STREAM).record(0.05)
    resign(r, claim_no_stream)
    found = problems(r)
    assert any("in no stream (no quality check), yet the manifest has quality verdicts" in p for p in found), found


def test_a_gamma_that_grows_is_refused():
    entry = StreamDecision(key="k" * 32, position=1, share=0.1, method=METHOD, gamma=Gamma.front(0.1)).record(0.05)
    share, found = rederive(entry)
    assert share is None and any("not a non-increasing sequence" in p for p in found), found
    assert rederive(DECISION.record(0.05))[1] == []


def test_a_comparisons_candidate_records_its_family_not_a_stream_position(tmp_path):
    """A candidate of `quantlab run a.yaml b.yaml` takes no stream position: its manifest
    says it was judged as a family (release/stage._stream_of) and verifies; the same entry
    claiming a smaller level than its alpha is refused."""
    from types import SimpleNamespace

    from quantlab.recipe.family import Family
    from quantlab.recipe.stream import FAMILY_ONLY
    from quantlab.release.stage import _stream_of

    decision = _stream_of(SimpleNamespace(stream=None, family=Family(size=3, members=("a", "b", "c"))))
    assert decision.control == FAMILY_ONLY and decision.by == "comparison of 3"
    r = build(tmp_path, stream=decision)
    entry = r.manifest()["error_budget"]["stream"]
    assert entry["control"] == FAMILY_ONLY and "family" in entry["rule"]
    assert problems(r) == []
    assert _stream_of(SimpleNamespace(stream=None, family=None)) is None  # a single run always has its own decision

    def claim_a_level(m):
        m["error_budget"]["stream"]["level"] = 0.01
    resign(r, claim_a_level)
    assert any("a run judged alone is at share 1" in p for p in problems(r))
