"""The stream of decisions made against one baseline: its register in the cache, and this
run's place in it, fixed before any check (the rule: recipe/stream.py).

A stream is every run judged against the same baseline and suite: the quality baseline
cache's key parts without the task list (quality/work.cache_parts: the baseline's
weights, the suites, limit, seed, engine and its arguments, lm-eval, hardware), whether
the cache itself was used or not. A re-run of the same weights is a new decision (that
is what the stream counts); a resumed run keeps its decision.

The register is `<cache>/streams/<key>/`: one file a decision, `<t>.json`, claimed with a
hard link that fails when the name exists (so two concurrent runs never take one
position), each under an HMAC of the cache secret (core/cache_secret), so a history edited
or planted by someone without it is refused, and said. A decision is written open when it
takes its place and closed with its outcome when the run decides; a run interrupted before
its decision stays open: it released nothing and passes nothing on.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from quantlab.core import cache_secret
from quantlab.core import checks as check_table
from quantlab.core.digest import json_sha256
from quantlab.core.errors import RecipeError
from quantlab.core.fsutil import write_text_atomic
from quantlab.core.layout import cache_dir
from quantlab.recipe.stream import (CONTROLLED, DEFAULT_METHOD, METHOD, NO_STREAM, OFF, SHIPPED_GAMMAS, SHIPPED_W0,
                                    TOLERANCE, StreamDecision, next_share)

STREAMS_DIR = "streams"
RUN_FILE = "stream.json"  # in the run folder: the run's decision, kept by a resume
FORMAT = 1
DECISION = re.compile(r"^([1-9][0-9]*)\.json$")
CONTROL_ENV = "QUANTLAB_STREAM_CONTROL"  # off: every run judged alone, said in its manifest and report
MAX_TRIES = 1000  # positions taken by racing runs before this one gives up


def stream_folder(key: str) -> Path:
    return cache_dir() / STREAMS_DIR / key


def stream_parts(ctx: Any) -> dict[str, Any] | None:
    """What makes two runs' decisions one stream (None: no quality check, nothing shared)."""
    if ctx.recipe.quality is None:
        return None
    if getattr(ctx, "evidence", None) is not None:
        return imported_parts(ctx)
    from quantlab.quality.work import cache_parts, suites_of

    ready = getattr(ctx, "_plan", None) is not None or (ctx.checkpoint_dir / "config.json").is_file()
    parts = cache_parts(ctx, suites_of(ctx), [], ctx.serving_plan(predicted=not ready))
    for per_task in ("tasks", "code_sandbox"):  # every task of the suites judged against the same answers
        parts.pop(per_task, None)
    return parts


def imported_parts(ctx: Any) -> dict[str, Any] | None:
    """quantlab decide's stream (quality/imported_stage.stream_parts): one baseline's items,
    never its bytes (None: no quality evidence)."""
    from quantlab.quality.imported_stage import stream_parts as items_parts
    from quantlab.quality.lmeval_logs import role_logs_once
    from quantlab.release.evidence_stage import judged_tasks

    given = ctx.evidence.evals.get("baseline")
    if not given:
        return None
    return items_parts(ctx, role_logs_once(ctx, given, judged_tasks(ctx), field="--baseline-evals"))


def _body(key: str, doc: dict[str, Any]) -> dict[str, Any]:
    return {"format": FORMAT, "stream": key, **{k: v for k, v in doc.items() if k != "hmac"}}


def _signed(key: str, doc: dict[str, Any]) -> str:
    body = _body(key, doc)
    return json.dumps({**body, "hmac": cache_secret.sign(body)}, indent=1, sort_keys=True)


def read_history(key: str) -> list[dict[str, Any]]:
    """The stream's decisions in order, each authenticated; RecipeError (exit 2) naming the
    file when one is not (edited, planted, or made under another secret) or one is missing."""
    folder = stream_folder(key)
    found: dict[int, Path] = {}
    for path in folder.glob("*.json") if folder.is_dir() else []:
        m = DECISION.match(path.name)
        if m:
            found[int(m.group(1))] = path
    out = []
    for t in range(1, len(found) + 1):
        path = found.get(t)
        if path is None:
            raise _refused(folder, f"decision {t} is missing while {max(found)} decisions are recorded")
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise _refused(folder, f"{path.name} cannot be read ({err})") from None
        if not isinstance(doc, dict) or doc.get("t") != t or doc.get("stream") != key or \
                not cache_secret.holds(_body(key, doc), doc.get("hmac")):
            raise _refused(folder, f"{path.name} is not authenticated by this user's cache secret (edited since it "
                                   "was written, written by someone without the secret, or under an older secret)")
        out.append(doc)
    return out


