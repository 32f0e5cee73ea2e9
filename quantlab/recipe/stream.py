"""Decisions made one after another against the same baseline answers: the rule that
keeps a wrong release anywhere in that stream at the recipe's alpha (pure).

Every run judged against the same baseline and suite (the same cached answers, whether
the cache was used or not) is one decision of a stream (pipeline/streams.py keeps the
stream's register). Judged each at the recipe's alpha, a candidate exactly at its margin
re-run 20 times is released at least once far more often than once (28.5% where one run
releases it 1.7%: docs/decisions.md).

Two rules, named by the recipe's release.stream_method and recorded with every decision:

- **LORD++** (Ramdas, Yang, Wainwright & Jordan, "Online control of the false discovery
  rate with decaying memory", NeurIPS 2017), the default: decision t is judged at share
  w0 gamma_t + (1 - w0) gamma_(t - tau_1) + sum_(j >= 2) gamma_(t - tau_j) of the alpha,
  tau_j the j-th released decision. A release earns the later decisions a level; a block
  costs nothing but time. Before any release the shares are w0 gamma_t, so a stream of
  only bad candidates releases any at most w0 x alpha of the time under any dependence
  (a union bound). Its bound on the share of wrong releases among all releases (the FDR)
  is proved for independent decisions; ours share the baseline's answers, so it is
  measured here (docs/decisions.md).
- **online fallback** (Tian & Ramdas, "Online control of the familywise error rate",
  Statistical Methods in Medical Research 2021): share_t = gamma_t + R_(t-1) share_(t-1),
  R_(t-1) 1 when the previous decision released. P(any false release in the stream) <=
  alpha under any dependence, but a block passes nothing on, so after one correct block
  every later candidate is judged at a small level.

Every level is a share of the recipe's alpha (alpha_t = alpha x share_t), so a recipe
whose confidences differ from another's in the same stream still spends only its own
share; a share is at most 1.

gamma: gamma_1 = `first`, then (1 - first) / ((t - 1) t) for t >= 2 (summing to exactly
1 - first over the rest of an endless stream); 1 / N for N decisions declared ahead
(`horizon`); or LORD++'s paper sequence (`lord`: 0.0772 log(max(t, 2)) / (t e^sqrt(log t)),
made for thousands of tests: gamma_1 = 0.054). Chosen by scripts/bench_stream.py
(docs/decisions.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

METHOD = "online-fallback"  # FWER under any dependence
LORD = "lord++"  # online FDR, decaying memory; the default
METHODS = (LORD, METHOD)
REFERENCES = {
    METHOD: "Tian & Ramdas, Online control of the familywise error rate, Statistical Methods in Medical Research "
            "2021 (the online fallback procedure)",
    LORD: "Ramdas, Yang, Wainwright & Jordan, Online control of the false discovery rate with decaying memory, "
          "NeurIPS 2017 (LORD++)"}
REFERENCE = REFERENCES[METHOD]
LORD_CONSTANT = 0.07720838  # the paper's: its gamma sums to 0.976 over an endless stream
SPENDING = "alpha-spending"  # share_t = gamma_t: nothing passed on (the benchmark's comparison only)
TOLERANCE = 1e-9  # shares recorded in JSON and read back


@dataclass(frozen=True)
class Gamma:
    """The fixed share of the alpha each position of a stream gets before anything is passed on."""

    kind: str = "front"  # front: gamma_1 = first, then (1 - first) / ((t - 1) t); horizon: 1 / n for t <= n;
    # lord: LORD++'s paper sequence
    first: float = 0.9
    n: int | None = None

    @classmethod
    def front(cls, first: float) -> Gamma:
        if not 0 < first <= 1:
            raise ValueError(f"gamma_1 is a share of the alpha in (0, 1], not {first}")
        return cls("front", first)

    @classmethod
    def horizon(cls, n: int) -> Gamma:
        if n < 1:
            raise ValueError(f"a horizon holds at least one decision, not {n}")
        return cls("horizon", 1.0 / n, n)

    @classmethod
    def lord(cls) -> Gamma:
        return cls("lord", LORD_CONSTANT * math.log(2))

    def at(self, t: int) -> float:
        """gamma_t (t from 1)."""
        if t < 1:
            raise ValueError(f"stream positions start at 1, not {t}")
        if self.kind == "horizon":
            return 1.0 / self.n if t <= self.n else 0.0
        if self.kind == "lord":
            return LORD_CONSTANT * math.log(max(t, 2)) / (t * math.exp(math.sqrt(math.log(t))))
        return self.first if t == 1 else (1.0 - self.first) / ((t - 1) * t)

    def proper(self) -> bool:
        """Non-increasing and summing to at most 1, as every rule here needs (front: gamma_2 =
        (1 - first) / 2 is at most gamma_1 from first = 1/3)."""
        return self.kind != "front" or 1 / 3 - TOLERANCE <= self.first <= 1

    def as_dict(self) -> dict[str, Any]:
        if self.kind == "horizon":
            return {"kind": "horizon", "n": self.n, "rule": f"gamma_t = 1/{self.n} for t <= {self.n}, then 0"}
        if self.kind == "lord":
            return {"kind": "lord", "rule": f"gamma_t = {LORD_CONSTANT} log(max(t, 2)) / (t exp(sqrt(log t)))"}
        return {"kind": "front", "first": self.first,
                "rule": f"gamma_1 = {self.first:g}, gamma_t = {1 - self.first:g} / ((t - 1) t) for t >= 2"}

    @classmethod
    def from_dict(cls, doc: Any) -> Gamma:
        """The gamma a record states (ValueError when it states none quantlab writes)."""
        if not isinstance(doc, dict):
            raise ValueError(f"gamma is recorded as {type(doc).__name__}, not an object")
        if doc.get("kind") == "horizon" and isinstance(doc.get("n"), int):
            return cls.horizon(doc["n"])
        if doc.get("kind") == "front" and isinstance(doc.get("first"), (int, float)):
            return cls.front(float(doc["first"]))
        if doc.get("kind") == "lord":
            return cls.lord()
        raise ValueError(f"gamma {doc!r} is not one quantlab writes (front with first, horizon with n, or lord)")


# Each method's gamma (and LORD++'s initial wealth w0, a share of the alpha), chosen by
# scripts/bench_stream.py on the committed records (docs/decisions.md: the table).
SHIPPED_GAMMAS = {LORD: Gamma.front(0.5), METHOD: Gamma.front(0.9)}
SHIPPED_W0 = 0.7
SHIPPED_GAMMA = SHIPPED_GAMMAS[METHOD]
DEFAULT_METHOD = LORD
RULES = {
    LORD: "share_t = w0 x gamma_t + (1 - w0) x gamma_(t - tau_1) + sum over j >= 2 of gamma_(t - tau_j) (tau_j: the "
          "j-th released decision, as known when this one took its place), level = alpha x share: among the releases "
          "against the same baseline answers the expected share of wrong ones is at most alpha for independent "
          "decisions (ours share the baseline's answers: measured in docs/decisions.md); with no release before, "
          "P(any false release) <= w0 x alpha under any dependence",
    METHOD: "share_t = gamma_t + R_(t-1) x share_(t-1) (R: the previous decision released, as known when this one "
            "took its place), level = alpha x share: every decision against the same baseline answers keeps "
            "P(any false release) at alpha under any dependence"}


def next_share(gamma: Gamma, history: Sequence[tuple[float, bool]], *, method: str = METHOD,
               w0: float = SHIPPED_W0) -> float:
    """The share of the recipe's alpha the next decision is judged at, from the stream's
    earlier decisions in order ((share, released) each; an unfinished one released nothing).
    `w0`: LORD++'s initial wealth, a share of the alpha (its other rules ignore it)."""
    t = len(history) + 1
    share = gamma.at(t)
    if method == LORD:
        if not 0 < w0 <= 1:
            raise ValueError(f"LORD++'s initial wealth w0 is a share of the alpha in (0, 1], not {w0}")
        released = [i + 1 for i, (_, r) in enumerate(history) if r]
        # w0 x gamma_t, then each release's alpha earned over the decisions after it (the first's less w0)
        share = w0 * share + sum((1 - w0 if j == 0 else 1.0) * gamma.at(t - tau) for j, tau in enumerate(released))
    elif method == METHOD and history and history[-1][1]:
        share += history[-1][0]
    elif method not in (METHOD, SPENDING):
        raise ValueError(f"unknown stream method {method!r}: expected one of {', '.join(METHODS)}")
    return min(1.0, share)


