"""A child process that dies with its parent, so no engine or launcher outlives quantlab."""

from __future__ import annotations

import signal


def die_with_parent() -> None:
    """preexec_fn: on Linux, SIGTERM this child if the quantlab process dies (even by
    SIGKILL, or a Ray worker force-killed), so it is never orphaned; the child then stops
    its own children."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: the context managers and the CLI's SIGTERM handler still stop it
