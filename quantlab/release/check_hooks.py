"""A check's hook, named in the table of checks (core/checks.py) as "module:function", imported
when its caller asks for it. Resolved here, on the release's floor, not in core: the hooks
live beside their checks (quality/, performance/, ...) and in reports/, above core, and the
floor imports nothing above it. Its callers are release/ and reports/;
tests/unit/test_checks_table.py holds each hook to the floors its caller may import."""

from __future__ import annotations

from importlib import import_module
from typing import Any


def hook(path: str) -> Any:
    """The function a row names ("module:function"), imported now."""
    module, _, function = path.partition(":")
    return getattr(import_module(module), function)
