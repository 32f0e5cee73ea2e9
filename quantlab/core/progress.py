"""What the terminal shows while a long step runs: on a terminal, a rich progress bar
per step (what, how far, elapsed, its deadline); elsewhere (CI logs, pipes) plain
lines: one when the step starts, one every `heartbeat_s` while it runs, one when it
ends with how long it took.

Stages and engines get a `progress` callable (one message, one line). Long steps use
`step(progress, what, total=..., unit=...)`, which works with any such callable: the
terminal's reporter draws bars, a plain function (tests, library use) gets the start
and end lines.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

Progress = Callable[[str], None]


class StepHandle:
    """How far a step is: `update(done=..., note=...)` or `advance()`."""

    def __init__(self, what: str, total: int | None, unit: str, lines: Progress | None = None):
        self.what, self.total, self.unit = what, total, unit
        self._lines = lines  # plain output: details are lines of their own
        self.done = 0
        self.note = ""
        self._note_printed = False
        self.started = time.monotonic()
        self._lock = threading.Lock()

    def update(self, done: int | None = None, note: str | None = None) -> None:
        with self._lock:
            if done is not None:
                self.done = max(self.done, done)
            if note is not None:
                self.note = note
                self._note_printed = False
            self._changed()

    def advance(self, n: int = 1) -> None:
        self.update(done=self.done + n)

    def detail(self, msg: str, *, done: int | None = None) -> None:
        """What the step is doing now: a line of its own in plain output, the bar's note on
        a terminal."""
        self.update(done=done, note=msg)
        if self._lines is not None:
            self._lines(msg)
            self._note_printed = True  # plain output: the heartbeat need not repeat it

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def where(self, *, unprinted_only: bool = False) -> str:
        count = f"{self.done}/{self.total} {self.unit}".strip() if self.total else ""
        note = "" if unprinted_only and self._note_printed else self.note
        return ", ".join(p for p in (count, note) if p)

    def _changed(self) -> None:  # the terminal reporter redraws; plain output waits for the heartbeat
        pass


@contextlib.contextmanager
def _plain_step(progress: Progress, what: str, total: int | None, unit: str, heartbeat_s: float,
                announce: bool = True) -> Iterator[StepHandle]:
    handle = StepHandle(what, total, unit, lines=progress)
    if announce:
        progress(f"{what} ...")
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(heartbeat_s):
            where = handle.where(unprinted_only=True)
            progress(f"{what}: {where + ', ' if where else ''}{handle.elapsed():.0f} s")

    ticker = threading.Thread(target=beat, daemon=True, name="quantlab-heartbeat")
    ticker.start()
    ok = False
    try:
        yield handle
        ok = True
    finally:
        stop.set()
        ticker.join(timeout=1)
        # the details were lines of their own: the end line says how far, not the last detail again
        count = f"{handle.done}/{handle.total} {handle.unit}".strip() if handle.total else ""
        progress(f"{what}: {'done' if ok else 'stopped'}{' (' + count + ')' if count else ''} "
                 f"in {handle.elapsed():.1f} s")


def step(progress: Progress, what: str, *, total: int | None = None, unit: str = "",
         heartbeat_s: float = 60, announce: bool = True) -> contextlib.AbstractContextManager[StepHandle]:
    """A long step: a bar on a terminal (when `progress` is a TerminalProgress), else
    start/heartbeat/end lines through `progress` (announce=False: the caller already said
    what starts)."""
    if isinstance(progress, TerminalProgress):
        return progress.step(what, total=total, unit=unit, heartbeat_s=heartbeat_s, announce=announce)
    return _plain_step(progress, what, total, unit, heartbeat_s, announce)


class TerminalProgress:
    """The CLI's progress reporter. On a terminal, steps are rich progress bars that end
    as one line each; messages print above them. Not on a terminal, everything is a
    plain line (no cursor movement, no colours that a CI log would show as codes)."""

    def __init__(self, console: Any, *, prefix: str = "quantlab", own_stderr: bool = True):
        self._fallback = console
        self._own_stderr = own_stderr  # False: always the given console (tests)
        self._own: Any = None
        self.prefix = prefix
        self._bars: Any = None
        self._depth = 0
        self._lock = threading.Lock()

    @property
    def console(self) -> Any:
        """A console on a duplicate of the process's stderr, taken at first use: engines
        redirect file descriptor 2 into their log files while they run, and progress must
        still reach the terminal. Where stderr is not the process's own (a test runner's
        capture), the given console."""
        try:
            real = self._own_stderr and sys.stderr.fileno() == 2
        except (AttributeError, OSError, ValueError):
            real = False
        if not real:
            return self._fallback
        if self._own is None:
            from rich.console import Console

            self._own = Console(file=os.fdopen(os.dup(2), "w", buffering=1), soft_wrap=True)
        return self._own

    @property
    def live(self) -> bool:
        return bool(self.console.is_terminal)

    def __call__(self, msg: str) -> None:
        from rich.markup import escape

        self.console.print(f"[bold cyan]{self.prefix}[/] {escape(msg)}", highlight=False, soft_wrap=True)

    @contextlib.contextmanager
    def step(self, what: str, *, total: int | None = None, unit: str = "", heartbeat_s: float = 60,
             announce: bool = True) -> Iterator[StepHandle]:
        if not self.live:
            with _plain_step(self, what, total, unit, heartbeat_s, announce) as handle:
                yield handle
            return
        from rich.markup import escape
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        with self._lock:
            if self._bars is None:
                self._bars = Progress(SpinnerColumn(), TextColumn("[bold cyan]{task.description}"),
                                      BarColumn(bar_width=24), TextColumn("{task.fields[where]}"),
                                      TimeElapsedColumn(), console=self.console, transient=True)
                self._bars.start()
            self._depth += 1
            bars = self._bars
        task = bars.add_task(escape(what), total=total, where="")
        handle = StepHandle(what, total, unit)

        def redraw() -> None:
            bars.update(task, completed=handle.done, where=escape(handle.where()))

        handle._changed = redraw  # type: ignore[method-assign]
        ok = False
        try:
            yield handle
            ok = True
        finally:
            bars.remove_task(task)
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    self._bars.stop()
                    self._bars = None
            where = handle.where()
            mark = "[green]done[/]" if ok else "[yellow]stopped[/]"
            self.console.print(f"[bold cyan]{self.prefix}[/] {escape(what)}: {mark}"
                               f"{' (' + escape(where) + ')' if where else ''} in {handle.elapsed():.1f} s",
                               highlight=False, soft_wrap=True)
