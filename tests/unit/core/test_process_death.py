"""A child started with die_with_parent in its own session (the lm-eval child, engines)
dies when quantlab is killed outright (SIGKILL, the OOM killer, a forced Ray cancel): the
kernel's parent-death signal reaches it though no handler of the parent ran."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

PARENT = """
import subprocess, sys, time
from quantlab.core.process_death import die_with_parent
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                         start_new_session=True, preexec_fn=die_with_parent)
print(child.pid, flush=True)
time.sleep(120)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead: it waits only for its reaper
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's prctl")
def test_a_child_in_its_own_session_dies_when_its_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child), "the child outlived its killed parent"
    finally:
        parent.kill()
        if "child" in locals() and alive(child):
            os.kill(child, signal.SIGKILL)


def test_the_lm_eval_child_is_started_to_die_with_quantlab(monkeypatch, tmp_path):
    """run_tasks starts its child in a new session (its group killed when it stops) with the
    parent-death signal (its sandboxes die with it in turn: bwrap --die-with-parent)."""
    from quantlab.core.process_death import die_with_parent
    from quantlab.quality import lmeval
    from quantlab.quality.samples import Docs

    seen = {}

    def popen(argv, **kwargs):
        seen.update(kwargs, argv=argv)
        raise OSError("not started: the test reads how it would be")

    monkeypatch.setattr(lmeval.subprocess, "Popen", popen)
    with pytest.raises(OSError, match="not started"):
        lmeval.run_tasks(tasks=["t"], base_url="http://127.0.0.1:9/v1", served_name="m", tokenizer=None,
                         suite_dir=None, out_dir=tmp_path, log_path=tmp_path / "lmeval.log", seed=0,
                         docs={"t": Docs(0, 1)}, num_concurrent=1, request_timeout_s=5, max_retries=0, deadline_s=5,
                         offline=True, trust_remote_code=False, progress=lambda m: None)
    assert seen["start_new_session"] is True and seen["preexec_fn"] is die_with_parent
    assert seen["argv"][1:3] == ["-m", "quantlab.quality.lmeval"]
