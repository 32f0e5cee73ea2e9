"""A release as the release stage makes one, without an engine: a registered gate set
(release/registration.register, signed), gate verdicts from each check's own gate
functions on measurements built here (quality comparisons of answers, performance
repeats of request records, stability probe summaries, the serve kernel path), the
decision, ledger, manifest, model-signing signature and in-toto attestation, all from
quantlab's functions. `resign` is what a key holder can do after editing it."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from quantlab.core.layout import MANIFEST_FILE
from quantlab.core.provenance import quantlab_identity
from quantlab.core.run import RunDir
from quantlab.core.shipped import RECIPES
from quantlab.performance import gates as perf_gates
from quantlab.performance.metrics import RequestRecord, summarize
from quantlab.performance.noise import RepeatSample
from quantlab.performance.result import Measured, load_points, points_of
from quantlab.pipeline.context import RunContext
from quantlab.recipe.stream import OFF, StreamDecision, recipe_alpha
from quantlab.quality import gates as quality_gates
from quantlab.quality.compare import compare_task, paired_values
from quantlab.quality.pairing import pool_everything, pool_slices
from quantlab.recipe.file import LoadedRecipe, load_recipe
from quantlab.release.attestation import planned, write_attestation
from quantlab.release.decision import decide, policy_for
from quantlab.release.error_budget import ledger
from quantlab.release.manifest import (Manifest, Signer, folder_files, generate_keypair, public_key_fingerprint,
                                       read_manifest, sign_folder)
from quantlab.release.registration import copy_into, register
from quantlab.serving import gates as serve_gates
from quantlab.stability import gates as stability_gates

TASKS = ["ql_lastword", "ql_knowledge_mc", "ql_arithmetic"]  # two share the knowledge slice: a slice gate too


@dataclass
class Release:
    folder: Path
    private_key: Path
    public_key: Path

    def manifest(self) -> dict[str, Any]:
        return json.loads((self.folder / MANIFEST_FILE).read_text())


def _answers(n: int, right: float, rng) -> list[dict[str, Any]]:
    return [{"doc_id": i, "filter": "none", "prompt_hash": f"p{i}", "answer": str(i),
             "metrics": {"acc": float(rng.random() < right), "exact_match": float(rng.random() < right)}}
            for i in range(n)]


def _quality(spec, tasks: list[tuple[str, str, str]], rng):
    """Each task's comparison as the quality stage makes it: candidate answers identical
    to the baseline's (an unchanged model)."""
    paired = []
    for task, slice_, metric in tasks:
        rows = _answers(200, 0.6, rng)
        confidence = quality_gates.task_gates(spec, task, slice_).confidence
        cmp, _ = compare_task(task, slice_, metric, None, True, rows, rows, confidence=confidence,
                              iters=spec.bootstrap_iters, seed=spec.seed)
        _, b, c = paired_values(task, metric, None, rows, rows)
        paired.append((cmp, b, c))
    slices = pool_slices(spec, paired)
    everything = pool_everything(spec, paired)
    verdicts = quality_gates.verdicts(spec, paired, slices, None, everything)
    comparisons = [p[0] for p in paired] + [s[0] for s in slices] + ([everything[0]] if everything else [])
    return verdicts, comparisons


def requests(n_ok: int, rng, *, n_errors: int = 0) -> tuple[list[RequestRecord], float]:
    """One repeat's rows, back to back: n_ok answered (32 tokens, a lognormal TTFT), then n_errors
    answered 500; and the repeat's wall time."""
    out, t = [], 0.0
    for i in range(n_ok):
        ttft = 0.2 * rng.lognormal(0, 0.3)
        e2e = ttft + 0.05 * 31
        out.append(RequestRecord(index=i, outcome="ok", sent_at=t, ttft=ttft, e2e=e2e, output_tokens=32))
        t += e2e
    out += [RequestRecord(index=n_ok + i, outcome="error", sent_at=t, status=500) for i in range(n_errors)]
    return out, t


def _performance(spec, rng):
    """Every workload point measured twice per role; the candidate's requests are the baseline's."""
    measured = Measured()
    for w in spec.workloads:
        for point, _, _ in load_points(w):
            key = (w.name, point)
            for _ in range(spec.repeats):
                recs, wall = requests(120, rng)
                for role in ("baseline", "candidate"):
                    measured.metrics.setdefault(key, {}).setdefault(role, []).append(
                        summarize(recs, wall_s=wall, slo={}))
                    measured.monitor.setdefault(key, {}).setdefault(role, []).append({})
                    measured.samples.setdefault(key, {}).setdefault(role, []).append(RepeatSample.of(recs, wall))
                measured.raw.setdefault(key, []).append("")
    points = points_of(spec, measured, None, [])
    return perf_gates.verdicts(points, spec.gates), points


def _stability(spec):
    rows = [{"prompt_tokens": 64, "status": 200, "ok": True}]
    role = {"batch": {"mismatch_rate": 0.0}, "lengths": {"failures": 0, "rows": rows},
            "bad_requests": {"server_errors": 0, "rows": [], "accepted": []},
            "determinism": {"greedy": {"mismatch_rate": 0.0}, "seeded": {"mismatch_rate": 0.0}},
            "soak": {"error_rate": 0.0, "errors": 0, "empty": 0, "requests": 40, "rss_growth_mb": 12.0}}
    return stability_gates.verdicts({"candidate": role, "baseline": role}, spec)


