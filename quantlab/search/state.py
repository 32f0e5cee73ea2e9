"""The search for the fewest layers to keep in high precision (pure): which numbers of
the most sensitive layers to try next, when to stop, which trial wins, and the recipe
a trial is; and the recipe's own knobs (ordered choices) tried before any layer is kept.

Trial k keeps the k most sensitive groups (by the sensitivity ranking) unquantized: their
modules join the recipe's `quantization.ignore`. Keeping more sensitive layers is
assumed never to hurt, so the smallest passing k is found by bisection between the
largest k known to fail (lo) and the smallest known to pass (hi). A round tries up to
`width` values of k at once (one comparison: one baseline for all of them), spread
evenly over the open interval, so each round cuts it by width + 1."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

PASS = "release"


def first_round(max_layers: int, width: int) -> list[int]:
    """Nothing kept and the most the search may keep (can the search succeed at all?),
    and interior points if the width allows."""
    points = {0, max_layers} | set(spread(0, max_layers, max(0, width - 2)))
    return sorted(points)


def spread(lo: int, hi: int, count: int) -> list[int]:
    """Up to `count` distinct integers strictly between lo and hi, evenly spaced."""
    inside = hi - lo - 1
    if inside <= 0 or count <= 0:
        return []
    if count >= inside:
        return list(range(lo + 1, hi))
    return sorted({lo + round((hi - lo) * (i + 1) / (count + 1)) for i in range(count)} - {lo, hi})


@dataclass
class SearchState:
    max_layers: int
    width: int
    trials: dict[int, dict[str, Any]] = field(default_factory=dict)  # k -> outcome (decision, ...)
    notes: list[str] = field(default_factory=list)

    def record(self, k: int, outcome: dict[str, Any]) -> None:
        self.trials[k] = outcome

    @property
    def passing(self) -> list[int]:
        return sorted(k for k, t in self.trials.items() if t.get("decision") == PASS)

    @property
    def hi(self) -> int | None:
        """The smallest k that passed."""
        return self.passing[0] if self.passing else None

    @property
    def lo(self) -> int | None:
        """The largest k that failed below hi (-1 where none has: 0 not tried yet)."""
        below = [k for k in self.trials if k not in self.passing and (self.hi is None or k < self.hi)]
        return max(below) if below else None

    def next_points(self) -> list[int]:
        """The k values of the next round; [] when the search is over."""
        if not self.trials:
            return first_round(self.max_layers, self.width)
        if self.hi is None:
            return []  # even the most it may keep did not pass
        lo = -1 if self.lo is None else self.lo
        return [k for k in spread(lo, self.hi, self.width) if k not in self.trials]

    def monotonic_note(self) -> str | None:
        """A failing k above a passing one breaks the search's premise: say so."""
        failing_above = sorted(k for k in self.trials if k not in self.passing and self.hi is not None and k > self.hi)
        if failing_above:
            return (f"keeping {self.hi} layers passed but keeping {failing_above} did not: more kept layers did "
                    "not always help (noise at the gates' edge, or the ranking is not the served truth)")
        return None

    def best(self) -> int | None:
        """The winning trial: the smallest passing k; else the closest (fewest failed gates,
        then most layers kept)."""
        if self.hi is not None:
            return self.hi
        if not self.trials:
            return None
        return min(self.trials, key=lambda k: (len(self.trials[k].get("failed_gates") or []), -k))


def ignore_for(recipe_ignore: list[str], ranking: list[dict[str, Any]], k: int) -> list[str]:
    """The recipe's ignore list plus every module of the k most sensitive groups."""
    kept = [m for row in ranking[:k] for m in row["modules"]]
    return list(recipe_ignore) + [m for m in kept if m not in recipe_ignore]


def trial_name(name: str, k: int) -> str:
    suffix = f"-keep{k}"
    return name[:64 - len(suffix)] + suffix


def parse_knob(text: str) -> tuple[str, list[Any]]:
    """'quantization.group_size=128,64,32' -> ('quantization.group_size', [128, 64, 32]);
    each value read as YAML (numbers, booleans, strings), within core/safe_yaml's budget.
    ValueError when malformed."""
    import yaml

    from quantlab.core.safe_yaml import load_text

    field, sep, values = text.partition("=")
    field = field.strip()
    if not sep or not field or not values.strip() or not re.fullmatch(r"[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)+", field):
        raise ValueError(f"--knob {text!r}: expected SECTION.FIELD=V1,V2,... (e.g. quantization.group_size=128,64)")
    try:
        choices = [load_text(v.strip(), source=f"--knob {field}") for v in values.split(",") if v.strip()]
    except yaml.YAMLError as err:
        raise ValueError(f"--knob {text!r}: a choice is not a YAML value ({str(err).splitlines()[0]})") from None
    if len(set(map(repr, choices))) != len(choices):
        raise ValueError(f"--knob {text!r}: a choice is listed twice")
    return field, choices


def knob_pick(outcomes: list[dict[str, Any]]) -> tuple[int | None, int]:
    """(the first choice in the user's order that passed, or None; the choice to carry on
    with when none did: fewest failed gates, the earlier on a tie)."""
    passed = next((i for i, o in enumerate(outcomes) if o.get("decision") == PASS), None)
    closest = min(range(len(outcomes)), key=lambda i: (len(outcomes[i].get("failed_gates") or []), i))
    return passed, closest