CONTROLLED = "controlled"  # judged at its stream position's level
OFF = "off by the user"  # release.stream_control: false, or quantlab run --alone: judged alone at alpha
NO_STREAM = "no stream"  # no quality check: no cached baseline answers to share
# a comparison's or a search's candidate: judged in its family (Bonferroni over its size), not yet a stream member
FAMILY_ONLY = "a family, not a stream member"


@dataclass(frozen=True)
class StreamDecision:
    """One run's place in its stream, fixed before any check: what its gates are judged at."""

    control: str = CONTROLLED
    key: str | None = None  # the stream's key (quality/work.cache_parts without the tasks)
    position: int | None = None  # t, from 1
    share: float = 1.0  # of the recipe's alpha: alpha_t / alpha
    method: str = DEFAULT_METHOD
    gamma: Gamma = SHIPPED_GAMMAS[DEFAULT_METHOD]
    w0: float = SHIPPED_W0  # LORD++'s initial wealth (a share of the alpha); unused by the fallback rule
    # the earlier decisions as known when this one took its position: (t, share, released)
    history: tuple[tuple[int, float, bool], ...] = ()
    by: str | None = None  # control off: how the user turned it off (the recipe field, the flag, the environment)
    # its file in the register (<slot>.json): the position counts only the decisions not void, the slot every one
    slot: int | None = None

    def next_shares(self) -> tuple[float, float]:
        """The next decision's share after this one: (if this one releases, if it does not)."""
        earlier = [(s, r) for _, s, r in self.history]
        return (next_share(self.gamma, [*earlier, (self.share, True)], method=self.method, w0=self.w0),
                next_share(self.gamma, [*earlier, (self.share, False)], method=self.method, w0=self.w0))

    def record(self, alpha: float | None) -> dict[str, Any]:
        """The ledger's `stream` entry; `alpha`: the recipe's own false-release alpha (its
        largest pass-side alpha before the stream's share)."""
        if self.control != CONTROLLED:
            return {"control": self.control, "by": self.by, "share": 1.0, "alpha": alpha, "level": alpha,
                    "rule": f"judged alone at the recipe's alpha: the stream's control was turned off by the user "
                            f"({self.by}); nothing bounds a wrong release over the runs against this baseline"
                            if self.control == OFF else
                            "a candidate of a comparison or search: judged in its family (the family entry), which "
                            "takes no position in its baseline's stream yet; nothing bounds a wrong release over "
                            "separate runs against this baseline" if self.control == FAMILY_ONLY else
                            "no quality check, so no cached baseline answers shared with other runs: judged alone"}
        level = None if alpha is None else round(alpha * self.share, 10)
        after_release, after_block = self.next_shares()
        return {"control": self.control, "method": self.method, "reference": REFERENCES[self.method],
                "key": self.key, "gamma": self.gamma.as_dict(), **({"w0": self.w0} if self.method == LORD else {}),
                "alpha": alpha, "position": self.position, "register": self.slot or self.position,
                "share": round(self.share, 12), "level": level,
                "history": [{"t": t, "share": round(s, 12), "released": r} for t, s, r in self.history],
                "next": {"share_after_release": round(after_release, 12), "share_after_block": round(after_block, 12)},
                "rule": RULES[self.method]}


