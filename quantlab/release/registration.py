"""The gates fixed before the evidence: a registration statement, signed before any engine
starts, that the decision is then checked against.

A configuration reported with its result may have been chosen after seeing the result. So
before the first stage a run writes `registration/quantlab-registration.json`: the gate
set it will be decided under (every check's section as the stages will read it, family
adjustment included; `release.policy`; the decision rule's version; the family), the
digests of the data it will be judged on (the suites, the calibration and performance
data files), the seeds, and a search's trial order. It is signed as the release will
be (the recipe's signing method and key; with Sigstore the transparency log's time is
recorded). At the release a copy and its signature go into the checkpoint folder, the
manifest records the statement's digest and the gate set's digest at decision time, and
`quantlab verify` checks that the two gate sets are one and the statement's signature
(release/verify.py).

A resume whose gate set changed: registered anew when the changed checks have no evidence
yet (their stages did not finish) or are performance's only (measured again: fresh
measurements); refused when a serve (serve.allow_kernels), quality, stability or targets
section, or the policy, changed after that evidence was on file (greedy answers, and the
kernels vLLM picks for a checkpoint on a host, do not change on a re-run: the same evidence
would be judged under gates chosen after seeing it).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from quantlab.core import checks as check_table
from quantlab.release.check_hooks import hook
from quantlab.core.digest import json_sha256
from quantlab.core.errors import RecipeError
from quantlab.core.fsutil import sha256_file, write_text_atomic
from quantlab.core.layout import REGISTRATION_FILE, REGISTRATION_SIG
from quantlab.core.run import now_iso
from quantlab.core.stage_context import StageContext
from quantlab.recipe.stream import CONTROLLED
from quantlab.release.decision import RULE_VERSION

SCHEMA = "quantlab-registration/1"
REGISTRATION_DIR = "registration"
POLICY = "policy"  # the section beside the checks' (core/checks.py): release.policy, the rule, the family


def sections() -> tuple[str, ...]:
    """The registered sections: one a check (its evidence: its stage's record), and the policy."""
    return (*check_table.names(), POLICY)


def _field(section: str) -> str:
    """The recipe field a section's refusal names."""
    check = check_table.find(section)
    return check.recipe_field if check is not None else "release.policy"


def gate_set(ctx: StageContext) -> dict[str, Any]:
    """What the decision will be made under, section by section, as the stages read it: a
    check's section through its `registered` hook (core/checks.py), else as the recipe has it."""
    r = ctx.recipe

    def dump(section: Any) -> Any:
        return None if section is None else section.model_dump(mode="json")

    family = ctx.family
    checks = {c.name: hook(c.registered)(r) if c.registered else dump(check_table.section_of(r, c))
              for c in check_table.CHECKS}  # each as its check reads it (serve: serve.allow_kernels)
    return {**checks, POLICY: r.release.policy.model_dump(mode="json"),
            "rule_version": RULE_VERSION, "family": family.as_dict() if family is not None else None}


def section_digests(gates: dict[str, Any]) -> dict[str, str]:
    """One digest a section (the family and rule version count as the policy's)."""
    out = {s: json_sha256(gates[s]) for s in check_table.names()}
    out[POLICY] = json_sha256([gates[POLICY], gates["rule_version"], gates["family"]])
    return out


def data_digests(ctx: StageContext) -> dict[str, Any]:
    """The suites' and data files' sha256 (read, never run), and the seeds."""
    from quantlab.quality.work import suites_of

    r = ctx.recipe
    files = {str(p): sha256_file(p) for p in ctx.loaded.calibration_paths() if p.is_file()}
    if r.performance is not None:
        for w in r.performance.workloads:
            if w.dataset:
                path = ctx.loaded.resolve(w.dataset)
                files[str(path)] = sha256_file(path) if path.is_file() else None
    # each suite's tasks as the run will judge them: verify holds every gated task to its gates (or a skipped gate)
    return {"suites": [{"name": s.name, "sha256": s.sha256,
                        "tasks": [{"task": t.task, "slice": t.slice, "metric": t.metric, "gated": t.gated}
                                  for t in s.tasks]} for s in suites_of(ctx)] if r.quality else [],
            "files": files,
            "seeds": {"quality": r.quality.seed if r.quality else None,
                      "calibration": r.calibration.seed if r.calibration else None,
                      "performance": [w.seed for w in r.performance.workloads] if r.performance else []}}


def stream_claim(stream: Any) -> dict[str, Any] | None:
    """The run's place in its baseline's stream (pipeline/streams.py) as it is registered: signed
    before any engine starts and, with Sigstore, in the public transparency log, so a register
    reset in the cache shows as a second claim of one position for one key. None: no stream."""
    if stream is None:
        return None
    if stream.control != CONTROLLED:
        return {"control": stream.control}
    return {"control": stream.control, "key": stream.key, "position": stream.position,
            "register": stream.slot or stream.position, "method": stream.method, "share": round(stream.share, 12)}


def statement(ctx: StageContext, *, trial_order: list[str] | None = None) -> dict[str, Any]:
    gates = gate_set(ctx)
    return {"schema": SCHEMA, "created_at": now_iso(),
            "recipe": {"name": ctx.recipe.name, "sha256": ctx.loaded.content_hash, "path": str(ctx.loaded.path)},
            "gates": gates, "gates_sha256": json_sha256(gates), "sections": section_digests(gates),
            "data": data_digests(ctx), "trial_order": trial_order, "stream": stream_claim(ctx.stream)}


def register(ctx: StageContext, *, trial_order: list[str] | None = None) -> dict[str, Any]:
    """Before the first stage: the statement written and signed (first time), kept (same
    gate set), registered anew or refused (a resume whose gates changed; see above).
    Returns what the run record keeps of it."""
    held = ctx.run.record.registration
    current = statement(ctx, trial_order=trial_order)
    if held is not None:
        if held["gates_sha256"] == current["gates_sha256"] and held.get("stream") == current["stream"]:
            return held
        _refuse_after_evidence(ctx, held, current)
        ctx.progress("registration: the gate set changed before its evidence was on file (or only performance's "
                     "gates, measured again): registered anew")
    return _write_and_sign(ctx, current, previous=held)


def _refuse_after_evidence(ctx: StageContext, held: dict[str, Any], current: dict[str, Any]) -> None:
    changed = [s for s in sections() if held["sections"].get(s) != current["sections"][s]]
    done = {n for n, st in ctx.run.record.stages.items() if st.status == "ok"}
    # a changed section may be registered anew after its evidence only where the evidence is measured again
    # (not serve: a restarted server logs the same kernels for the same checkpoint and host)
    remeasured = {c.name for c in check_table.CHECKS if c.remeasured}
    seen = [s for s in changed if s not in remeasured
            and (s in done if s != POLICY else bool(done & set(check_table.names())))]
    if seen:
        raise RecipeError(
            f"the recipe's {', '.join(_field(s) for s in seen)} changed after this run's evidence for it "
            f"was on file (registered {held['created_at']}): a decision under gates chosen after seeing the results "
            "is not one. Start a new run (quantlab run RECIPE, without --resume), or put the registered values back",
            file=str(ctx.loaded.path), field=_field(seen[0]))


def _write_and_sign(ctx: StageContext, doc: dict[str, Any], *, previous: dict[str, Any] | None) -> dict[str, Any]:
    from quantlab.release.manifest import SIGNATURE_FILE, sign_folder
    from quantlab.release.signing_key import signing_args

    folder = ctx.run.path / REGISTRATION_DIR
    if previous is not None and folder.is_dir():  # the earlier statement kept beside the new one
        n = len(list(ctx.run.path.glob(f"{REGISTRATION_DIR}.*")))
        folder.rename(ctx.run.path / f"{REGISTRATION_DIR}.{n + 1}")
    tmp = Path(tempfile.mkdtemp(prefix=f".{REGISTRATION_DIR}-", dir=ctx.run.path))
    try:
        write_text_atomic(tmp / REGISTRATION_FILE, json.dumps(doc, indent=2, sort_keys=True, default=str))
        method = ctx.recipe.signing.method
        log_time = None
        if method != "none":
            sign_folder(tmp, method=method, **signing_args(ctx))
            log_time = sigstore_log_time(tmp / SIGNATURE_FILE) if method == "sigstore" else None
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    kept = {"file": f"{REGISTRATION_DIR}/{REGISTRATION_FILE}", "sha256": sha256_file(folder / REGISTRATION_FILE),
            "gates_sha256": doc["gates_sha256"], "sections": doc["sections"], "created_at": doc["created_at"],
            "signed": method != "none", "signing_method": method, "log_time": log_time,
            "registrations": 1 + (previous or {}).get("registrations", 0), "stream": doc.get("stream")}
    ctx.progress(f"registration: the gate set ({doc['gates_sha256'][:12]}) written and "
                 + (f"signed ({method}) before any engine starts" if method != "none" else "left unsigned "
                    "(signing.method none)"))
    return kept


def sigstore_log_time(signature: Path) -> str | None:
    """The transparency log's integrated time of a Sigstore bundle (its proof of when), if it holds one."""
    try:
        bundle = json.loads(signature.read_text())
        entries = bundle.get("verificationMaterial", {}).get("tlogEntries") or []
        return str(entries[0]["integratedTime"]) if entries else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def copy_into(ctx: StageContext, folder: Path) -> dict[str, Any] | None:
    """The statement and its signature into the released folder (before its manifest is
    built, so both are among its files); what the manifest records of it."""
    from quantlab.release.manifest import SIGNATURE_FILE

    held = ctx.run.record.registration
    source = ctx.run.path / REGISTRATION_DIR
    if held is None or not (source / REGISTRATION_FILE).is_file():
        return None
    shutil.copyfile(source / REGISTRATION_FILE, folder / REGISTRATION_FILE)
    (folder / REGISTRATION_SIG).unlink(missing_ok=True)
    if (source / SIGNATURE_FILE).is_file():
        shutil.copyfile(source / SIGNATURE_FILE, folder / REGISTRATION_SIG)
    return {**{k: held[k] for k in ("sha256", "gates_sha256", "created_at", "signed", "signing_method", "log_time",
                                    "registrations")},
            "gates_sha256_at_decision": json_sha256(gate_set(ctx))}
