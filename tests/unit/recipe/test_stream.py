"""The online fallback rule (recipe/stream.py): levels of hand-worked streams, and the
re-derivation verify uses, which accepts the rule's history and refuses a forged level."""

import pytest

from quantlab.core.shipped import RECIPES
from quantlab.recipe.family import for_family, judged_at
from quantlab.recipe.file import load_recipe
from quantlab.recipe.stream import (CONTROLLED, LORD, METHOD, OFF, SPENDING, Gamma, StreamDecision, cost_line,
                                    next_share, recipe_alpha, rederive)


def shares(gamma: Gamma, outcomes: list[bool], method: str = "online-fallback") -> list[float]:
    history, out = [], []
    for released in outcomes:
        s = next_share(gamma, history, method=method)
        out.append(s)
        history.append((s, released))
    return out


def test_the_front_loaded_gamma_sums_to_one_over_an_endless_stream():
    g = Gamma.front(0.9)
    assert g.at(1) == 0.9 and g.at(2) == pytest.approx(0.05) and g.at(3) == pytest.approx(0.1 / 6)
    assert sum(g.at(t) for t in range(1, 100_000)) == pytest.approx(1.0, abs=1e-5)
    assert all(g.at(t) >= g.at(t + 1) for t in range(1, 200))  # non-increasing


def test_a_released_decision_passes_its_level_on_and_a_block_passes_nothing():
    g = Gamma.front(0.9)
    # released, released, blocked, released, blocked
    got = shares(g, [True, True, False, True, False, True])
    want = [0.9, 0.9 + 0.05, 0.95 + 0.1 / 6, 0.1 / 12, 0.1 / 12 + 0.1 / 20, 0.1 / 30]
    assert got == pytest.approx(want)


def test_a_horizon_splits_evenly_and_passes_on():
    g = Gamma.horizon(4)
    assert shares(g, [False, True, True, False, False]) == pytest.approx([0.25, 0.25, 0.5, 0.75, 0.0])
    assert shares(g, [True] * 3, method=SPENDING) == pytest.approx([0.25] * 3)


def test_the_shares_never_sum_past_one_without_a_release():
    """Nothing released: the stream spends gamma alone, so P(any false release) <= alpha by the union bound."""
    g = Gamma.front(0.9)
    assert sum(shares(g, [False] * 500)) <= 1.0


def test_the_recipe_is_judged_at_its_share_divided_over_the_family():
    r = load_recipe(RECIPES / "gptq-w4a16.yaml").recipe
    alpha = recipe_alpha(r)
    # quality's two-sided 0.95 spends 0.025 a side, performance's one-sided bound 0.05: the run's is the larger
    assert alpha == pytest.approx(0.05)
    j = judged_at(r, 0.9 / 3)
    assert 1 - j.quality.gates.confidence == pytest.approx((1 - r.quality.gates.confidence) * 0.3)
    assert 1 - j.performance.confidence == pytest.approx((1 - r.performance.confidence) * 0.3)
    assert for_family(r, 3).quality.gates.confidence == pytest.approx(judged_at(r, 1 / 3).quality.gates.confidence)
    assert judged_at(r, 1.0) is r


def entry(position: int, outcomes: list[bool], alpha: float = 0.025) -> dict:
    g = Gamma.front(0.9)
    history, known = [], []
    for t, released in enumerate(outcomes[:position - 1], start=1):
        s = next_share(g, known)
        history.append((t, s, released))
        known.append((s, released))
    d = StreamDecision(control=CONTROLLED, key="k", position=position, share=next_share(g, known), method=METHOD,
                       gamma=g, history=tuple(history))
    return d.record(alpha)


def test_rederive_accepts_the_rules_level():
    e = entry(4, [True, False, True])
    share, problems = rederive(e)
    assert problems == [] and share == pytest.approx(0.1 / 12 + 0.1 / 6)  # gamma_4 + decision 3's, passed on
    assert e["level"] == pytest.approx(0.025 * share)


def test_rederive_refuses_a_forged_level_and_a_rewritten_history():
    forged = entry(4, [True, False, True])
    forged.update(share=1.0, level=0.025)  # the run claims the full alpha after a blocked decision
    _, problems = rederive(forged)
    assert any("the online fallback rule gives 0.025 " in p for p in problems), problems
    hidden = entry(4, [True, False, True])
    del hidden["history"][1]  # the blocked decision left out
    _, problems = rederive(hidden)
    assert any("lists positions [1, 3]" in p for p in problems), problems
    flipped = entry(4, [True, False, True])
    flipped["level"] = 0.02  # share kept, level not alpha x share
    assert any("alpha x" in p for p in rederive(flipped)[1])


def test_an_earlier_decision_in_flight_passed_nothing_on():
    """Decision 2 took its place while decision 1 ran: gamma_2 alone; 1 released later."""
    e = entry(3, [True, True])
    e["history"][1]["share"] = Gamma.front(0.9).at(2)
    e["share"] = Gamma.front(0.9).at(3) + Gamma.front(0.9).at(2)
    e["level"] = 0.025 * e["share"]
    assert rederive(e)[1] == []


def test_judged_alone_is_said_and_rederived():
    off = StreamDecision(control=OFF).record(0.025)
    assert rederive(off) == (1.0, [])
    assert "off by the user (--alone)" in cost_line(StreamDecision(control=OFF, by="--alone"), 0.025)
    line = cost_line(StreamDecision(position=4, share=0.5, method=METHOD, gamma=Gamma.front(0.9),
                                    history=((1, 0.9, True), (2, 0.95, False), (3, 0.5, True))), 0.025)
    assert line.startswith("decision 4 against this baseline (online-fallback): judged at level 0.0125")
    assert "0.000125" in line  # gamma_5 = 0.1 / 20 of 0.025 after a block