def rederive(entry: Any) -> tuple[float | None, list[str]]:
    """The share a recorded `stream` entry's rule gives from its recorded history, and what
    is wrong with the entry (its history, its share, its level)."""
    if not isinstance(entry, dict):
        return None, [f"the stream entry is a {type(entry).__name__}, not an object"]
    if entry.get("control") != CONTROLLED:
        return _rederive_alone(entry)
    method, w0 = entry.get("method"), entry.get("w0", SHIPPED_W0)
    gamma, wrong = _recorded_rule(entry, method, w0)
    if wrong:
        return None, [wrong]
    position, history = entry.get("position"), entry.get("history")
    if not isinstance(position, int) or position < 1 or not isinstance(history, list):
        return None, [f"the stream entry records position {position!r} and a history of "
                      f"{type(history).__name__}: expected a position from 1 and the earlier decisions' list"]
    problems = []
    ts = [h.get("t") if isinstance(h, dict) else None for h in history]
    if ts != list(range(1, position)):
        problems.append(f"decision {position}'s history lists positions {ts}, not 1 .. {position - 1}: every "
                        "earlier decision of the stream is recorded")
    try:
        earlier = [(float(h["share"]), bool(h["released"])) for h in history]
    except (KeyError, TypeError, ValueError):
        return None, problems + ["the stream's history records a decision without its share or outcome"]
    def rule(before):
        return next_share(gamma, before, method=method, w0=w0)

    problems += _history_share_problems(earlier, rule, gamma, method, w0)
    share = rule(earlier)
    return share, problems + _recorded_share_problems(entry, share, earlier, gamma, method, w0, position)


