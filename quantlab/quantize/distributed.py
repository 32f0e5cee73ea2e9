"""`quantization.distributed: {nproc_per_node: N}`: llm-compressor's distributed oneshot,
one process per accelerator of this node under `torchrun` (torch's own launcher, not
ours), for a model whose calibration one device would take too long for.

Each rank runs quantize/distributed_rank.py: it joins the process group
(compressed_tensors.distributed.init_dist, which gives each rank the accelerator of its
local rank and uses NCCL on CUDA), then the same quantization as one process does;
llm-compressor splits the calibration samples across the ranks (it detects the same
dataset on every rank) and combines what they observed. Rank 0 writes the checkpoint and
its quantize.json; the others write nothing that stays.

It needs an accelerator: init_dist asks `torch.accelerator.current_accelerator()` for the
device of each rank, and a CPU has none (llm-compressor 0.14, compressed-tensors 0.15).
So the preflight refuses it on a host without N accelerators, naming the field. The
launch itself is torch's and works on a CPU with the gloo backend: `--check` runs each
rank's process-group handshake without quantizing (tests/integration/quantize/
test_distributed_launch.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from quantlab.core.errors import EngineError, RecipeError
from quantlab.core.layout import QUANTIZE_RESULT_FILE
from quantlab.core.process_death import die_with_parent

RANK_MODULE = "quantlab.quantize.distributed_rank"
DEADLINE_S = 12 * 3600  # the longest one distributed quantization may take
FIELD = "quantization.distributed.nproc_per_node"


def torchrun_argv(nproc: int, *rank_args: str, python: str | None = None) -> list[str]:
    """torchrun on this node (--standalone: its own rendezvous on a free local port), one
    process per accelerator, each running the rank module with `rank_args`."""
    return [python or sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", RANK_MODULE, *rank_args]


def check_devices(nproc: int, recipe_file: Path) -> None:
    """Refuse before any work where this host has fewer than `nproc` accelerators."""
    import torch

    acc = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    count = torch.accelerator.device_count() if acc is not None else 0
    if count >= nproc:
        return
    has = f"{count} {acc.type} device(s)" if acc is not None else "no accelerator (CPU only)"
    raise RecipeError(f"{FIELD} is {nproc}, and this host has {has}: llm-compressor's distributed oneshot runs one "
                      "process per accelerator (compressed_tensors.distributed.init_dist gives each rank the "
                      "device of its local rank; a CPU has none). Remove quantization.distributed to quantize in "
                      "one process (sequential onloading holds big models), or run on a node with that many GPUs",
                      file=str(recipe_file), field=FIELD)


def write_rank_recipe(loaded, folder: Path) -> Path:
    """The recipe as the ranks read it: its content (it may exist only in memory: a
    search's trial, a Ray task's) and its own path, against which its relative paths resolve."""
    from quantlab.core.fsutil import write_json_atomic

    path = folder / "distributed-recipe.json"
    write_json_atomic(path, {"recipe": loaded.recipe.model_dump(mode="json"), "path": str(loaded.path)})
    return path


def run_distributed(rank_recipe: Path, output: Path, nproc: int, *, log_file: Path | None,
                    deadline_s: float = DEADLINE_S) -> dict[str, Any]:
    """torchrun of the rank module, its output to `log_file`; waits within `deadline_s` (the
    whole process group is killed past it). Returns rank 0's quantize.json."""
    argv = torchrun_argv(nproc, str(rank_recipe), str(output))
    log = open(log_file, "a") if log_file else None  # noqa: SIM115 - closed below
    try:
        proc = subprocess.Popen(argv, stdout=log or subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, env=dict(os.environ),
                                preexec_fn=die_with_parent if os.name == "posix" else None)  # never orphaned
        try:
            rc = proc.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise EngineError(f"distributed quantization ({nproc} ranks) did not finish within {deadline_s:.0f} s; "
                              "every rank was stopped") from None
        except BaseException:  # Ctrl-C, SIGTERM: every rank goes
            _kill_group(proc)
            raise
    finally:
        if log:
            log.close()
        rank_recipe.unlink(missing_ok=True)  # the recipe's serve.env and engine args: not left in the run folder
    where = f" (its output: {log_file})" if log_file else ""
    if rc != 0:
        raise EngineError(f"distributed quantization ({nproc} ranks under torchrun) failed with exit code {rc}{where}")
    result = output / QUANTIZE_RESULT_FILE
    if not result.is_file():
        raise EngineError(f"distributed quantization finished but rank 0 wrote no {QUANTIZE_RESULT_FILE}{where}")
    return json.loads(result.read_text())


def _kill_group(proc: subprocess.Popen) -> None:
    import signal

    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        end = time.monotonic() + wait
        while time.monotonic() < end and proc.poll() is None:
            time.sleep(0.1)
        if proc.poll() is not None:
            return
