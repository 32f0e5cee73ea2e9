"""Error hierarchy. Each error maps to one CLI exit code (see design: 0 released,
1 blocked by a gate, 2 bad input, 3 engine/run failure)."""

from __future__ import annotations


class QuantlabError(Exception):
    """Base class. The message must say what was found, what was expected and how
    to fix it, naming the file and the field where there is one."""

    exit_code = 3


class RecipeError(QuantlabError):
    """Bad input: a recipe, a data file, a model source, a failed preflight."""

    exit_code = 2

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None):
        self.file = file
        self.field = field
        self.message = message  # without the file/field prefix
        where = ", ".join(p for p in (file, f"field '{field}'" if field else None) if p)
        super().__init__(f"{where}: {message}" if where else message)


class EngineError(QuantlabError):
    """An engine (llm-compressor, vLLM, lm-eval) failed while running. `cause` is the
    one-line reason where it could be told (a server's log diagnosed), for the record
    and the report; the message carries it too, with the details."""

    exit_code = 3

    def __init__(self, message: str, *, cause: str | None = None):
        self.cause = cause
        super().__init__(message)


class IntegrityError(EngineError):
    """Files are not those recorded for them: a checkpoint that changed after it was recorded
    (added, missing or changed files), or a result read back from shared storage or a shared
    cache that is not what its writer handed back. Nothing is signed or reused from them."""


class CheckError(QuantlabError):
    """A check could not produce a result."""

    exit_code = 3


class GateFailure(QuantlabError):
    """A release gate blocked the candidate."""

    exit_code = 1