def _rederive_alone(entry: dict) -> tuple[float | None, list[str]]:
    """A run judged alone (not in a controlled stream): share 1 at its alpha, or what is wrong."""
    alpha, level, share = entry.get("alpha"), entry.get("level"), entry.get("share")
    if entry.get("control") in (OFF, NO_STREAM, FAMILY_ONLY) and share == 1.0 and level == alpha:
        return 1.0, []
    return None, [f"the stream entry says control {entry.get('control')!r} with share {share} and level {level} "
                  f"(alpha {alpha}): a run judged alone is at share 1, its level its alpha"]


def _recorded_rule(entry: dict, method: Any, w0: Any) -> tuple[Gamma | None, str | None]:
    """The entry's gamma, or what is wrong with its method, w0 or gamma."""
    if method not in METHODS:
        return None, f"the stream's method {method!r} is not one quantlab uses ({', '.join(METHODS)})"
    if method == LORD and not (isinstance(w0, (int, float)) and 0 < w0 <= 1):
        return None, f"the stream's LORD++ initial wealth w0 is {w0!r}: expected a share of the alpha in (0, 1]"
    try:
        gamma = Gamma.from_dict(entry.get("gamma"))
    except ValueError as err:
        return None, f"the stream's gamma: {err}"
    if not gamma.proper():
        return None, (f"the stream's gamma {entry.get('gamma')!r} is not a non-increasing sequence summing to at "
                      "most 1 (the ones quantlab writes: front with first in [1/3, 1], horizon with n >= 1, lord)")
    return gamma, None


def _history_share_problems(earlier: list[tuple[float, bool]], rule, gamma: Gamma, method: str,
                            w0: float) -> list[str]:
    """Each earlier decision whose recorded share the rule does not give from the ones before it."""
    problems = []
    for i, (share, _) in enumerate(earlier):
        want = rule(earlier[:i])
        if method == LORD:
            # LORD++'s level only grows with the releases it knows of: a decision that took its place while an
            # earlier one was running knew fewer, so it lies between w0 x gamma_t (none known) and the rule's
            if not w0 * gamma.at(i + 1) - TOLERANCE <= share <= want + TOLERANCE:
                problems.append(f"decision {i + 1} of the stream is recorded at share {share:.6g}; LORD++ gives "
                                f"{want:.6g} from the decisions before it, at least {w0 * gamma.at(i + 1):.6g} "
                                "with none of their releases known")
        elif min(abs(share - want), abs(share - gamma.at(i + 1))) > TOLERANCE:
            # as the rule gave it, or gamma alone: the decision before it had not finished when it took its place
            problems.append(f"decision {i + 1} of the stream is recorded at share {share:.6g}; the rule gives "
                            f"{want:.6g} from the decisions before it ({gamma.at(i + 1):.6g} had the one before "
                            "it not finished)")
    return problems


