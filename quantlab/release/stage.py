"""Release stage: the decision from every gate verdict, the manifest written into the
checkpoint folder (and beside the run record), and one signature over both.

Only what was evaluated is signed: before anything is written, every file in the checkpoint
folder is hashed and compared with the record the quantize (or checkpoint) stage made when
the candidate first existed; an added, missing or changed file stops the release
(IntegrityError, exit 3, naming the file), on a resume too. The manifest lists the recorded
files and the release's own (registration, SBOMs); the folder, read-only through the checks,
gets room for those only, and ends with ordinary modes (files 0644, folders 0755)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from quantlab.core.provenance import quantlab_identity
from quantlab.core.digest import stage_digest
from quantlab.core.stage_context import StageContext
from quantlab.core import checks as check_table
from quantlab.release.check_hooks import hook
from quantlab.core import folder_record
from quantlab.core.errors import IntegrityError, RecipeError
from quantlab.core.fsutil import remove_tree, sha256_file, write_json_atomic
from quantlab.core.layout import RELEASE_FILES, SBOM_DIR, release_owned
from quantlab.core.verdicts import all_verdicts
from quantlab.release.error_budget import ledger
from quantlab.recipe.stream import FAMILY_ONLY, StreamDecision, recipe_alpha
from quantlab.release.decision import Decided, decide, policy_for, targets_line
from quantlab.release.manifest import (
    MANIFEST_FILE,
    NOT_SIGNED,
    SIGNATURE_FILE,
    Manifest,
    RawFile,
    Signer,
    public_key_fingerprint,
    public_pem_of,
    sign_folder,
)
from quantlab.release.registration import copy_into
from quantlab.release.environments import record_environments
from quantlab.release.evidence_record import evidence_record, imported_runtime
from quantlab.release.attestation import planned, write_attestation
from quantlab.release.signing_key import signing_args, signing_key
from quantlab.core.results import (
    CheckpointResult,
    EvidenceResult,
    QuantizeResult,
    ReleaseResult,
    ServeResult,
    TargetsResult,
)
from quantlab.core.run import now_iso

NAME = "release"


def inputs(ctx: StageContext) -> dict[str, Any]:
    record = ctx.run.record
    return {
        "signing": ctx.recipe.signing.model_dump(mode="json"),
        # everything the manifest summarises: a re-run of any earlier stage re-releases
        "stages": {name: stage_digest(rec) for name, rec in record.stages.items()
                   if name != NAME and name in ctx.enabled_stages},
    }


def preflight(ctx: StageContext) -> None:
    s = ctx.recipe.signing
    if s.password_env and s.password_env not in os.environ:
        raise RecipeError(f"signing.password_env names ${s.password_env}, which is not set", file=str(ctx.loaded.path),
                          field="signing.password_env")
    if s.method == "sigstore" and s.identity_token_env and s.identity_token_env not in os.environ:
        raise RecipeError(f"signing.identity_token_env names ${s.identity_token_env}, which is not set",
                          file=str(ctx.loaded.path), field="signing.identity_token_env")


def check_results(ctx: StageContext) -> dict[str, Any]:
    """The results the decision is made on: every enabled stage's but the release's own."""
    record = ctx.run.record
    return {name: record.result(name) for name in record.stages if name != NAME and name in ctx.enabled_stages}


def decide_run(ctx: StageContext, *, fallback: str = "") -> Decided:
    """The run's decision (the pipeline's exit code and this stage's manifest both use it)."""
    return decide(all_verdicts(check_results(ctx)), policy_for(ctx.recipe, fallback=fallback))


def run(ctx: StageContext) -> ReleaseResult:
    ctx.close_engines()  # the checks are done; logs are final from here on
    if getattr(ctx, "evidence", None) is not None and ctx.import_from is None:
        return _decision_only(ctx)
    evaluated = checked_checkpoint(ctx)  # before anything is written: refused here if the folder changed
    try:
        return _release(ctx, evaluated)
    finally:  # a deploy step running as another user can read what is released
        folder_record.release_modes(ctx.checkpoint_dir)


def recorded_checkpoint(ctx: StageContext) -> dict[str, dict[str, Any]]:
    """The checkpoint's files as the quantize or checkpoint stage recorded them, when the
    candidate first existed."""
    record = ctx.run.record
    made = record.result("quantize") or record.result("checkpoint")
    if not isinstance(made, (QuantizeResult, CheckpointResult)):
        raise IntegrityError(f"nothing is released: the run record {ctx.run.path / 'run.json'} holds no quantize or "
                             "checkpoint result, so there is no record of the checkpoint's files to compare the "
                             "folder with; run the pipeline from its first stage")
    return {rel: f.model_dump() for rel, f in made.files.items()}


