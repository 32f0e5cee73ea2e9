"""Where llm-compressor's and the model libraries' own output goes: collected as warnings,
written to a log file in the run folder, or kept quiet."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path


from quantlab.core.errors import RecipeError


@contextlib.contextmanager
def engine_warnings() -> Iterator[list[str]]:
    """Warnings llm-compressor logs (through loguru) while it runs."""
    from loguru import logger

    found: list[str] = []
    sink_id = logger.add(lambda message: found.append(message.record["message"][:500]),
                         level="WARNING", format="{message}",
                         filter=lambda r: r["level"].name in ("WARNING", "ERROR", "CRITICAL"))  # not METRIC
    try:
        yield found
    finally:
        logger.remove(sink_id)


@contextlib.contextmanager
def output_to_file(log_file: Path | None) -> Iterator[None]:
    """Send what the engine prints (llm-compressor's per-module INFO lines on stdout,
    progress bars and library warnings on stderr) to `log_file` instead of the terminal.
    File descriptors are redirected, so output from C extensions goes there too.
    None: leave the terminal alone (--verbose)."""
    if log_file is None:
        yield
        return
    log_file.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (*saved, fd):
            os.close(f)


@contextlib.contextmanager
def engine_quiet() -> Iterator[list[str]]:
    """llm-compressor kept off the terminal where there is no run folder to log into (a
    recipe check): its console sink removed for the block, its warnings collected, each
    once, for the caller to show as notes."""
    with output_to_file(Path(os.devnull)):  # importing llm-compressor already logs (device warnings)
        from llmcompressor.logger import LoggerConfig, configure_logger
    configure_logger(LoggerConfig(console_log_level=None))
    unique: list[str] = []
    try:
        with engine_warnings() as found:
            yield unique
    finally:
        configure_logger(LoggerConfig())
        unique.extend(dict.fromkeys(found))


@contextlib.contextmanager
def llmcompressor_log(log_file: Path | None) -> Iterator[None]:
    """llm-compressor's loguru lines (one per module, on stdout) into `log_file` for the
    whole quantize step; its default console logging is restored afterwards."""
    if log_file is None:
        yield
        return
    from loguru import logger

    existed = log_file.exists()
    with output_to_file(log_file):  # importing llm-compressor already logs (device warnings)
        from llmcompressor.logger import LoggerConfig, configure_logger
    configure_logger(LoggerConfig(console_log_level=None))  # removes the stdout sink
    sink = logger.add(str(log_file), level="INFO", format="{time:YYYY-MM-DDTHH:mm:ss.SSS} | {function} | {level} - "
                      "{message}")
    try:
        yield
    except RecipeError:
        if not existed:  # bad input, caught before the engine ran: leave nothing behind
            logger.remove(sink)
            sink = None
            log_file.unlink(missing_ok=True)
        raise
    finally:
        if sink is not None:
            logger.remove(sink)
        configure_logger(LoggerConfig())
