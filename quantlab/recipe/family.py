"""Several candidates judged on the same items: the family, and the confidences that
keep its choice honest (pure).

With k candidates (or a search's trials) each gated at the recipe's alpha, the chance
that some candidate worse than a margin passes by luck grows with k, and the choice then
picks it. The family's control is Bonferroni over its candidates: every interval-judged
gate of every candidate runs at confidence 1 - (1 - c) / k, so the chance that any
candidate of the family is released on a wrong pass stays at the recipe's alpha (a union
bound). Measured on the default model's real records (docs/decisions.md): at 5%
discordance an unchanged candidate is released 91% alone, 71% in a family of 3, 56% of
5; confirming on a sealed half of the items instead keeps 19% (the half it confirms on
is too small for the 5-point margins), so a split only pays past many candidates.

The size is fixed before any engine starts: a comparison's candidates (a candidate refused
by its preflight is never judged, so it is not counted), a search's `--max-trials`
(whatever the search goes on to try). The adjusted recipe is what a candidate's stages
read (serving/session.EngineSession.recipe); the recipe file and its hash stay the user's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from quantlab.recipe.file import Recipe

RULE = "bonferroni"


@dataclass(frozen=True)
class Family:
    """The candidates judged together, as the manifest's ledger records them."""

    size: int  # the candidates (or trials) the alpha is spent over
    members: tuple[str, ...] = ()  # the candidates of this comparison
    kind: str = "comparison"  # comparison | search | declared (quantlab run --family NAME --family-size N)
    id: str | None = None  # the comparison or search folder's name, or the declared family's
    joined: int | None = None  # declared: its distinct members so far, this run's included

    def __post_init__(self):
        if self.size < 1:
            raise ValueError(f"a family has at least one member, not {self.size}")

    def as_dict(self) -> dict:
        return {**asdict(self), "members": list(self.members), "rule": RULE,
                "why": f"Bonferroni over {self.size} candidate(s) judged on the same items: every interval "
                       f"gate at confidence 1 - (1 - c) / {self.size}, so a wrong release anywhere in the "
                       "family stays within the recipe's alpha"}


def family_confidence(confidence: float, size: int) -> float:
    """A two-sided (or one-sided) confidence c held by each of `size` tests: 1 - (1 - c) / size."""
    return 1.0 - (1.0 - confidence) / max(1, size)


def for_family(recipe: Recipe, size: int) -> Recipe:
    """The recipe its candidate is judged by in a family of `size`: every interval gate's
    confidence (quality's gates, task and slice overrides, the pooled gate; performance's;
    load_quality's) adjusted. A family of one is the recipe itself."""
    return recipe if size <= 1 else judged_at(recipe, 1.0 / size)


def judged_at(recipe: Recipe, share: float) -> Recipe:
    """The recipe with every interval gate's alpha 1 - c judged at `share` of itself:
    confidence 1 - (1 - c) x share (a family of k: 1 / k; a stream's level, recipe/stream.py,
    divided by the family's size). A share of 1 is the recipe itself."""
    if not 0 < share <= 1:
        raise ValueError(f"a share of the recipe's alpha is in (0, 1], not {share}")
    if share == 1:
        return recipe

    def scaled(confidence: float) -> float:
        return 1.0 - (1.0 - confidence) * share

    update = {}
    q = recipe.quality
    if q is not None:
        def override(o):
            return o if o.confidence is None else o.model_copy(update={"confidence": scaled(o.confidence)})
        update["quality"] = q.model_copy(update={
            "gates": q.gates.model_copy(update={"confidence": scaled(q.gates.confidence)}),
            "pooled": None if q.pooled is None else q.pooled.model_copy(
                update={"confidence": scaled(q.pooled.confidence)}),
            "task_gates": {k: override(o) for k, o in q.task_gates.items()},
            "slice_gates": {k: override(o) for k, o in q.slice_gates.items()}})
    p = recipe.performance
    if p is not None:
        update["performance"] = p.model_copy(update={"confidence": scaled(p.confidence)})
    lq = getattr(recipe, "load_quality", None)
    if lq is not None:
        update["load_quality"] = lq.model_copy(update={"confidence": scaled(lq.confidence)})
    return recipe.model_copy(update=update)
