"""The report's sections on every package that ran: each environment's SBOM and its known
vulnerabilities (or why they were not checked), from the release's record of them."""

from __future__ import annotations

from typing import Any

NOT_DECIDING = ("known vulnerabilities are information for the release owner: they do not change the decision")


def environments_sections(envs: dict[str, dict[str, Any]], *, signed: bool | None = None
                          ) -> list[tuple[str, list[str], list[list[str]], list[str]]]:
    """Two sections: one row an environment, then one row a known vulnerability. `signed`:
    the release result's (None: not known here, the note says what holds either way)."""
    rows, notes, found, audit_notes = [], [], [], []
    for name, e in envs.items():
        if "sbom" not in e:  # a serving environment quantlab cannot see, or could not list
            rows.append([name, "-", f"{e.get('status', 'not known')}: {e.get('reason', '')}", "-", "-", "-"])
            continue
        sbom, vulns = e["sbom"], e.get("vulnerabilities") or {}
        packages = ", ".join(f"{k} {v}" for k, v in (sbom.get("packages") or {}).items())
        rows.append([name, e.get("python") or "-", sbom.get("file") or f"not recorded: {sbom.get('reason', '')}",
                     str(sbom.get("components", "-")), packages or "-", _vulns_cell(vulns)])
        found += [[name, v["package"], v["version"], v["id"], ", ".join(v.get("aliases") or []),
                   ", ".join(v.get("fix_versions") or []) or "none yet"] for v in vulns.get("found") or []]
        if vulns:
            audit_notes.append(_audit_note(name, vulns))
    notes.append(_sbom_note([n for n, e in envs.items() if (e.get("sbom") or {}).get("file")], signed))
    return [("Environments", ["environment", "Python", "SBOM", "components", "key packages", "vulnerabilities"],
             rows, notes),
            ("Known vulnerabilities", ["environment", "package", "version", "id", "aliases", "fixed in"], found,
             audit_notes + [NOT_DECIDING])]


def _sbom_note(written: list[str], signed: bool | None) -> str:
    """Where the SBOMs are and what signs them, true for this release."""
    if not written:
        return "no SBOM is in the released folder (each environment's row says why)"
    where = f"the SBOM{'s' if len(written) > 1 else ''} of {', '.join(written)} (CycloneDX JSON) " \
            f"{'are' if len(written) > 1 else 'is'} in the released folder and listed in the manifest"
    if signed is None:
        return f"{where}: where the release is signed, its signature covers them"
    return f"{where}, signed with it" if signed else f"{where}; the release is unsigned (signing.method none): " \
        "nothing signs them"


def _vulns_cell(v: dict[str, Any]) -> str:
    if not v:
        return "-"
    if v.get("status") != "checked":
        return "NOT CHECKED"
    n = len(v.get("found") or [])
    return f"{n} known" if n else "none known"


def _audit_note(name: str, v: dict[str, Any]) -> str:
    when = f" on {v['checked_at'][:10]}" if v.get("checked_at") else ""
    if v.get("status") != "checked":
        return f"{name}: not checked{when}: {v.get('reason')}"
    missing = v.get("not_found_count") or 0
    unknown = f"; {missing} not known to the service ({', '.join(v.get('not_found') or [])})" if missing else ""
    return f"{name}: {v.get('audited')} of {v.get('packages')} packages checked{when} by {v.get('service')}{unknown}"