def test_the_report_says_what_a_re_run_costs():
    from quantlab.recipe.stream import report_line

    e = entry(4, [True, False, True], alpha=0.025)
    blocked = report_line(e, released=False)
    assert blocked.startswith("decision 4 against this baseline (online-fallback): judged at level 0.000625")
    assert "is judged at 0.000125" in blocked  # gamma_5 = 0.1 / 20 of 0.025
    assert "is judged at 0.00075" in report_line(e, released=True)  # passed on: 0.025 x (0.025 + 0.005)


# LORD++ (Ramdas et al. 2017), hand-worked with gamma_1 0.5 (then 0.5 / ((t - 1) t)) and w0 0.7
LG, W0 = Gamma.front(0.5), 0.7


def test_lord_levels_on_a_hand_worked_history():
    # released, released, blocked, blocked, released, then the next
    got = shares(LG, [True, True, False, False, True, False], method=LORD)
    g = LG.at
    want = [W0 * g(1),                                      # 0.35: the initial wealth's share
            W0 * g(2) + (1 - W0) * g(1),                    # 0.325: the first release earns 1 - w0
            W0 * g(3) + (1 - W0) * g(2) + g(1),             # 0.6333: the second earns a whole gamma
            W0 * g(4) + (1 - W0) * g(3) + g(2),             # 0.3042: a block costs nothing but time
            W0 * g(5) + (1 - W0) * g(4) + g(3),             # 0.1133
            W0 * g(6) + (1 - W0) * g(5) + g(4) + g(1)]      # 0.5608: the release at 5 earns again
    assert got == pytest.approx(want)
    assert got == pytest.approx([0.35, 0.325, 0.633333, 0.304167, 0.113333, 0.560833], abs=1e-6)


def test_lord_without_a_release_spends_at_most_w0_whatever_the_dependence():
    """Only bad candidates, none released: the shares are w0 gamma_t, summing below w0 (the union bound)."""
    got = shares(LG, [False] * 1000, method=LORD)
    assert got[:3] == pytest.approx([0.35, W0 * 0.25, W0 * 0.5 / 6])
    assert sum(got) <= W0


def test_after_a_block_lord_keeps_the_release_s_level_where_the_fallback_loses_it():
    lord = shares(LG, [True, False, False], method=LORD)
    fallback = shares(Gamma.front(0.9), [True, False, False], method=METHOD)
    assert fallback[2] == pytest.approx(0.1 / 6)  # gamma_3 alone: the block took the passed-on level with it
    assert lord[2] == pytest.approx(W0 * LG.at(3) + (1 - W0) * LG.at(2))  # the release at 1 still earns


def test_the_papers_gamma_is_for_long_streams():
    g = Gamma.lord()
    assert g.at(1) == pytest.approx(0.0535168, abs=1e-6) and g.at(2) == pytest.approx(0.0116382, abs=1e-6)
    assert sum(g.at(t) for t in range(1, 20_001)) < 1  # 0.976 over an endless stream
    assert Gamma.from_dict(g.as_dict()) == g


def lord_entry(position: int, outcomes: list[bool], alpha: float = 0.025) -> dict:
    history, known = [], []
    for t, released in enumerate(outcomes[:position - 1], start=1):
        s = next_share(LG, known, method=LORD, w0=W0)
        history.append((t, s, released))
        known.append((s, released))
    d = StreamDecision(control=CONTROLLED, key="k", position=position, method=LORD, gamma=LG, w0=W0,
                       share=next_share(LG, known, method=LORD, w0=W0), history=tuple(history))
    return d.record(alpha)


def test_rederive_accepts_lord_s_level_and_refuses_a_forged_one():
    e = lord_entry(4, [True, True, False])
    assert (e["method"], e["w0"]) == (LORD, W0) and "Ramdas" in e["reference"]
    share, problems = rederive(e)
    assert problems == [] and share == pytest.approx(0.304167, abs=1e-6)
    forged = lord_entry(4, [True, True, False])
    forged.update(share=0.633333, level=0.025 * 0.633333)  # the block claimed as a release
    assert any("LORD++ gives 0.304167" in p for p in rederive(forged)[1])
    inflated = lord_entry(4, [True, True, False])
    inflated["history"][1]["share"] = 0.9  # an earlier decision above what LORD++ gave it
    assert any("decision 2 of the stream is recorded at share 0.9; LORD++ gives 0.325" in p
               for p in rederive(inflated)[1])
    bad_w0 = lord_entry(2, [True])
    bad_w0["w0"] = 1.5
    assert "w0 is 1.5" in rederive(bad_w0)[1][0]


def test_lord_accepts_an_earlier_decision_that_knew_fewer_releases():
    """Decision 2 took its place while decision 1 ran: it knew no release (w0 x gamma_2), 1 released later."""
    e = lord_entry(3, [True, True])
    e["history"][1]["share"] = W0 * LG.at(2)
    assert rederive(e)[1] == []


def test_the_report_says_what_lord_earns():
    from quantlab.recipe.stream import report_line

    e = lord_entry(3, [True, True])
    assert "(lord++)" in report_line(e, released=True) and "earns the later runs a level" in report_line(e, True)
    assert "earns nothing and costs nothing" in report_line(e, released=False)