def _refused(folder: Path, why: str) -> RecipeError:
    return RecipeError(f"the register of decisions made against this baseline ({folder}) cannot be trusted: {why}. "
                       "Every run against the same baseline answers is judged at a level derived from that history, "
                       "so quantlab does not judge this run from an edited one. Restore the folder, or remove it to "
                       "start the stream again at decision 1 (nothing records the restart: the later manifests "
                       "read as a first decision, docs/decisions.md)", file=str(folder))


def stream_rule(key: str, history: list[dict[str, Any]], method: str) -> str:
    """The stream's method: its first decision's (a register from before methods were
    recorded was the online fallback's); RecipeError when the run asks another, since two
    rules spending one alpha keep neither's guarantee."""
    if not history:
        return method
    first = history[0].get("method", METHOD)
    if first != method:
        raise RecipeError(f"the decisions against this baseline ({stream_folder(key)}) are judged by {first}, its "
                          f"first decision's method, and this recipe's release.stream_method asks {method}: two rules "
                          f"spending one alpha keep neither's guarantee. Set release.stream_method: {first} (or remove "
                          "that folder to start the stream again at decision 1, which nothing records)",
                          field="release.stream_method")
    return method


def counted(history: list[dict[str, Any]]) -> tuple[tuple[int, float, bool], ...]:
    """The decisions the rule counts, numbered from 1: every one but those closed void (a run
    that produced no check verdict: it decided nothing, so it neither spends nor passes on)."""
    kept = [d for d in history if not d.get("void")]
    return tuple((i + 1, float(d["share"]), d.get("released") is True) for i, d in enumerate(kept))


def take_position(key: str, info: dict[str, Any], method: str = DEFAULT_METHOD) -> StreamDecision:
    """This run's decision appended to the stream `key`: its file (slot) claimed so that no
    concurrent run takes it, its position among the decisions the rule counts, and the share
    the rule gives from them (recorded with the history it was derived from)."""
    folder = stream_folder(key)
    folder.mkdir(parents=True, exist_ok=True)
    gamma, w0 = SHIPPED_GAMMAS[method], SHIPPED_W0
    for _ in range(MAX_TRIES):
        history = read_history(key)
        stream_rule(key, history, method)
        known = counted(history)
        share = next_share(gamma, [(s, r) for _, s, r in known], method=method, w0=w0)
        decision = StreamDecision(control=CONTROLLED, key=key, position=len(known) + 1, share=share,
                                  method=method, gamma=gamma, w0=w0, history=known, slot=len(history) + 1)
        doc = {"t": decision.slot, "position": decision.position, "share": share, "method": method,
               "gamma": gamma.as_dict(), "w0": w0, "history": [list(h) for h in known], "released": None, **info}
        if _claim(folder / f"{decision.slot}.json", _signed(key, doc)):
            return decision
    raise RecipeError(f"no position could be taken in {folder}: {MAX_TRIES} were taken by other runs meanwhile",
                      file=str(folder))


def _claim(path: Path, text: str) -> bool:
    """Write `path` whole, only if no one has: a finished temporary file hard-linked to the
    name (link fails when the name exists, as O_EXCL does, and a reader never sees it half
    written)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


def _entry(key: str, slot: int) -> tuple[Path, dict[str, Any]]:
    """One decision's file in the register, authenticated (RecipeError naming it otherwise)."""
    path = stream_folder(key) / f"{slot}.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise _refused(path.parent, f"{path.name}, this run's decision, cannot be read ({err})") from None
    if not isinstance(doc, dict) or doc.get("t") != slot or doc.get("stream") != key or \
            not cache_secret.holds(_body(key, doc), doc.get("hmac")):
        raise _refused(path.parent, f"{path.name} is not authenticated by this user's cache secret")
    return path, doc


