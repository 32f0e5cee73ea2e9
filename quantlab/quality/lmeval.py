"""lm-eval against a served model, in a child process: the child runs one suite's tasks
(one task at a time, so a failure names its task) through `local-completions` or
`local-chat-completions` with log_samples, and writes per-task sample files; the parent
streams its progress lines, keeps lm-eval's own output in a log file, and enforces a
deadline. Usage of the child: python -m quantlab.quality.lmeval SPEC.json
"""

from __future__ import annotations

import contextvars
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quantlab.core.engine_time import engine_busy
from quantlab.core.errors import EngineError
from quantlab.core.process_death import die_with_parent
from quantlab.core.together import Stopped
from quantlab.quality.request_keys import PAYLOAD_FIELD, key_of, keys_of_arguments
from quantlab.quality.sample_format import compact_sample
from quantlab.quality.samples import Docs
from quantlab.quality.sandbox import ENV_VAR as SANDBOX_ENV
from quantlab.serving import api_keys

PROGRESS = "QUANTLAB-EVAL "  # prefix of the child's progress lines on stdout
FAILED_FILE = "failed.json"


def lm_eval_version() -> str | None:
    import lm_eval

    return getattr(lm_eval, "__version__", None)


def api_model(part: dict[str, Any]) -> Any:
    """lm-eval's API model for one part of the spec (completions or chat), perplexity
    documents scored together on the completions one (lmeval_rolling)."""
    from lm_eval.api.registry import get_model

    from quantlab.quality.lmeval_rolling import batch_rolling_requests

    lm = get_model(part["model"]).create_from_arg_obj(part["model_args"])
    return lm if part["chat"] else batch_rolling_requests(lm)


# the cache keys of the request being built, set per asyncio task by amodel_call
_SENDING: contextvars.ContextVar[list | None] = contextvars.ContextVar("quantlab_sending_keys", default=None)


def tag_payloads(lm: Any) -> Any:
    """Make this lm-eval API model put the keys of each request it sends (quality/request_keys)
    in the payload's PAYLOAD_FIELD. lm-eval's async path hands `amodel_call` the request's
    cache keys and builds the payload inside it: the keys ride a context variable (each
    request is its own asyncio task) from the one to `_create_payload`. The sync path
    (num_concurrent 1) has no keys: tag_flag refuses tagging there."""
    call, create = lm.amodel_call, lm._create_payload

    async def amodel_call(*args: Any, cache_keys: list | None = None, **kwargs: Any) -> Any:
        token = _SENDING.set(cache_keys)
        try:
            return await call(*args, cache_keys=cache_keys, **kwargs)
        finally:
            _SENDING.reset(token)

    def create_payload(*args: Any, **kwargs: Any) -> dict:
        payload = create(*args, **kwargs)
        payload[PAYLOAD_FIELD] = [key_of(k) for k in _SENDING.get() or [] if k is not None]
        return payload

    lm.amodel_call, lm._create_payload = amodel_call, create_payload
    return lm


def sample_rows(samples: list[dict[str, Any]], tagged: bool) -> list[dict[str, Any]]:
    """The rows written for one task's samples; tagged: each with its requests' keys."""
    if not tagged:
        return [compact_sample(s) for s in samples]
    return [{**compact_sample(s), "request_keys": keys_of_arguments(s.get("arguments"))} for s in samples]


