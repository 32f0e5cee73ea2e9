"""Known vulnerabilities of an environment's packages: pip-audit (a subprocess, with a
deadline) on the environment's frozen name==version list, asking the package index's
vulnerability API (pip-audit's `pypi` service), cached per environment lock.

The answer is information for the release owner: it never changes the decision. When the
service cannot be reached, or it found none of the packages, the record says "not
checked" with pip-audit's own reason, never "no vulnerabilities".

Cache: `<cache>/environments/audit-<key>.json`, the key holding the environment's lock,
pip-audit's version and the service. A checked answer is reused for a day (advisories are
published every day); a "not checked" one for an hour (the network may come back)."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from quantlab.core.digest import json_sha256
from quantlab.core.fsutil import write_json_atomic
from quantlab.core.layout import cache_dir

SERVICE = "pypi"  # the package index's vulnerability API (pip-audit's default service)
DEADLINE_S = 300.0  # the whole audit of one environment
SOCKET_TIMEOUT_S = 15  # one request (pip-audit's --timeout)
CHECKED_FOR_S = 24 * 3600
NOT_CHECKED_FOR_S = 3600
SWITCH = "QUANTLAB_AUDIT"  # "off": not checked (the tests' own runs: they use a recorded answer instead)
NOT_AUDITED = {"quantlab"}  # this project itself: not on the index (a same-named project there is not us)
CHECKED, NOT_CHECKED = "checked", "not checked"
LISTED_NOT_FOUND = 20  # the names of packages the service did not know, at most this many in the record


def tool_version() -> str | None:
    try:
        return importlib.metadata.version("pip-audit")
    except importlib.metadata.PackageNotFoundError:
        return None


def requirement_lines(dists: list[str]) -> list[str]:
    """The pins pip-audit is given: quantlab itself left out, a local build (torch
    2.13.0+cpu) asked for as its public release (2.13.0), whose advisories are its own."""
    out = []
    for d in dists:
        name, _, version = d.partition("==")
        if name.lower() not in NOT_AUDITED and version:
            out.append(f"{name}=={version.split('+', 1)[0]}")
    return sorted(set(out))


def audit(lock: str, dists: list[str], *, deadline_s: float = DEADLINE_S,
          now: dt.datetime | None = None) -> dict[str, Any]:
    """The environment's known vulnerabilities (from the cache while it is fresh)."""
    if os.environ.get(SWITCH, "").lower() in ("off", "0", "false", "no"):
        return not_checked(f"turned off ({SWITCH}={os.environ[SWITCH]})", packages=len(requirement_lines(dists)))
    now = now or dt.datetime.now(dt.timezone.utc)
    cached = cache_dir() / "environments" / f"audit-{json_sha256([lock, tool_version(), SERVICE])}.json"
    try:
        known = json.loads(cached.read_text())
        age = (now - dt.datetime.fromisoformat(known["checked_at"])).total_seconds()
        if 0 <= age < (CHECKED_FOR_S if known["status"] == CHECKED else NOT_CHECKED_FOR_S):
            return known
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none, unreadable or old: ask again
    answer = run_audit(requirement_lines(dists), deadline_s=deadline_s)
    answer["checked_at"] = now.isoformat(timespec="seconds")
    try:
        write_json_atomic(cached, answer)
    except OSError:
        pass  # a read-only cache only costs the next release another audit
    return answer


def run_audit(requirements: list[str], *, deadline_s: float) -> dict[str, Any]:
    """pip-audit on these pins, no resolution (they are what is installed), its JSON parsed."""
    if not requirements:
        return not_checked("no package to audit", packages=0)
    with tempfile.TemporaryDirectory(prefix="quantlab-audit-") as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text("\n".join(requirements) + "\n")
        argv = [sys.executable, "-m", "pip_audit", "-r", str(req), "--no-deps", "--disable-pip", "--format", "json",
                "--vulnerability-service", SERVICE, "--progress-spinner", "off", "--desc", "off", "--aliases", "on",
                "--timeout", str(SOCKET_TIMEOUT_S), "--cache-dir", str(cache_dir() / "environments" / "pip-audit-http")]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=deadline_s, cwd=tmp)
        except subprocess.TimeoutExpired:
            return not_checked(f"pip-audit took over {deadline_s:.0f} s (the deadline)", packages=len(requirements))
        except OSError as err:
            return not_checked(f"pip-audit could not start: {err}", packages=len(requirements))
    parsed = parse(proc.stdout)
    if parsed is None:  # no JSON: it stopped before answering (no connection, a service error)
        return not_checked(failure_reason(proc.stderr, proc.returncode), packages=len(requirements))
    return summarize(parsed, packages=len(requirements))


def parse(stdout: str) -> dict[str, Any] | None:
    """pip-audit's JSON (`{"dependencies": [...], "fixes": [...]}`) as rows: `found` (one
    row a vulnerability: package, version, id, aliases, fix_versions), `audited` (the
    packages the service answered for) and `not_found` (name: pip-audit's skip reason).
    None when the output is not that JSON."""
    try:
        doc = json.loads(stdout)
        deps = doc["dependencies"]
        found, audited, not_found = [], 0, {}
        for dep in deps:
            if "skip_reason" in dep:
                not_found[dep["name"]] = dep["skip_reason"]
                continue
            audited += 1
            for v in dep.get("vulns") or []:
                found.append({"package": dep["name"], "version": dep["version"], "id": v["id"],
                              "aliases": list(v.get("aliases") or []),
                              "fix_versions": list(v.get("fix_versions") or [])})
    except (ValueError, KeyError, TypeError):
        return None
    return {"found": found, "audited": audited, "not_found": not_found}


def summarize(parsed: dict[str, Any], *, packages: int) -> dict[str, Any]:
    """The record of one audit: checked when the service answered for at least one package."""
    not_found = parsed["not_found"]
    if parsed["audited"] == 0:
        reasons = sorted(set(not_found.values()))
        why = (f"the service answered for none of the {packages} packages"
               + (f" (pip-audit: {_one_line(reasons[0])})" if reasons else ""))
        return not_checked(why, packages=packages, not_found=not_found)
    return {"status": CHECKED, "reason": None, "service": _service(), "packages": packages,
            "audited": parsed["audited"], "not_found_count": len(not_found),
            "not_found": sorted(not_found)[:LISTED_NOT_FOUND],
            "found": sorted(parsed["found"], key=lambda r: (r["package"], r["id"]))}


def not_checked(reason: str, *, packages: int, not_found: dict[str, str] | None = None) -> dict[str, Any]:
    return {"status": NOT_CHECKED, "reason": reason, "service": _service(), "packages": packages, "audited": 0,
            "not_found_count": len(not_found or {}), "not_found": sorted(not_found or {})[:LISTED_NOT_FOUND],
            "found": []}


def failure_reason(stderr: str, returncode: int) -> str:
    """One line of what pip-audit said when it stopped: its own error line (a lost
    connection is logged as ERROR), else the last line of its traceback."""
    lines = [ln.strip() for ln in (stderr or "").splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR:") and "Tip:" not in ln]
    line = errors[0] if errors else (lines[-1] if lines else f"pip-audit exited with {returncode} and said nothing")
    line = re.sub(r"^ERROR:[\w.]+:", "", line).strip()
    return _one_line(line)


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _service() -> str:
    return f"{SERVICE} (pip-audit {tool_version() or 'not installed'})"