def checked_checkpoint(ctx: StageContext, before: str = "release") -> dict[str, dict[str, Any]]:
    """Every file in the checkpoint folder hashed and compared with the record (the release's
    own files aside); the recorded files, when they all hold. IntegrityError naming each
    file that differs otherwise: a resume never trusts the record over the disk. `before`:
    what the check guards (the release, or the checks of a resumed run), for the progress line."""
    folder = ctx.checkpoint_dir
    recorded = recorded_checkpoint(ctx)
    ctx.progress(f"{before}: {len(recorded)} checkpoint files hashed and compared with the record made when it "
                 "was created")
    problems, found = folder_record.differences(folder, recorded, skip=release_owned)
    if problems:
        shown = problems[:10] + ([f"... and {len(problems) - 10} more"] if len(problems) > 10 else [])
        raise IntegrityError(f"nothing is released: the checkpoint folder {folder} is not the checkpoint that was "
                             "evaluated (recorded when it was created); " + "; ".join(shown) + ". Something wrote "
                             "into it after it was recorded: start a new run (a resume does not re-record it)",
                             cause="checkpoint changed after it was recorded: " + problems[0])
    return found


def _make_room(folder: Path) -> None:
    """The folder writable for the release's own files only, an earlier release's removed (its
    subfolders stay read-only)."""
    os.chmod(folder, folder_record.RELEASED[1])
    for name in RELEASE_FILES:  # never leave an old signature or attestation next to a new manifest
        (folder / name).unlink(missing_ok=True)
    remove_tree(folder / SBOM_DIR)


def _release(ctx: StageContext, evaluated: dict[str, dict[str, Any]]) -> ReleaseResult:
    results = check_results(ctx)
    verdicts = all_verdicts(results)
    decided = decide_run(ctx, fallback=_fallback(ctx, _resolved_baseline(ctx)[0]))
    decision, targets = decided.record, decided.targets
    if targets:
        ctx.progress(f"release: {targets_line(targets)}")
    s = ctx.recipe.signing
    args = signing_args(ctx)
    key, local_key = signing_key(ctx) if s.method in ("key", "certificate") else (None, False)
    fingerprint = public_key_fingerprint(public_pem_of(key, args["password"])) if key is not None else None
    signer = Signer(method=s.method, key_fingerprint=fingerprint, development_key=local_key) \
        if s.method != "none" else None
    folder = ctx.checkpoint_dir
    _make_room(folder)
    registered = copy_into(ctx, folder)  # before the manifest lists the folder's files
    environments = record_environments(ctx, folder)  # the SBOMs too: the signature binds them
    manifest = build_manifest(ctx, results, verdicts, decision, targets).model_copy(
        update={"signer": signer, "registration": registered, "environments": environments,
                "attestation": planned(s.method), "checkpoint_files": released_files(folder, evaluated)})
    write_json_atomic(folder / MANIFEST_FILE, manifest.model_dump(mode="json"))
    signed = False
    if s.method != "none":
        ctx.progress(f"release: signing {folder.name} ({len(manifest.checkpoint_files)} files + manifest) "
                     f"with method '{s.method}'")
        sign_folder(folder, method=s.method, **args)
        signed = True
    attestation = write_attestation(folder, manifest, method=s.method, **args)
    # a copy beside the run record, so reports need not open the checkpoint
    shutil.copyfile(folder / MANIFEST_FILE, ctx.run.path / MANIFEST_FILE)
    ctx.add_artifact(f"{folder.name}/{MANIFEST_FILE}", "manifest")
    if signed:
        ctx.add_artifact(f"{folder.name}/{SIGNATURE_FILE}", "manifest-signature")
    if attestation is not None:
        ctx.add_artifact(f"{folder.name}/{attestation['file']}", "attestation")
    return ReleaseResult(decision=decision.decision, why=decision.why, fallback=decision.fallback,
                         environments=environments,
                         failed_gates=decision.failed_gates, not_shown_gates=decision.not_shown_gates,
                         not_shown_policy=decision.not_shown_policy, rule_version=decision.rule_version,
                         error_budget=manifest.error_budget,
                         targets={n: d.model_dump(mode="json") for n, d in targets.items()},
                         manifest=f"{folder.name}/{MANIFEST_FILE}",
                         signed=signed, signing_method=s.method, public_key_fingerprint=fingerprint,
                         local_development_key=local_key, attestation=attestation, gates=[])


UNSIGNED = ("nothing signed: the decision was made on imported evidence without a checkpoint (quantlab decide "
            "--checkpoint DIR hashes one and signs the release over it)")


