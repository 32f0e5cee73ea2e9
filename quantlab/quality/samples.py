"""How many items of each quality task are evaluated: decided here (`task_samples`) and
nowhere else, and carried to lm-eval in one form, each task's documents as a run of doc
indices (`Docs`).

- A task evaluates its first `items` documents: `quality.limit`, else the suite task's own
  `limit` (the standard suite's, sized for a CPU run), never more than its data holds.
  Neither set: every document. A hub task's documents cannot be counted before lm-eval
  loads it: its `items` is the limit asked for (lm-eval stops at its last document), or
  all of them.
- `quality.samples: auto`: the candidate is judged after `first`, `first x growth`, ...
  of those items and after all of them (quality/sequential.schedule); the looks are sized
  on what the baseline answered, which is what the candidate is paired with. `all`: one
  look at every item.
- The baseline cache is keyed by `quality.limit` (cache_limit): a suite task's own limit is
  in the suite's hash, and the looks concern only the candidate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the lm-eval child reads Docs alone: it imports nothing more of quantlab's here
    from quantlab.quality.suites import Suite
    from quantlab.recipe.quality import QualitySpec


@dataclass(frozen=True)
class Docs:
    """One task's documents for lm-eval: doc indices start .. stop - 1 (stop None: up to its
    last). The only form a sample count travels in from the stage to lm-eval."""
    start: int = 0
    stop: int | None = None

    @property
    def size(self) -> int | None:
        return None if self.stop is None else self.stop - self.start

    def to_json(self) -> list[int | None]:
        return [self.start, self.stop]

    @classmethod
    def from_json(cls, pair: list[int | None]) -> Docs:
        return cls(int(pair[0] or 0), None if pair[1] is None else int(pair[1]))


@dataclass(frozen=True)
class TaskSamples:
    """A task's decided sample: `items` evaluated from its first document (None: all,
    the count unknown), whether that is the task's real count (`counted`: its data
    counted, or the baseline's answers; else a limit lm-eval may stop short of), the
    documents evaluated when the task is evaluated whole (`docs`: up to the last where no
    limit applies, as lm-eval reads the data, not as quantlab counted it), and the
    cumulative sizes the candidate is judged at (`looks`; empty when items is None)."""
    items: int | None
    counted: bool
    docs: Docs
    looks: tuple[int, ...]

    def look_docs(self, look: int) -> Docs:
        """The documents look `look` (0-based) adds to those before it."""
        return Docs(self.looks[look - 1] if look else 0, self.looks[look])


def sample_count(suite: Suite, task: str) -> int | None:
    """How many samples a local task has (lines of its test split's JSONL); None for a
    hub task or a split quantlab cannot count without lm-eval."""
    from quantlab.core.safe_yaml import load_file
    from quantlab.quality.suites import TaskYamlLoader

    path = suite.task_files.get(task)
    if suite.folder is None or path is None:
        return None
    data = load_file(path, loader=TaskYamlLoader)
    files = (data.get("dataset_kwargs") or {}).get("data_files") or {}
    split = data.get("test_split") or "test"
    rel = files.get(split) if isinstance(files, dict) else None
    if not isinstance(rel, str) or not (suite.folder / rel).is_file():
        return None
    with open(suite.folder / rel, "rb") as f:
        return sum(1 for line in f if line.strip())


def look_rule(spec: QualitySpec) -> Callable[[int], list[int]] | None:
    """`samples: auto`: the looks at n items (also for the planner's what-ifs); `all`: None."""
    from quantlab.quality.sequential import schedule

    if spec.samples != "auto":
        return None
    first, growth = spec.sequential.first, spec.sequential.growth
    return lambda n: schedule(n, first, growth)


def task_samples(spec: QualitySpec, suite: Suite, task: Any, *, answered: int | None = None) -> TaskSamples:
    """The decision: how many of `task`'s documents are evaluated and where the candidate is
    looked at. `answered`: the distinct documents the baseline answered (evaluate until
    decided sizes its looks on them), instead of the count the suite's data gives."""
    want = spec.limit or task.limit
    if answered is not None:
        items, counted = answered, True
    else:
        count = sample_count(suite, task.task)
        items = count if want is None else min(want, count) if count is not None else want
        counted = count is not None
    # lm-eval is asked for the limit itself, not quantlab's count: it stops at the task's last
    # document on its own, and a data file that is not one document a line counts wrong
    docs = Docs(0, want)
    if items is None:
        return TaskSamples(None, False, docs, ())
    rule = look_rule(spec)
    return TaskSamples(items, counted, docs, tuple(rule(items)) if rule else (items,))


def evaluated_docs(spec: QualitySpec, work: list[tuple[Suite, Any]]) -> dict[str, Docs]:
    """Each task's documents when it is evaluated whole (the baseline; the candidate under
    `samples: all`)."""
    return {task.task: task_samples(spec, suite, task).docs for suite, task in work}


def cache_limit(spec: QualitySpec) -> int | None:
    """What of the sample count keys the baseline cache (quality/work.cache_parts' `limit`)."""
    return spec.limit
