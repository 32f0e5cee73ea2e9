"""Running untrusted code (a model's program, a user's scorer) in a separate Python
process: isolated mode (`-I`: no user site, no PYTHON* variables, no script folder on the
path), an empty temporary working folder, no stdin, and a deadline. Never in the
evaluating process."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from dataclasses import dataclass


@dataclass(frozen=True)
class Outcome:
    ok: bool  # exited 0 within the deadline
    timed_out: bool
    stdout: str
    stderr: str


def run_python(program: str, *, timeout_s: float, args: tuple[str, ...] = (), stdin: str | None = None) -> Outcome:
    with tempfile.TemporaryDirectory() as tmp:
        try:
            r = subprocess.run([sys.executable, "-I", "-c", program, *args], cwd=tmp, capture_output=True,
                               text=True, timeout=timeout_s, input=stdin,
                               stdin=subprocess.DEVNULL if stdin is None else None)
        except subprocess.TimeoutExpired as err:
            out = err.stdout.decode(errors="replace") if isinstance(err.stdout, bytes) else (err.stdout or "")
            return Outcome(False, True, out, f"no result within {timeout_s:g} s")
    return Outcome(r.returncode == 0, False, r.stdout, r.stderr)
