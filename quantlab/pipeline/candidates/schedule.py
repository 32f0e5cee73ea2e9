"""The order performance blocks are measured in when several candidates share one
baseline (pure): the baseline, then every candidate, then the baseline again and the
candidates in the reverse order, and so on (B, C1, C2, C3, B, C3, C2, C1, B, ...).

Why: each candidate's ratio pairs its block with the baseline block next to it in
time, so machine drift over the run cancels as it does for one candidate (A, B, B, A);
reversing the sweep keeps any one candidate from always being measured right after the
baseline (warm caches) or last (a hotter machine)."""

from __future__ import annotations

from quantlab.core.roles import BASELINE


def block_order(candidates: list[str], repeats: int) -> list[tuple[int, str]]:
    """(repeat, role) in measuring order: one baseline block per repeat, then the
    candidates, forwards on even repeats and backwards on odd ones."""
    if len(set(candidates)) != len(candidates):
        raise ValueError(f"candidate names must be unique; got {candidates}")
    if BASELINE in candidates:
        raise ValueError(f"'{BASELINE}' is the baseline's name, not a candidate's")
    return [block for rep in range(repeats) for block in one_sweep(rep, candidates)]


def one_sweep(rep: int, candidates: list[str]) -> list[tuple[int, str]]:
    """Repeat `rep`'s blocks: the baseline, then the candidates named (an adaptive repeat
    names those still undecided), forwards on even repeats and backwards on odd ones."""
    return [(rep, BASELINE)] + [(rep, c) for c in (candidates if rep % 2 == 0 else candidates[::-1])]


def paired_baseline(order: list[tuple[int, str]], candidate: str) -> list[int]:
    """For each repeat of `candidate`, the repeat index of the baseline block it is
    compared with (the one of the same sweep)."""
    return [rep for rep, role in order if role == candidate]


def serving_groups(candidates: list[str], at_once: int | None, fits: int | None) -> list[list[str]]:
    """The candidates in groups served together beside the baseline: `at_once` a group
    (None: all), no more than `fits` (how many this host's memory holds; None: unknown).
    ValueError when not even one fits."""
    size = min(at_once or len(candidates), len(candidates))
    if fits is not None:
        if fits < 1:
            raise ValueError("not even one candidate fits beside the baseline")
        size = min(size, fits)
    return [candidates[i:i + size] for i in range(0, len(candidates), size)]