def _recorded_share_problems(entry: dict, share: float, earlier: list[tuple[float, bool]], gamma: Gamma,
                             method: str, w0: float, position: int) -> list[str]:
    """What is wrong with the decision's own recorded share and level against the rule's `share`."""
    problems = []
    recorded, alpha, level = entry.get("share"), entry.get("alpha"), entry.get("level")
    if not isinstance(recorded, (int, float)) or abs(recorded - share) > TOLERANCE:
        if method == LORD:
            released = [i + 1 for i, (_, r) in enumerate(earlier) if r]
            problems.append(f"decision {position} is recorded at share {recorded} of the alpha; LORD++ gives "
                            f"{share:.6g} from its recorded history (w0 {w0:g} x gamma_{position}, and the released "
                            f"decisions {released or 'none'} earning gamma of their distance)")
        else:
            problems.append(f"decision {position} is recorded at share {recorded} of the alpha; the online fallback "
                            f"rule gives {share:.6g} from its recorded history (gamma_{position} = "
                            f"{gamma.at(position):.6g}" + (f" + the released decision {position - 1}'s "
                                                            f"{earlier[-1][0]:.6g})" if earlier and earlier[-1][1]
                                                            else ", the previous decision passed nothing on)"))
    if not isinstance(alpha, (int, float)) or not isinstance(level, (int, float)) or \
            abs(level - alpha * share) > TOLERANCE * max(1.0, alpha):
        problems.append(f"decision {position} records level {level} with alpha {alpha}: the rule's level is alpha x "
                        f"{share:.6g}")
    return problems


def recipe_alpha(recipe: Any) -> float | None:
    """The recipe's own false-release alpha: its largest pass-side alpha over the interval
    gates (quality's two-sided intervals spend (1 - c) / 2 a side; performance's bounds are
    one-sided), before any stream or family share. None: no interval gate."""
    alphas = []
    q = getattr(recipe, "quality", None)
    if q is not None:
        confidences = [q.gates.confidence] + ([q.pooled.confidence] if q.pooled is not None else [])
        confidences += [o.confidence for o in (*q.task_gates.values(), *q.slice_gates.values())
                        if o.confidence is not None]
        alphas += [(1 - c) / 2 for c in confidences]
    p = getattr(recipe, "performance", None)
    if p is not None:
        alphas.append(1 - p.confidence)
    return round(max(alphas), 10) if alphas else None


def cost_line(decision: StreamDecision, alpha: float | None) -> str:
    """What this decision and the next one against the same baseline are judged at, in one line."""
    if decision.control == OFF:
        return (f"stream control off by the user ({decision.by}): judged alone at the recipe's alpha"
                + (f" {alpha:g}" if alpha is not None else "") + "; nothing bounds a wrong release over the runs "
                "against this baseline")
    if decision.control != CONTROLLED:
        return "no stream: no quality check shares cached baseline answers with other runs; judged alone"
    after_release, after_block = decision.next_shares()
    if alpha is None:
        return (f"decision {decision.position} against this baseline: judged at {decision.share:.3g} of the "
                f"recipe's alpha; the next, after a release, at {after_release:.3g}, after none at {after_block:.3g}")
    return (f"decision {decision.position} against this baseline ({decision.method}): judged at level "
            f"{alpha * decision.share:.3g} ({decision.share:.3g} of the recipe's {alpha:g}); the next run against it "
            f"is judged at {alpha * after_block:.3g} if this one is not released ({alpha * after_release:.3g} if it is)")


def report_line(entry: Any, released: bool) -> str | None:
    """The report's line from a manifest's `stream` entry, the outcome known: what this
    decision was judged at and what the next run against the same baseline will be."""
    if not isinstance(entry, dict):
        return None
    alpha = entry.get("alpha")
    if entry.get("control") == OFF:
        return (f"stream control off by the user ({entry.get('by')}): judged alone at the recipe's alpha {alpha}; "
                "nothing bounds a wrong release over the runs against this baseline")
    if entry.get("control") != CONTROLLED:
        return "no stream: no quality check shares cached baseline answers with other runs; judged alone"
    nxt = (entry.get("next") or {}).get("share_after_release" if released else "share_after_block")
    if not isinstance(alpha, (int, float)) or not isinstance(nxt, (int, float)):
        return None
    lord = entry.get("method") == LORD
    return (f"decision {entry.get('position')} against this baseline ({entry.get('method')}): judged at level "
            f"{entry.get('level'):.3g} ({entry.get('share'):.3g} of the recipe's {alpha:g}); this run "
            + (("released, so it earns the later runs a level: " if released else
                "released nothing, so it earns nothing and costs nothing: ") if lord else
               ("released, so its level passes on: " if released else "released nothing, so nothing passes on: "))
            + f"the next run against it, a re-run of the same weights included, is judged at {alpha * nxt:.3g}")