JUDGED_ALONE = StreamDecision(control=OFF, by="QUANTLAB_STREAM_CONTROL=off")


def build(tmp_path: Path, *, development_key: bool = False, edit: Callable[[dict], None] | None = None,
          stream: Any = JUDGED_ALONE, no_stream_entry: bool = False) -> Release:
    """A released folder under tmp_path/ckpt, signed with a key made here; `stream`: the
    run's place in its stream (recipe.stream.StreamDecision), its gates judged at that level
    (by default judged alone, as the suite runs: QUANTLAB_STREAM_CONTROL=off);
    `no_stream_entry`: a manifest without one (the format before streams, or one removed)."""
    stream = None if no_stream_entry else stream
    priv, pub = tmp_path / "keys" / "release.pem", tmp_path / "keys" / "release.pub.pem"
    generate_keypair(priv, pub)
    loaded = load_recipe(RECIPES / "gptq-w4a16.yaml")
    data = loaded.recipe.model_dump(mode="python")
    data["signing"] = {"private_key": str(priv)}
    data["quality"]["tasks"] = TASKS
    if edit:
        edit(data)
    loaded = LoadedRecipe(recipe=type(loaded.recipe).model_validate(data), path=loaded.path)
    ctx = RunContext(loaded, RunDir.create(loaded, tmp_path / "runs"), progress=lambda *_: None, stream=stream)
    ctx.run.record.registration = register(ctx)
    statement = json.loads((ctx.run.path / "registration" / "quantlab-registration.json").read_text())
    tasks = [(t["task"], t["slice"], t["metric"]) for s in statement["data"]["suites"] for t in s["tasks"]]

    rng = np.random.default_rng(7)
    r = ctx.recipe
    q_verdicts, comparisons = _quality(r.quality, tasks, rng)
    p_verdicts, points = _performance(r.performance, rng)
    kernels = {"status": "pass", "off_path": 0, "host": "this CPU", "why": "every layer on CPUWNA16LinearKernel"}
    verdicts = serve_gates.verdicts(kernels, scope="primary") + q_verdicts + p_verdicts + _stability(r.stability)
    decided = decide(verdicts, policy_for(r, fallback="the baseline"))
    decision = decided.record

    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(os.urandom(4096))
    (folder / "config.json").write_text('{"quantization_config": {"format": "pack-quantized"}}')
    registered = copy_into(ctx, folder)
    key = public_key_fingerprint(pub.read_bytes())
    suites = [{"name": s["name"], "sha256": s["sha256"]} for s in statement["data"]["suites"]]
    manifest = Manifest(
        quantlab=quantlab_identity(), created_at="2026-12-06T00:00:00+00:00",
        run={"run_id": ctx.run.record.run_id, "stages": {n: {"status": "ok"} for n in
                                                         ("quantize", "serve", "quality", "performance",
                                                          "stability")}},
        recipe={"name": r.name, "sha256": loaded.content_hash}, model={"kind": "default", "source": "default"},
        calibration=None, quantization={"method": "gptq", "scheme": "w4a16"},
        checkpoint_files=folder_files(folder), runtime={"engines": {}},
        hardware={"device": "cpu", "cpu": {"model": "AMD EPYC", "flags": ["avx512f"]}, "gpus": []},
        results={"quality": {"tasks": [{"task": t.task, "slice": t.slice, "metric": t.metric, "n": t.n,
                                        "baseline": t.baseline, "candidate": t.candidate, "diff": t.diff,
                                        "ci": [t.ci_low, t.ci_high], "confidence": t.confidence}
                                       for t in comparisons], "kl": None, "suites": suites},
                 "performance": {"points": [{"point": f"{p.workload}/{p.point}"} for p in points]}},
        raw_files=[], gates=verdicts, decision=decision, targets=decided.targets,
        error_budget=ledger(verdicts, rule_version=decision.rule_version or 1, quality=r.quality,
                            performance=r.performance, stream=stream,
                            stream_alpha=recipe_alpha(loaded.recipe) if stream is not None else None),
        signer=Signer(method="key", key_fingerprint=key, development_key=development_key),
        registration=registered, attestation=planned("key"))
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest.model_dump(mode="json")))
    sign_folder(folder, method="key", private_key=priv)
    write_attestation(folder, read_manifest(folder), method="key", private_key=priv)
    return Release(folder, priv, pub)


def resign(release: Release, edit: Callable[[dict], None] | None = None, *, relist: bool = False) -> None:
    """What a key holder can do: edit the manifest, list the folder's files again (after
    editing one), sign the folder and write the attestation anew from the edited manifest."""
    m = release.manifest()
    if edit:
        edit(m)
    if relist:
        (release.folder / MANIFEST_FILE).unlink()
        m["checkpoint_files"] = folder_files(release.folder)
    (release.folder / MANIFEST_FILE).write_text(json.dumps(m))
    sign_folder(release.folder, method="key", private_key=release.private_key)
    write_attestation(release.folder, read_manifest(release.folder), method="key", private_key=release.private_key)