def _decision_only(ctx: StageContext) -> ReleaseResult:
    """quantlab decide without a checkpoint: the decision, its ledger and the evidence's digests
    in an unsigned manifest beside the run record; no folder is signed, since none was named."""
    results = check_results(ctx)
    verdicts = all_verdicts(results)
    decided = decide_run(ctx, fallback=_fallback(ctx, _resolved_baseline(ctx)[0]))
    decision = decided.record
    manifest = build_manifest(ctx, results, verdicts, decision, decided.targets).model_copy(
        update={"checkpoint_files": {}})
    write_json_atomic(ctx.run.path / MANIFEST_FILE, manifest.model_dump(mode="json"))
    ctx.add_artifact(MANIFEST_FILE, "manifest")
    ctx.progress(f"release: {UNSIGNED}")
    return ReleaseResult(decision=decision.decision, why=f"{decision.why}; {UNSIGNED}", fallback=decision.fallback,
                         failed_gates=decision.failed_gates, not_shown_gates=decision.not_shown_gates,
                         not_shown_policy=decision.not_shown_policy, rule_version=decision.rule_version,
                         error_budget=manifest.error_budget, targets={}, manifest=MANIFEST_FILE, signed=False,
                         signing_method="none", gates=[])


def released_files(folder: Path, evaluated: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """What the manifest lists: the evaluated files as checked against their record, and the
    files this release added (registration, SBOMs), hashed now."""
    own = folder_record.digests(folder, skip=lambda rel: not release_owned(rel) or rel in (MANIFEST_FILE, *NOT_SIGNED))
    files = {**evaluated, **own}
    return {rel: files[rel] for rel in sorted(files, key=lambda r: tuple(r.split("/")))}


def _fallback(ctx: StageContext, baseline) -> str:
    named = ctx.recipe.stability.fallback if ctx.recipe.stability else "baseline"
    if named != "baseline":
        return f"the previously released checkpoint {named} (stability.fallback)"
    where = f" ({baseline.path.name})" if baseline is not None else ""
    return f"the baseline: {ctx.recipe.model.source}{where}, unquantized"


def _resolved_baseline(ctx: StageContext) -> tuple[Any, str | None]:
    """(the baseline model, None), or (None, why) for a decision on imported evidence: its
    baseline may be a model this machine does not hold (a hub id, a cluster's path)."""
    if getattr(ctx, "evidence", None) is not None:  # never fetched: a hub id would download the whole model
        return None, "a decision on imported evidence records the baseline as its recipe names it"
    return ctx.baseline_model(), None


def _model_record(ctx: StageContext) -> dict[str, Any]:
    """The unquantized source as the manifest records it; one not held here recorded as named,
    its files unknown, rather than guessed."""
    baseline, why = _resolved_baseline(ctx)
    if baseline is None:
        return {"kind": "named", "source": ctx.recipe.model.source, "provenance": {}, "files": None, "note": why}
    return {"kind": baseline.kind, "source": baseline.source, "provenance": _without_files(baseline.provenance),
            "files": _model_files(baseline)}


def build_manifest(ctx: StageContext, results: dict[str, Any], verdicts, decision, targets=None) -> Manifest:
    record = ctx.run.record
    q = results.get("quantize")
    runtime, hardware = _runtime_and_hardware(results.get("serve"))
    if isinstance(results.get("evidence"), EvidenceResult):  # what the imported files say, by role
        runtime, hardware = imported_runtime(results["evidence"])
    extra = results.get("targets")
    if isinstance(extra, TargetsResult):
        runtime["targets"] = {n: _target_summary(o) for n, o in extra.targets.items()}
    return Manifest(
        quantlab=quantlab_identity(),
        created_at=now_iso(),
        run={"run_id": record.run_id, "recipe_history": record.recipe_history, "placement": record.placement,
             "stopped_early": record.stopped_early,
             "stages": {n: {"status": r.status, "started_at": r.started_at, "finished_at": r.finished_at,
                            "duration_s": r.duration_s} for n, r in record.stages.items() if n != NAME}},
        recipe={"name": record.recipe_name, "sha256": record.recipe_sha256, "content": record.recipe},
        model=_model_record(ctx),
        calibration=q.calibration if isinstance(q, QuantizeResult) else None,
        quantization=_quantization(q, results.get("checkpoint")),
        checkpoint_files={},  # the release sets it: the evaluated files and its own (released_files)
        runtime=runtime,
        hardware=hardware,
        results=_check_summaries(results),
        raw_files=_raw_files(ctx),
        gates=verdicts,
        decision=decision,
        targets=targets or {},
        comparison=ctx.comparison,
        evidence=evidence_record(results.get("evidence"), results.get("checkpoint")),
        error_budget=ledger(verdicts, rule_version=decision.rule_version or 1, family=ctx.family,
                            judged_on_these_items=getattr(results.get("quality"), "judged_on_these_items", None),
                            warned=decision.warned_gates if decision.decision == "release" else (),
                            stream=_stream_of(ctx), stream_alpha=recipe_alpha(ctx.loaded.recipe),
                            **{c.name: check_table.section_of(ctx.recipe, c) for c in check_table.CHECKS}),
    )


def _stream_of(ctx: StageContext) -> StreamDecision | None:
    """The run's stream decision; a comparison's or search's candidate (which takes no
    stream position) says so in its record rather than leaving the entry out."""
    if ctx.stream is None and ctx.family is not None:
        return StreamDecision(control=FAMILY_ONLY, by=f"{ctx.family.kind} of {ctx.family.size}")
    return ctx.stream


def _model_files(baseline) -> dict[str, dict[str, Any]]:
    """The unquantized model's files: size and sha256 (the default model records its
    hashes; others are hashed here)."""
    files = {p.name: {"size": p.stat().st_size} for p in sorted(baseline.path.iterdir()) if p.is_file()}
    recorded = (baseline.provenance or {}).get("files") or {}
    for name, meta in files.items():
        meta["sha256"] = (recorded.get(name) or {}).get("sha256") or sha256_file(baseline.path / name)
    return files


def _runtime_and_hardware(serve: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    if not isinstance(serve, ServeResult):
        return {}, {}
    runtime = {
        "mode": serve.mode, "engine_args": serve.engine_args, "identical_engine_args": serve.identical_engine_args,
        "versions": serve.probe.get("versions"),
        # what the engine build can run here (its kernel library and ops) and what both servers computed in
        "engine_kernels": serve.probe.get("engine_kernels"), "dtype": serve.dtype,
        "engines": {role: {"vllm_version": f.vllm_version, "served_model_name": f.served_model_name,
                           "max_model_len": f.max_model_len,
                           "linear_kernels": (f.log or {}).get("linear_kernels"),
                           "attention_backend": (f.log or {}).get("attention_backend"),
                           "kv_cache_dtype": (f.log or {}).get("kv_cache_dtype"),
                           "kv_cache_tokens": (f.log or {}).get("kv_cache_tokens"),
                           "engine_warnings": (f.log or {}).get("warnings")}
                    for role, f in serve.engines.items()},
        "compat": {role: c.model_dump() for role, c in serve.compat.items()},
    }
    hardware = {"device": serve.device, "gpus": serve.probe.get("gpus"), "cpu": serve.probe.get("cpu"),
                "driver": serve.probe.get("driver")}
    return runtime, hardware


def _check_summaries(results: dict[str, Any]) -> dict[str, Any]:
    """The manifest's summary of each check (the run record holds the full results): each
    row's `summary` hook of core/checks.py, for a check that has a result."""
    return {check.name: hook(check.summary)(results[check.name])
            for check in check_table.in_manifest_order()
            if check.summary and results.get(check.name) is not None}


def _raw_files(ctx: StageContext) -> list[RawFile]:
    """Every artifact of the checks, hashed (servers are stopped first, so their logs are
    complete); checkpoint files are listed with their sha256 in checkpoint_files instead."""
    raw = []
    for name, rec in ctx.run.record.stages.items():
        for a in rec.artifacts:
            f = ctx.run.path / a.path
            if name != NAME and not a.path.startswith(f"{ctx.checkpoint_dir.name}/"):
                raw.append(RawFile(path=a.path, sha256=sha256_file(f) if f.is_file() else None, role=a.role))
    return raw


def _quantization(q: Any, imported: Any) -> dict[str, Any]:
    if isinstance(q, QuantizeResult):
        return {"method": q.method, "scheme": q.scheme, "quantization_config": q.quantization_config,
                "layers_quantized": q.layers_quantized, "versions": q.versions, "shims": q.shims,
                "gptq_max_loss": q.gptq_max_loss, "compute_dtype": q.compute_dtype}
    if isinstance(imported, CheckpointResult):  # quantlab validate: made elsewhere, recorded as found
        return {"method": "validated as given", "format": imported.format, "source": imported.source,
                "quantization_config": imported.quantization_config}
    return {}


def _target_summary(o) -> dict[str, Any]:
    """A serve target's runtime and hardware facts for the manifest."""
    return {"required": o.required, "mode": o.mode, "device": o.device, "engine_args": o.engine_args,
            "versions": o.probe.get("versions"), "cpu": o.probe.get("cpu"), "gpus": o.probe.get("gpus"),
            "driver": o.probe.get("driver"),
            "engine_kernels": o.probe.get("engine_kernels"),
            "compat": {role: c.model_dump() for role, c in o.compat.items()},
            "engines": {role: {"vllm_version": f.vllm_version, "served_model_name": f.served_model_name,
                               "max_model_len": f.max_model_len,
                               "linear_kernels": (f.log or {}).get("linear_kernels"),
                               "attention_backend": (f.log or {}).get("attention_backend")}
                        for role, f in o.engines.items()}}


def _without_files(provenance: dict | None) -> dict:
    return {k: v for k, v in (provenance or {}).items() if k != "files"}
