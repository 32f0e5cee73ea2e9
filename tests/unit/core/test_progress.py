"""What the terminal shows: plain lines where output is not a terminal (CI logs), a bar
that ends as one line on a terminal, and the server start-up phase read from its log."""

from __future__ import annotations

import io
import re
import time

import pytest
from rich.console import Console

from quantlab.serving.engine_log import startup_phase
from quantlab.core.progress import TerminalProgress, step


def test_plain_steps_are_start_detail_heartbeat_and_end_lines():
    lines: list[str] = []
    with step(lines.append, "quality candidate: lm-eval", total=3, unit="tasks", heartbeat_s=0.05) as bar:
        bar.detail("[1/3] ql_lastword 150 samples 13.9s", done=1)
        time.sleep(0.12)
        bar.advance()
    assert lines[0] == "quality candidate: lm-eval ..."
    assert lines[1] == "[1/3] ql_lastword 150 samples 13.9s"
    beats = lines[2:-1]
    assert beats and all(re.fullmatch(r"quality candidate: lm-eval: 1/3 tasks, \d+ s", b) for b in beats), lines
    # the heartbeat says how far and how long, not the detail line again
    assert re.fullmatch(r"quality candidate: lm-eval: done \(2/3 tasks\) in \d+\.\d s", lines[-1]), lines[-1]


def test_a_heartbeat_shows_a_note_that_was_not_printed():
    lines: list[str] = []
    with step(lines.append, "baseline server start", heartbeat_s=0.05, announce=False) as bar:
        bar.update(note="compiling and warming up")
        time.sleep(0.12)
    assert any(re.fullmatch(r"baseline server start: compiling and warming up, \d+ s", x) for x in lines), lines


def test_a_step_that_raises_says_stopped():
    lines: list[str] = []
    with pytest.raises(RuntimeError), step(lines.append, "baseline server start", announce=False):
        raise RuntimeError("boom")
    assert len(lines) == 1 and lines[0].startswith("baseline server start: stopped in ")


def test_not_a_terminal_gives_plain_lines_without_escape_codes():
    buf = io.StringIO()
    progress = TerminalProgress(Console(file=buf, force_terminal=False, width=200), own_stderr=False)
    progress("run directory: runs/x [1]")
    with step(progress, "stability candidate", total=2, unit="probes", announce=False) as bar:
        bar.detail("stability candidate: bad requests")
        bar.advance()
    out = buf.getvalue()
    assert "\x1b[" not in out
    assert out.splitlines()[0] == "quantlab run directory: runs/x [1]"
    assert out.splitlines()[1] == "quantlab stability candidate: bad requests"
    assert re.match(r"quantlab stability candidate: done \(1/2 probes\) in \d", out.splitlines()[2])


def test_a_terminal_draws_a_bar_and_keeps_one_line_per_step():
    buf = io.StringIO()
    progress = TerminalProgress(Console(file=buf, force_terminal=True, width=120), own_stderr=False)
    with step(progress, "oneshot gptq", total=30, unit="layers calibrated") as bar:
        bar.update(done=12)
        time.sleep(0.2)  # the live display redraws
    out = buf.getvalue()
    assert "oneshot gptq" in out and "12/30 layers calibrated" in out
    assert re.search(r"oneshot gptq: .*done.* \(30/30|oneshot gptq: .*done.* \(12/30", out)


@pytest.mark.parametrize("tail, phase", [
    ("", None),
    ("INFO [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config", "initializing the engine"),
    ("Initializing a V1 LLM engine\n[cpu_model_runner.py:68] Starting to load model /m...", "loading weights"),
    ("Starting to load model\nLoading weights took 0.16 seconds\n"
     "[cpu_model_runner.py:87] Warming up model for the compilation...", "compiling and warming up"),
    ("Warming up model for the compilation...\nWarming up done.\n"
     "CPU KV cache size: 46,592 tokens, Maximum concurrency", "allocating the KV cache"),
    ("CPU KV cache size: 1 tokens\ninit engine (profile, create kv cache, warmup model) took 61.55 s",
     "starting the API server"),
])
def test_startup_phase_from_real_log_lines(tail, phase):
    assert startup_phase(tail) == phase


REAL_START = """\
(APIServer pid=14935) INFO 11-30 06:38:44 [utils.py:253] non-default args: {'model': '/m', 'max_model_len': 2048}
(EngineCore pid=15139) INFO 11-30 06:38:57 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='/m'
(Worker pid=15176) INFO 11-30 06:39:03 [cpu_model_runner.py:68] Starting to load model /m...
Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00,  6.57it/s]
(Worker pid=15176) INFO 11-30 06:39:04 [default_loader.py:501] Loading weights took 0.16 seconds
(Worker pid=15176) INFO 11-30 06:39:04 [cpu_model_runner.py:87] Warming up model for the compilation...
(Worker pid=15176) INFO 11-30 06:40:04 [cpu_model_runner.py:91] Warming up done.
(EngineCore pid=15139) INFO 11-30 06:40:04 [kv_cache_utils.py:2327] CPU KV cache size: 46,592 tokens, Maximum \
concurrency for 2,048 tokens per request: 22.75x
(EngineCore pid=1) INFO 11-30 06:40:06 [core.py:402] init engine (profile, create kv cache, warmup model) took 61.55 s
(APIServer pid=14935) INFO 11-30 06:40:07 [entry.py:140] Starting vLLM server on http://127.0.0.1:54145
INFO:     Application startup complete.
"""


def test_startup_breakdown_from_log_timestamps():
    from quantlab.serving.engine_log import parse_engine_log, startup_breakdown

    assert startup_breakdown(REAL_START) == {
        "before the engine": 13.0, "initializing the engine": 6.0, "loading weights": 1.0,
        "compiling and warming up": 60.0, "allocating the KV cache": 2.0, "starting the API server": 1.0}
    assert parse_engine_log(REAL_START)["startup_phases_s"]["compiling and warming up"] == 60.0
    assert startup_breakdown("no timestamps here\nStarting to load model") == {}
