"""A user's YAML read within a budget: recipes (and the recipes they extend), suite files,
the lm-eval task YAML quantlab reads itself.

PyYAML's safe loader builds no objects but shares one Python object per anchor, so a
few hundred bytes of nested aliases (`&a [*b, *b, ...]`, a "billion laughs") load at
once and explode later, in whatever walks the data (the recipe's `extends:` merge, its
schema, its hash): seconds to hours and gigabytes. Here the document's node graph is
measured as if every alias were written out, before anything is constructed: a file
over MAX_FILE_BYTES, deeper than MAX_DEPTH, or expanding past MAX_NODES nodes or
MAX_SCALAR_CHARS characters is refused (RecipeError, exit 2) naming the file. The
measure is linear in the file's own nodes (each anchored node counted once).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from quantlab.core.errors import RecipeError

MAX_FILE_BYTES = 1 << 20  # 1 MiB: a recipe is a few KiB, a task YAML less
MAX_NODES = 100_000  # nodes with every alias expanded (the largest shipped file has a few hundred)
MAX_SCALAR_CHARS = 8 << 20  # characters of every scalar, aliases expanded
MAX_DEPTH = 64  # nesting, aliases expanded (a recipe nests 4 deep)

_LIMITS = (f"the limits are {MAX_FILE_BYTES >> 20} MiB a file, {MAX_NODES:,} nodes and {MAX_SCALAR_CHARS >> 20} "
           f"MiB of text with every alias (*name) written out, {MAX_DEPTH} levels of nesting")


class BudgetLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a document over the budget before constructing it.
    Subclass it to add constructors (the task YAML's `!function`)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        # the composer recurses once per level: a deep file is refused here, not by a RecursionError
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise _Refused(f"nested more than {MAX_DEPTH} levels deep (line {mark.line + 1})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def get_single_node(self) -> Any:
        node = super().get_single_node()
        if node is not None:
            check_expansion(node)
        return node


class _Refused(Exception):
    """Over the budget; turned into a RecipeError naming the file by the caller."""


def check_expansion(root: yaml.Node) -> None:
    """Nodes, characters and depth of the document with every alias expanded, counted
    over the shared node graph once per node (post-order, memoised); _Refused past a
    limit, or for an alias inside the node it names (a cycle: it never ends)."""
    done: dict[int, tuple[int, int, int]] = {}  # id(node) -> (nodes, chars, depth), expanded
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in done and not children_done:
            continue
        kids = _children(node)
        if not children_done:
            if key in open_:
                raise _Refused(f"an alias refers to a node that contains it (line {node.start_mark.line + 1}): the "
                               "data would never end")
            open_.add(key)
            stack.append((node, True))
            stack.extend((k, False) for k in kids if id(k) not in done)
            continue
        open_.discard(key)
        nodes = 1 + sum(done[id(k)][0] for k in kids)
        chars = (len(node.value) if isinstance(node, yaml.ScalarNode) else 0) + sum(done[id(k)][1] for k in kids)
        depth = 1 + max((done[id(k)][2] for k in kids), default=0)
        if nodes > MAX_NODES:
            raise _Refused(f"it expands to more than {MAX_NODES:,} nodes once its aliases (*name) are written out "
                           f"(the node at line {node.start_mark.line + 1} already to {nodes:,})")
        if chars > MAX_SCALAR_CHARS:
            raise _Refused(f"it expands to more than {MAX_SCALAR_CHARS >> 20} MiB of text once its aliases (*name) "
                           f"are written out (the node at line {node.start_mark.line + 1} already to {chars:,} "
                           "characters)")
        if depth > MAX_DEPTH:
            raise _Refused(f"it nests more than {MAX_DEPTH} levels deep once its aliases (*name) are written out "
                           f"(at line {node.start_mark.line + 1})")
        done[key] = (nodes, chars, depth)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def load_text(text: str, *, source: str, loader: type[BudgetLoader] = BudgetLoader) -> Any:
    """One YAML document from a string, within the budget. RecipeError naming `source`
    when over it; yaml.YAMLError (for the caller to word) when it does not parse."""
    if len(text) > MAX_FILE_BYTES:
        raise RecipeError(f"{len(text):,} characters of YAML, more than the {MAX_FILE_BYTES >> 20} MiB quantlab "
                          "reads; " + _LIMITS, file=source)
    try:
        return yaml.load(text, Loader=loader)  # noqa: S506 (a SafeLoader subclass)
    except _Refused as why:
        raise RecipeError(f"refused: {why}; {_LIMITS}. A YAML alias bomb looks like this; write the repeated parts "
                          "out, or split the file", file=source) from None
    except RecursionError:  # a limit above should come first; never a crash
        raise RecipeError(f"refused: nested too deeply to read; {_LIMITS}", file=source) from None


def load_file(path: str | Path, *, loader: type[BudgetLoader] = BudgetLoader) -> Any:
    """One YAML document from a file, within the budget: the size is checked before the
    file is read past it (a FIFO or /dev/zero included), then as load_text. RecipeError
    naming the file (too large, not UTF-8, over the budget); yaml.YAMLError when it does
    not parse."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise RecipeError(f"cannot read it: {err.strerror or err}", file=str(p)) from None
    if len(raw) > MAX_FILE_BYTES:
        raise RecipeError(f"larger than the {MAX_FILE_BYTES >> 20} MiB quantlab reads of a YAML file; {_LIMITS}. "
                          "Is it the file you meant?", file=str(p))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RecipeError("not a UTF-8 text file", file=str(p)) from None
    return load_text(text, source=str(p), loader=loader)
