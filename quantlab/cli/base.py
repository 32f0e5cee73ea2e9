"""The `quantlab` command line: parse, call the pipeline, map errors to exit codes.

Exit codes: 0 released/ok, 1 blocked by a gate, 2 bad input, 3 engine or run failure
(an unexpected error too: one line here, the traceback in a file), 130 interrupted
(Ctrl-C or SIGTERM). The commands are in cli/*_commands.py; they call quantlab.pipeline (and
search) only; engines are imported lazily
so --help and `recipes check` are instant.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from quantlab.core.shipped import RECIPES
from quantlab.core.version import __version__

from quantlab.core import cpu_emulation
from quantlab.core.errors import QuantlabError
from quantlab.core.progress import TerminalProgress

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Quantize an LLM from a recipe, serve it on vLLM, and gate its release.")
recipes_app = typer.Typer(no_args_is_help=True, help="Validate, list and describe recipe files.")
app.add_typer(recipes_app, name="recipes")

out = Console()
err = Console(stderr=True)
SHIPPED_RECIPES = RECIPES


# One line per message; long steps are bars on a terminal and plain lines in CI logs.
progress = TerminalProgress(err)


def _crash_log(err: BaseException) -> Path:
    from quantlab.core.fsutil import write_text_atomic
    from quantlab.core.layout import cache_dir

    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    path = cache_dir() / "logs" / f"crash-{stamp}.txt"
    write_text_atomic(path, "".join(traceback.format_exception(err)))
    return path


@contextlib.contextmanager
def exit_codes() -> Iterator[None]:
    """Map every way a command can end to the exit codes docs/cli.md lists."""
    try:
        yield
    except typer.Exit:
        raise
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]")
        raise typer.Exit(130) from None
    except QuantlabError as e:
        err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        raise typer.Exit(e.exit_code) from None
    except Exception as e:  # a bug or an unforeseen engine failure: a run failure, never "blocked"
        try:
            where = f"traceback in {_crash_log(e)}"
        except OSError as log_err:
            where = f"traceback could not be written: {log_err}"
        line = "".join(traceback.format_exception_only(type(e), e)).strip().splitlines()[-1]
        err.print(f"[bold red]error:[/] unexpected {escape(line)} ({escape(where)})", highlight=False, soft_wrap=True)
        raise typer.Exit(3) from None


def _version(value: bool) -> None:
    if value:
        out.print(f"quantlab {__version__}")
        raise typer.Exit(0)


def _sigterm_as_interrupt() -> None:
    import signal

    def handler(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """An old name in a recipe, a cached entry not reused: one line for the user, not a Python warning."""
    from quantlab.core.result_cache import CacheEntryWarning
    from quantlab.core.verdicts import OldNameWarning

    if issubclass(category, (OldNameWarning, CacheEntryWarning)):
        if str(message) in _shown:  # one entry looked up by two steps (the dry run's reuse and plan) is said once
            return
        _shown.add(str(message))
        err.print(f"[yellow]warning:[/] {escape(str(message))}", highlight=False, soft_wrap=True)
    else:
        _python_showwarning(message, category, filename, lineno, file, line)


_python_showwarning = warnings.showwarning
_shown: set[str] = set()  # the user's warnings said in this command


@app.callback()
def main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                               help="Print the version and exit.")] = False) -> None:
    _sigterm_as_interrupt()  # a stopped CI job still stops the servers it started
    warnings.showwarning = _show_warning  # set when a command runs, not when the module is imported
    with exit_codes():  # QUANTLAB_EMULATE_CPU: torch's limits must be set before torch loads
        cpu_emulation.apply(os.environ)


        # Ctrl-C is how a foreground server is meant to end: a clean stop exits 0.


if __name__ == "__main__":
    app()
