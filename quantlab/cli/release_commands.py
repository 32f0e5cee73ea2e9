"""The commands around a release: verify, keygen, manifest-schema, default-model."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape


from quantlab.core.errors import RecipeError
from quantlab.cli.base import app, err, exit_codes, progress


@app.command()
def verify(
    folder: Annotated[Path, typer.Argument(help="A released checkpoint folder (it holds quantlab-manifest.json).")],
    public_key: Annotated[Optional[Path], typer.Option(help="PEM public key (key signing).")] = None,
    certificate_chain: Annotated[Optional[list[Path]], typer.Option(
        help="Certificates up to the root (certificate signing); repeat for each.")] = None,
    sigstore_identity: Annotated[Optional[str], typer.Option(help="Expected signer identity (Sigstore).")] = None,
    sigstore_issuer: Annotated[Optional[str], typer.Option(help="Expected OIDC issuer (Sigstore); required "
                                                           "with --sigstore-identity.")] = None,
    allow_blocked: Annotated[bool, typer.Option(help="Check integrity alone: exit 0 for a verified folder whose "
                                                "decision was 'blocked'.")] = False,
    require_attestation: Annotated[bool, typer.Option(help="A folder without the in-toto attestation (a release "
                                                      "made before attestations) is not verified.")] = False,
    allow_dev_key: Annotated[bool, typer.Option(help="Accept a release signed with quantlab's local development "
                                                "key (a trial's: never for shipping).")] = False,
    allow_legacy: Annotated[bool, typer.Option(help="Accept a manifest of quantlab 0.1.0, whose releases may lack "
                                               "a registration and an error budget (nothing then holds its gates "
                                               "to a registered set): only if you trust it was made by that "
                                               "version.")] = False,
    here: Annotated[bool, typer.Option(help="Also compare this host with the hardware and runtime the release was "
                                       "validated on (kernel library and AMX, or GPU model, compute capability, "
                                       "count and driver; the exact vLLM version); exit 1 naming each "
                                       "difference.")] = False,
    allow: Annotated[Optional[list[str]], typer.Option(help="With --here: a difference the team accepts, by class "
                                                       "(e.g. vllm-version); repeat for each.")] = None,
    serving_python: Annotated[Optional[Path], typer.Option(help="With --here: the Python of this host's serving "
                                                           "environment (default: .venv-vllm/bin/python, or "
                                                           "$QUANTLAB_VLLM_PYTHON).")] = None,
    evidence: Annotated[Optional[list[Path]], typer.Option(help="A release decided on imported evidence (quantlab "
                                                           "decide): a file (or an lm-eval output folder) it was "
                                                           "decided on, checked against the sha256 its manifest "
                                                           "records; repeat for each.")] = None,
) -> None:
    """Check a released folder: the signature, every file hash, no file added, missing or
    linked, the signer the manifest names (the local development key only with
    --allow-dev-key), that the decision follows from the gate verdicts under a rule its
    quantlab knew, that its gates are the registered gate set (a manifest of quantlab 0.1.0,
    which may have none, only with --allow-legacy), and that the attestation's
    predicate is the manifest's; with --here, that this host is one the release was
    validated on. Exit 0 verified and released, 1 not verified (or verified but blocked,
    unless --allow-blocked; or, with --here, another host), 2 bad input."""
    from quantlab.release.manifest import read_manifest
    from quantlab.release.verify import verify_release

    with exit_codes():
        _check_verify_inputs(folder, [public_key, *(certificate_chain or [])], allow=allow, here=here)
        checked = verify_release(folder, require_attestation=require_attestation, allow_dev_key=allow_dev_key,
                                 allow_legacy=allow_legacy, public_key=public_key, certificate_chain=certificate_chain,
                                 sigstore_identity=sigstore_identity, sigstore_issuer=sigstore_issuer)
        m = read_manifest(folder) if not checked.problems else None
        problems, notes = _evidence_checked(m, evidence)
        _exit_unless_verified(folder, checked.problems + problems)
        m = read_manifest(folder)
        _echo_verified(folder, m, checked.notes + notes)
        if here:
            _verify_here(folder, m, tuple(allow or ()), serving_python)
        _exit_unless_released(folder, m, allow_blocked)


def _evidence_checked(m, evidence: Optional[list[Path]]) -> tuple[list[str], list[str]]:
    """--evidence: the files given against the manifest's imported evidence (release/evidence_check.py)."""
    if not evidence or m is None:
        return [], []
    from quantlab.release.evidence_check import check_evidence

    return check_evidence(getattr(m, "evidence", None), evidence)


def _check_verify_inputs(folder: Path, key_files: list[Optional[Path]], *, allow, here: bool) -> None:
    """Refuse bad input (exit 2): no folder, a missing key or certificate file, --allow without --here."""
    if not folder.is_dir():
        raise RecipeError(f"{folder} is not a folder; pass the released checkpoint folder")
    for p in key_files:
        if p is not None and not p.is_file():
            raise RecipeError(f"key or certificate file not found: {p}")
    if allow and not here:
        raise RecipeError("--allow names host differences: it needs --here")