def _child(spec_path: str) -> int:
    import lm_eval
    from lm_eval.tasks import TaskManager

    spec = json.loads(Path(spec_path).read_text())
    out = Path(spec["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    tm = TaskManager(include_path=spec.get("include_path"), include_defaults=spec.get("include_defaults", False))
    # one process for both APIs: lm-eval's start-up (imports, task index) is paid once
    work = [(part, task) for part in spec["parts"] for task in part["tasks"]]
    models: dict[bool, Any] = {}
    for i, (part, task) in enumerate(work, 1):
        if part["chat"] not in models:
            models[part["chat"]] = api_model(part)
            if spec.get("tag_requests"):
                tag_payloads(models[part["chat"]])
        lm = models[part["chat"]]
        print(f"{PROGRESS}start {i}/{len(work)} {task}", flush=True)
        t0 = time.monotonic()
        try:
            r = lm_eval.simple_evaluate(model=lm, tasks=[task], task_manager=tm, log_samples=True,
                                        **lm_eval_docs(task, (spec.get("docs") or {}).get(task)),
                                        random_seed=spec["seed"],
                                        numpy_random_seed=spec["seed"], torch_random_seed=spec["seed"],
                                        fewshot_random_seed=spec["seed"], bootstrap_iters=0,
                                        apply_chat_template=part["chat"], fewshot_as_multiturn=part["chat"],
                                        confirm_run_unsafe_code=bool(spec.get("code_sandbox")))
        except BaseException as err:  # noqa: BLE001 (reported to the parent, then re-raised)
            said = f"{type(err).__name__}: {err}"
            if "marked as unsafe" in said:  # lm-eval's own refusal of a task that runs model code
                said += (" (quantlab runs model code only in its sandbox, for a suite task marked unsafe_code with "
                         "quality.allow_code_execution: true; a hub task would run it inside lm-eval's process)")
            (out / FAILED_FILE).write_text(json.dumps({"task": task, "error": said}))
            raise
        rows = sample_rows(r["samples"][task], bool(spec.get("tag_requests")))
        tmp = out / f".{task}.jsonl.tmp"
        tmp.write_text("".join(json.dumps(row, default=str) + "\n" for row in rows))
        tmp.replace(out / f"{task}.jsonl")
        summary = {"task": task, "results": r["results"].get(task, {}),
                   "higher_is_better": r.get("higher_is_better", {}).get(task, {}),
                   "n_samples": len(rows), "seconds": time.monotonic() - t0,
                   "lm_eval": lm_eval.__version__ if hasattr(lm_eval, "__version__") else None}
        (out / f"{task}.summary.json").write_text(json.dumps(summary, default=str))
        print(f"{PROGRESS}done {i}/{len(work)} {task} {len(rows)} samples "
              f"{time.monotonic() - t0:.1f}s", flush=True)
    return 0


def lm_eval_docs(task: str, pair: list[int | None] | None) -> dict[str, Any]:
    """lm-eval's arguments for one task's documents (quality/samples.Docs as JSON; None: all).
    From the first document, its `limit`: lm-eval stops at the task's last document, so a
    hub task quantlab could not count is asked for at most that many; from a later one (a
    look of evaluate-until-decided, within what the baseline answered), its `samples`, the
    doc indices themselves. Either way the same documents and doc ids; a random few-shot
    sampler draws per run in document order, so a later look's prompts equal the whole
    run's only with `first_n` or no few-shot (the shipped suites')."""
    docs = Docs.from_json(pair) if pair is not None else Docs()
    if docs.stop is not None and docs.stop <= docs.start:
        raise ValueError(f"task {task}: no documents to evaluate ({docs.start}..{docs.stop}); lm-eval reads "
                         "a limit of 0 as every document")
    if docs.start == 0:
        return {"limit": docs.stop, "samples": None}
    if docs.stop is None:
        raise ValueError(f"task {task}: documents from {docs.start} on need an end (lm-eval cannot count them here)")
    return {"limit": None, "samples": {task: list(range(docs.start, docs.stop))}}


def tag_flag(tag_requests: bool, num_concurrent: int) -> dict[str, Any]:
    """The spec's flag for tagged requests: every payload carries its requests' keys and every
    sample row its `request_keys` (quality/request_keys; the load shaper joins timings to
    answers by them). Only lm-eval's async path hands over the keys: num_concurrent >= 2.
    Untagged, the spec stays as it was."""
    if not tag_requests:
        return {}
    if num_concurrent < 2:
        raise ValueError("tagging requests needs lm-eval's concurrent path (num_concurrent >= 2), "
                         f"got {num_concurrent}")
    return {"tag_requests": True}


def run_tasks(*, tasks: list[str], chat_tasks: list[str] | None = None, base_url: str, served_name: str,
              tokenizer: str | None, suite_dir: Path | None, out_dir: Path, log_path: Path, seed: int,
              docs: dict[str, Docs] | None = None, num_concurrent: int,
              request_timeout_s: float, max_retries: int,
              deadline_s: float, offline: bool, trust_remote_code: bool, progress: Callable[[str], None],
              is_alive: Callable[[], bool] = lambda: True, stop: threading.Event | None = None,
              code_sandbox: str | None = None, tag_requests: bool = False) -> None:
    """Run `tasks` (completions API) then `chat_tasks` (chat completions API, the model's
    chat template) against a served model, in one lm-eval process; per-task sample files
    land in out_dir. `docs`: each task's documents (quality/samples.py; a task not in it:
    all of them). `stop` set (another role's evaluation failed, the run was
    interrupted): the child is killed within a second and `Stopped` raised. `code_sandbox`: the
    kind model code runs in (quality/sandbox.py), for a local suite only; None: lm-eval refuses
    every task marked unsafe_code (a hub task's code would run inside lm-eval's own process).
    `tag_requests`: payloads and sample rows carry their requests' keys (`tag_flag`)."""
    # the child runs in the suite folder (task YAML name their data relative to it): absolute paths only
    out_dir, log_path = Path(out_dir).resolve(), Path(log_path).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)

    def part(names: list[str], chat: bool) -> dict[str, Any]:
        model_args: dict[str, Any] = {
            "base_url": f"{base_url}/v1/{'chat/completions' if chat else 'completions'}",
            "model": served_name, "num_concurrent": num_concurrent, "max_retries": max_retries,
            "timeout": request_timeout_s, "seed": seed,
        }
        if not chat:
            model_args.update(tokenizer=tokenizer, tokenizer_backend="huggingface",
                              trust_remote_code=trust_remote_code)
        return {"model": "local-chat-completions" if chat else "local-completions", "model_args": model_args,
                "tasks": list(names), "chat": chat}

    spec = {"parts": [part(names, chat) for names, chat in ((tasks, False), (chat_tasks or [], True)) if names],
            "seed": seed, "docs": {task: d.to_json() for task, d in (docs or {}).items()}, "out_dir": str(out_dir),
            "code_sandbox": code_sandbox if suite_dir is not None else None,
            "include_path": str(suite_dir) if suite_dir else None, "include_defaults": suite_dir is None,
            **tag_flag(tag_requests, num_concurrent)}
    spec_path = out_dir / "lmeval-spec.json"
    spec_path.write_text(json.dumps(spec, indent=2))
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    # lm-eval's local-completions sends OPENAI_API_KEY as its bearer token: the server's own
    # key (serving/api_keys), through the child's environment, never the spec file; and no
    # key of the user's for another service where the server has none
    env.pop("OPENAI_API_KEY", None)
    key = api_keys.key_for(base_url)
    if key:
        env["OPENAI_API_KEY"] = key
    if offline:
        env.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    env.pop(SANDBOX_ENV, None)  # only the run's own choice reaches the scorers
    if spec["code_sandbox"]:
        env[SANDBOX_ENV] = spec["code_sandbox"]
    (out_dir / FAILED_FILE).unlink(missing_ok=True)
    started = time.monotonic()
    with engine_busy(), open(log_path, "a") as log:
        proc = subprocess.Popen([sys.executable, "-m", "quantlab.quality.lmeval", str(spec_path)],
                                cwd=suite_dir or out_dir, env=env, stdout=subprocess.PIPE, stderr=log, text=True,
                                start_new_session=True, preexec_fn=die_with_parent)  # its sandboxes die with it
        try:
            _follow(proc, log, started, deadline_s, progress, is_alive, stop)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
    if proc.returncode != 0:
        failed = out_dir / FAILED_FILE
        if failed.is_file():
            what = json.loads(failed.read_text())
            raise EngineError(f"lm-eval failed on task '{what['task']}' against {base_url} ({served_name}): "
                              f"{what['error'][:800]}\nlm-eval log: {log_path}")
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-12:]) if log_path.is_file() else ""
        raise EngineError(f"lm-eval exited with code {proc.returncode} before its first task against {base_url} "
                          f"({served_name}). Last lines of {log_path}:\n{tail}")


def _follow(proc, log, started: float, deadline_s: float, progress, is_alive, stop) -> None:
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    while True:
        if stop is not None and stop.is_set():
            raise Stopped("lm-eval stopped: the other role's evaluation failed or the run was interrupted")
        if time.monotonic() - started > deadline_s:
            raise EngineError(f"lm-eval did not finish within its deadline of {deadline_s:g} s "
                              "(quality.timeout_s); raise it or lower quality.limit")
        if not is_alive():
            raise EngineError("the server died during the evaluation")
        if sel.select(timeout=1.0):
            line = proc.stdout.readline()
            if not line:
                proc.wait(timeout=60)
                return
            if line.startswith(PROGRESS):
                progress(line[len(PROGRESS):].strip())
            else:
                log.write(line)
        elif proc.poll() is not None:
            rest = proc.stdout.read()
            if rest:
                log.write(rest)
            return


def read_samples(out_dir: Path, task: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rows = [json.loads(x) for x in (out_dir / f"{task}.jsonl").read_text().splitlines() if x.strip()]
    return rows, json.loads((out_dir / f"{task}.summary.json").read_text())


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))