def closed(doc: dict[str, Any]) -> str | None:
    """How a register entry was closed (None: still open)."""
    if doc.get("void"):
        return "void (no check verdict)"
    return None if doc.get("released") is None else ("released" if doc["released"] else "not released")


def close_decision(decision: StreamDecision | None, released: bool, candidate: str | None = None, *,
                   void: bool = False) -> None:
    """The decision's outcome into its file (still authenticated): what it passes on; the
    candidate's weights (a digest, as quality/work.mark_judged counts them) now known.
    `void`: the run produced no check verdict. A decision is closed once: closing it again
    with the same outcome changes nothing, with another is refused (a resume that re-judges
    takes a new position instead: decide_position)."""
    if decision is None or decision.control != CONTROLLED or decision.key is None:
        return
    path, doc = _entry(decision.key, decision.slot or decision.position)
    was = closed(doc)
    if was is not None:
        if void:  # this attempt produced nothing; the decision was made by an earlier one
            return
        if not void and not doc.get("void") and doc.get("released") == bool(released):
            return
        raise RecipeError(f"decision {doc['t']} of the stream ({path}) is already closed as {was}: a decision is "
                          "made once, so its outcome is not rewritten. Judge the candidate again in a new run (or "
                          "resume with a changed check, which takes a new position)", file=str(path))
    if void:
        doc["void"], doc["released"] = True, False
    else:
        doc["released"] = bool(released)
    doc["candidate"] = candidate or doc.get("candidate")
    write_text_atomic(path, _signed(decision.key, doc))


def resumed_position(ctx: Any) -> tuple[StreamDecision | None, dict[str, Any] | None]:
    """A resumed run's saved decision and its register entry (None: a new run), checked against the register: its
    file there must be authenticated, name this run folder and hold the saved share; the
    history is the register's, not the run folder's (which anyone who can write it can edit)."""
    saved = ctx.run.path / RUN_FILE
    if not saved.is_file():
        return None, None
    try:
        doc = json.loads(saved.read_text())
        decision = from_run_file(doc)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise RecipeError(f"{saved} cannot be read as this run's stream decision ({err}): resume is refused since "
                          "its level cannot be checked. Start a new run (drop --resume)", file=str(saved)) from None
    if decision.control != CONTROLLED:
        return decision, None
    slot = doc.get("register", decision.position)
    if not isinstance(slot, int) or not isinstance(decision.key, str):
        raise RecipeError(f"{saved} names no decision in the register (key {decision.key!r}, file {slot!r}): "
                          "start a new run (drop --resume)", file=str(saved))
    path, entry = _entry(decision.key, slot)
    problem = None
    if entry.get("run") != str(ctx.run.path):
        problem = f"it is the decision of run {entry.get('run')!r}, not of {ctx.run.path}"
    elif not isinstance(entry.get("share"), (int, float)) or abs(entry["share"] - decision.share) > TOLERANCE:
        problem = f"it records share {entry.get('share')!r}, the run folder's {saved.name} {decision.share!r}"
    if problem is not None:
        raise RecipeError(f"the run folder's {saved.name} does not match its decision in the register ({path}): "
                          f"{problem}. The level this run is judged at comes from the register, so the resume is "
                          "refused; start a new run (drop --resume)", file=str(saved), field="share")
    history = entry.get("history")
    if isinstance(history, list):
        known = tuple((int(t), float(s), bool(r)) for t, s, r in history)
    else:  # a register entry from before the history was recorded with it: the earlier files as they are
        known = counted(read_history(decision.key)[:slot - 1])
    want = next_share(decision.gamma, [(s, r) for _, s, r in known], method=decision.method, w0=decision.w0)
    if abs(want - decision.share) > TOLERANCE:
        raise RecipeError(f"the register's history before {path.name} gives share {want:.6g}, not the {decision.share:.6g} "
                          f"this run was judged at: resume is refused; start a new run (drop --resume)", file=str(path))
    return replace(decision, history=known, position=len(known) + 1, slot=slot), entry


def rejudging() -> tuple[str, ...]:
    """The stages that make the decision: the checks whose gates are its evidence, and the release."""
    return (*check_table.evidence_names(), "release")


