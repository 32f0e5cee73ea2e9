"""One role's slice evaluated at one load: lm-eval's child (the quality stage's own, so every
answer is scored as the quality stage scores it) sends through the load shaper, which holds
the point's discipline upstream and times each request; the rows and the records are kept
in the run folder and joined (load_quality/answers.py)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantlab.core.errors import EngineError
from quantlab.core.fsutil import write_text_atomic
from quantlab.core.stage_context import StageContext
from quantlab.load_quality.answers import RunAnswers, busy_seconds, join
from quantlab.quality.samples import Docs
from quantlab.quality.suites import Suite
from quantlab.quality.work import code_sandbox, tokenizer_dir

RECORDS_FILE = "requests.jsonl"


@dataclass(frozen=True)
class Load:
    """Where one evaluation runs: a point's name and its discipline (closed loop at
    `concurrency`, or Poisson arrivals at `rate` per second)."""

    name: str
    concurrency: int | None = None
    rate: float | None = None

    @property
    def label(self) -> str:
        return f"{self.concurrency} in flight" if self.concurrency else f"{self.rate:g}/s Poisson"


def queued(load: Load, open_loop_queue: int, timeout_s: float) -> int:
    """lm-eval's own requests in flight towards the shaper: enough that the shaper always has
    one waiting. Closed loop: twice the point's, at least 2 so lm-eval takes its tagged
    concurrent path. Open loop: the section's queue, but no more than arrive in half of
    lm-eval's request timeout, which counts the wait at the shaper (a longer queue would time
    requests out while they wait for their arrival time, and lm-eval would ask them again)."""
    if load.concurrency:
        return max(2, 2 * load.concurrency)
    return max(2, min(open_loop_queue, int(load.rate * timeout_s / 2)))


def evaluate(ctx: StageContext, role: str, work: list[tuple[Suite, Any]], docs: dict[str, Docs], load: Load,
             out: Path, *, tasks: dict[str, tuple[str, str | None]], log_path: Path,
             said: Callable[[str], None] = lambda line: None, stop: threading.Event | None = None) -> RunAnswers:
    """`work` (suite, task) on `role`'s server at `load`: each task's `docs`; the samples and the
    shaper's records under `out`; `said`: lm-eval's progress lines (a task started, done); `stop`:
    give up (the other role's evaluation at the same time failed: core/together).
    Raises EngineError when the server dies or lm-eval fails."""
    from quantlab.load_quality.discipline import Discipline
    from quantlab.load_quality.shaper import Shaper
    from quantlab.quality.lmeval import read_samples, run_tasks

    spec = ctx.recipe.load_quality
    quality = ctx.recipe.quality
    server = ctx.engine(role)
    out.mkdir(parents=True, exist_ok=True)
    discipline = Discipline(concurrency=load.concurrency, rate=load.rate, seed=quality.seed)
    groups: dict[str, dict[bool, list[str]]] = {}
    folders: dict[str, Path | None] = {}
    for suite, task in work:
        groups.setdefault(suite.name, {False: [], True: []})[task.api == "chat"].append(task.task)
        folders[suite.name] = suite.folder
    records: list[Any] = []
    busy = 0.0  # summed per shaper: each one's clock starts at 0
    started = time.monotonic()
    for suite_name, by_api in groups.items():
        left = spec.timeout_s - (time.monotonic() - started)
        if left <= 0:
            raise EngineError(f"load_quality: {role} at {load.name} did not finish within load_quality.timeout_s "
                              f"({spec.timeout_s:g} s); raise it or lower load_quality.items")
        with Shaper(server.base_url, discipline, timeout_s=quality.request_timeout_s) as shaper:
            run_tasks(tasks=by_api[False], chat_tasks=by_api[True], base_url=shaper.base_url,
                      served_name=server.served_name, tokenizer=str(tokenizer_dir(ctx, role)),
                      suite_dir=folders[suite_name], out_dir=out, log_path=log_path, seed=quality.seed, docs=docs,
                      num_concurrent=queued(load, spec.num_concurrent, quality.request_timeout_s),
                      request_timeout_s=quality.request_timeout_s, max_retries=quality.max_retries,
                      deadline_s=left, offline=folders[suite_name] is not None,
                      trust_remote_code=ctx.recipe.model.trust_remote_code, progress=said,
                      code_sandbox=code_sandbox(ctx), tag_requests=True,
                      is_alive=lambda s=server: s.proc is None or s.proc.poll() is None, stop=stop)
            mine = shaper.records()
            busy += busy_seconds([(r.sent_at, r.sent_at + r.e2e) for r in mine if r.e2e is not None])
            records += mine
        server.ensure_alive(f"during the load_quality evaluation at {load.name}")
    write_text_atomic(out / RECORDS_FILE, "".join(json.dumps(r.as_row(), default=str) + "\n" for r in records))
    read = {task: read_samples(out, task) for task in tasks}
    got = join({task: rows for task, (rows, _) in read.items()}, tasks, records, busy_s=busy)
    got.lm_eval = next((summary.get("lm_eval") for _, summary in read.values() if summary.get("lm_eval")), None)
    return got
