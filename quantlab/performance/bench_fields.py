"""What the readers of benchmark files measured elsewhere (bench_vllm, bench_guidellm) share
(pure): the parts of one benchmark they hand to bench_files, each field's check, and the
refusal that says what was found, what was expected and how to fix it, naming the file and
the field (exit 2)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantlab.core.errors import RecipeError
from quantlab.performance.metrics import RequestRecord

# as much of an error's text as quantlab's own load generator keeps
ERROR_CHARS = 500


@dataclass(frozen=True)
class Parsed:
    """One benchmark as a reader found it; bench_files.BenchRun adds the file's identity."""

    records: list[RequestRecord]
    wall_s: float
    concurrency: int | None
    request_rate: float | None
    facts: dict[str, Any]


def refuse(path: Path, field: str | None, found: str, expected: str, fix: str) -> RecipeError:
    return RecipeError(f"found {found}; expected {expected}. To fix: {fix}", file=str(path), field=field)


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _finite(path: Path, field: str, value: Any, fix: str, expected: str, *, least: float | None = None,
            above: float | None = None) -> float:
    """A finite number, at least `least` or above `above` when given; refused (naming what was
    expected) otherwise."""
    if not _number(value) or (least is not None and value < least) or (above is not None and value <= above):
        raise refuse(path, field, f"{value!r}", expected, fix)
    return float(value)


def seconds(path: Path, field: str, value: Any, fix: str) -> float:
    """A time in seconds, finite and not negative."""
    return _finite(path, field, value, fix, "a time in seconds, finite and not negative", least=0)


def duration(path: Path, field: str, value: Any, fix: str) -> float:
    """A benchmark's duration: finite and above 0 (throughput divides by it)."""
    return _finite(path, field, value, fix, "the benchmark's duration in seconds, above 0", above=0)


def clock(path: Path, field: str, value: Any, fix: str) -> float:
    """A clock reading (any origin), finite."""
    return _finite(path, field, value, fix, "a finite clock reading in seconds")


def rate(path: Path, field: str, value: Any, fix: str) -> float:
    return _finite(path, field, value, fix, "a request rate in requests per second, above 0 (or \"inf\")", above=0)


def count(path: Path, field: str, value: Any, fix: str, *, least: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise refuse(path, field, f"{value!r}", f"a whole number of at least {least}", fix)
    return value


def get(path: Path, doc: dict[str, Any], dotted: str, fix: str, *, where: str = "", kind: type | None = None) -> Any:
    """doc's value at a dotted path (of the type `kind` when given), refused where a part is
    missing or the value is of another type."""
    value: Any = doc
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            raise refuse(path, where + dotted, "no such field", f"the field {where + dotted}", fix)
        value = value[part]
    if kind is not None and not isinstance(value, kind):
        raise refuse(path, where + dotted, f"a {type(value).__name__}", f"a {kind.__name__}", fix)
    return value