def decide_position(ctx: Any, *, alone: bool = False, claim: bool = True,
                    resumed: tuple[StreamDecision | None, dict[str, Any] | None] = (None, None),
                    will_run: set[str] | frozenset[str] = frozenset()) -> StreamDecision:
    """Where this run stands, before any check: its stream decision, judged alone when the
    user turned the control off, none without a quality check. A resume (`resumed`:
    resumed_position's) keeps its decision while it is open and of the same stream; one
    already closed takes a new position when a stage that decides runs again (`will_run`),
    since a decision is made once, and a change of the stream's parts takes a new one too.
    claim=False (the dry run): the position the run would take now, taken by nobody."""
    saved, entry = resumed
    if alone:
        return StreamDecision(control=OFF, by="quantlab run --alone")
    if not ctx.loaded.recipe.release.stream_control:
        return StreamDecision(control=OFF, by="release.stream_control: false")
    if os.environ.get(CONTROL_ENV, "").lower() == "off":  # the test suite's: its runs share baselines by design
        return StreamDecision(control=OFF, by=f"{CONTROL_ENV}=off in the environment")
    if saved is not None and saved.control != CONTROLLED:
        return saved
    parts = stream_parts(ctx)
    if parts is None:
        return StreamDecision(control=NO_STREAM)
    key = json_sha256(parts)[:32]
    if saved is not None and saved.key == key and (closed(entry or {}) is None or not set(will_run) & set(rejudging())):
        return saved  # an interrupted run resumed (or a closed one re-saved): the same decision, at its level
    method = ctx.loaded.recipe.release.stream_method
    if not claim:
        history = read_history(key)
        stream_rule(key, history, method)
        known = counted(history)
        gamma = SHIPPED_GAMMAS[method]
        return StreamDecision(key=key, position=len(known) + 1, history=known, method=method, gamma=gamma,
                              slot=len(history) + 1,
                              share=next_share(gamma, [(s, r) for _, s, r in known], method=method, w0=SHIPPED_W0))
    decision = take_position(key, {"run": str(ctx.run.path), "recipe": ctx.loaded.recipe.name,
                                   "recipe_sha256": ctx.loaded.content_hash, "candidate": candidate_of(ctx),
                                   **({"replaces": saved.slot} if saved is not None and saved.key == key else {})},
                             method)
    write_text_atomic(ctx.run.path / RUN_FILE, json.dumps(decision.record(None), indent=1, sort_keys=True))
    return decision


def renewal(saved: StreamDecision | None, entry: dict[str, Any] | None, now: StreamDecision) -> str | None:
    """Why a resumed run took a new position (None: it kept its decision, or is new)."""
    if saved is None or saved.control != CONTROLLED or now == saved:
        return None
    if now.control != CONTROLLED:
        return None
    if now.key != saved.key:
        return "the stream's parts changed (another baseline, suite, engine or hardware)"
    return f"its decision {saved.position} was already closed ({closed(entry or {})}) and a check runs again"


def candidate_of(ctx: Any) -> str | None:
    """The candidate's identity when it is known before the checks (validate: its files);
    a quantized run's weights exist only after its quantize stage (recorded by the quality
    stage's mark_judged)."""
    record = ctx.run.record
    made = record.result("quantize") or record.result("checkpoint")
    weights = getattr(made, "weights_sha256", None)
    return json_sha256(weights)[:32] if weights else None


def from_run_file(doc: dict[str, Any]) -> StreamDecision:
    from quantlab.recipe.stream import Gamma

    if doc["control"] != CONTROLLED:
        return StreamDecision(control=doc["control"], by=doc.get("by"))
    return StreamDecision(control=doc["control"], key=doc.get("key"), position=doc.get("position"),
                          share=float(doc["share"]), method=doc.get("method", METHOD),
                          gamma=Gamma.from_dict(doc["gamma"]), w0=float(doc.get("w0", SHIPPED_W0)),
                          history=tuple((h["t"], float(h["share"]), bool(h["released"])) for h in doc["history"]),
                          slot=doc.get("register", doc.get("position")))


def position_line(decision: StreamDecision, recipe: Any) -> str:
    from quantlab.recipe.stream import cost_line, recipe_alpha

    return f"stream: {cost_line(decision, recipe_alpha(recipe))}"