def _exit_unless_verified(folder: Path, problems: list[str]) -> None:
    """Print each problem and exit 1 when the folder did not verify."""
    if problems:
        err.print(f"[bold red]NOT VERIFIED[/] {escape(str(folder))}: {len(problems)} problem(s)", highlight=False,
                  soft_wrap=True)
        for p in problems:
            err.print(f"  - {escape(p)}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)


def _echo_verified(folder: Path, m, notes: list[str]) -> None:
    """The lines that say what verified: files, registration, signer, notes, attestation."""
    typer.echo(f"verified {folder}: {len(m.checkpoint_files)} files and the manifest match the signature; "
               f"decision '{m.decision.decision}' ({m.decision.why})")
    if m.registration is not None:
        r = m.registration
        typer.echo(f"registered {r['created_at']} before any engine started ("
                   + (f"signed, {r['signing_method']}" if r["signed"] else "unsigned")
                   + (f", log time {r['log_time']}" if r.get("log_time") else "")
                   + f"); decided under that gate set ({r['gates_sha256'][:12]}), its {len(m.gates)} gates "
                   f"the ones it calls for, under decision rule {m.decision.rule_version or 1}")
    if m.signer is not None and m.signer.key_fingerprint:
        typer.echo(f"signed by key {m.signer.key_fingerprint}"
                   + (" (quantlab's local development key, accepted by --allow-dev-key: not for shipping)"
                      if m.signer.development_key else ""))
    for note in notes:
        typer.echo(f"note: {note}")
    if m.attestation is not None:
        typer.echo(f"attestation {m.attestation['file']}: its signature holds, its subjects are the signed "
                   "files and model-signing's subject, its predicate is this manifest's evaluation")


def _exit_unless_released(folder: Path, m, allow_blocked: bool) -> None:
    """Exit 1 when the signed decision is not 'release', unless --allow-blocked."""
    if m.decision.decision != "release" and not allow_blocked:
        err.print(f"[bold red]NOT RELEASED[/] {escape(str(folder))}: the signed decision is "
                  f"'{m.decision.decision}'; pass --allow-blocked to check integrity alone", highlight=False,
                  soft_wrap=True)
        raise typer.Exit(1)


def _verify_here(folder: Path, manifest, allow: tuple[str, ...], serving_python: Optional[Path]) -> None:
    """This host against the hosts the release was validated on (release/host_match)."""
    from quantlab.recipe.serve import ServeSpec
    from quantlab.release.host_match import host_line, judge, probe_host
    from quantlab.serving.vllm_probe import probe_serving_env, serving_python as find_python

    python = find_python(ServeSpec(python=str(serving_python) if serving_python else None))
    probe = probe_serving_env(python)
    try:
        verdict = judge(manifest, probe, allow=allow)
    except ValueError as e:
        raise RecipeError(str(e)) from None
    typer.echo(f"this host: {host_line(probe_host(probe))}")
    if verdict.covered_by is not None:
        typer.echo(f"host covered: it matches the hardware and runtime of serve target '{verdict.covered_by}'"
                   + (f" (accepted: {', '.join(d.line() for d in verdict.allowed)})" if verdict.allowed else ""))
        return
    err.print(f"[bold red]HOST NOT COVERED[/] {escape(str(folder))}: this host differs from every host the release "
              "was validated on", highlight=False, soft_wrap=True)
    for target, diffs in verdict.differences.items():
        for d in diffs:
            err.print(f"  - {escape(target)}: {escape(d.line())}", highlight=False, soft_wrap=True)
    err.print("  validate the checkpoint on this host (quantlab validate), or accept a difference with --allow NAME",
              highlight=False, soft_wrap=True)
    raise typer.Exit(1)


@app.command()
def keygen(
    private_key: Annotated[Path, typer.Argument(help="Where to write the PEM private key (mode 0600).")],
    public_key: Annotated[Optional[Path], typer.Option(help="Where to write the public key "
                                                       "(default: PRIVATE with .pub.pem).")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace existing files.")] = False,
) -> None:
    """Create an EC P-256 key pair for signing release manifests (signing.private_key)."""
    from quantlab.release.manifest import generate_keypair, public_key_fingerprint

    with exit_codes():
        pub = public_key or private_key.with_suffix(".pub.pem")
        generate_keypair(private_key, pub, overwrite=overwrite)
        typer.echo(f"private key: {private_key} (keep it secret)\npublic key:  {pub}\n"
                   f"fingerprint: {public_key_fingerprint(pub.read_bytes())}")


@app.command("manifest-schema")
def manifest_schema(
    attestation: Annotated[bool, typer.Option(help="Print the JSON Schema of the attestation's in-toto predicate "
                                              "instead.")] = False,
) -> None:
    """Print the JSON Schema of the release manifest (or of the attestation's predicate)."""
    if attestation:
        from quantlab.release.attestation_predicate import json_schema
    else:
        from quantlab.release.manifest import json_schema

    sys.stdout.write(json.dumps(json_schema(), indent=2) + "\n")


@app.command("default-model")
def default_model() -> None:
    """Build (once) and print the folder of the embedded default model, SmolLM2-135M-Instruct."""
    from quantlab.models.source import build_default_model

    with exit_codes():
        resolved = build_default_model(progress=progress)
    typer.echo(str(resolved.path))
