"""The `quantlab` command line: parse, call the pipeline, map errors to exit codes.

Exit codes: 0 released/ok, 1 blocked by a gate, 2 bad input, 3 engine or run failure
(an unexpected error too: one line here, the traceback in a file), 130 interrupted
(Ctrl-C or SIGTERM). The CLI calls quantlab.pipeline.loop only; engines are imported lazily
so --help and `recipes check` are instant.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from quantlab.core.version import __version__

from quantlab.core import cpu_emulation
from quantlab.core.errors import QuantlabError, RecipeError
from quantlab.core.progress import TerminalProgress

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Quantize an LLM from a recipe, serve it on vLLM, and gate its release.")
recipes_app = typer.Typer(no_args_is_help=True, help="Validate, list and describe recipe files.")
app.add_typer(recipes_app, name="recipes")

out = Console()
err = Console(stderr=True)
SHIPPED_RECIPES = Path(__file__).resolve().parent.parent / "recipes"


# One line per message; long steps are bars on a terminal and plain lines in CI logs.
progress = TerminalProgress(err)


def _crash_log(err: BaseException) -> Path:
    from quantlab.core.fsutil import write_text_atomic
    from quantlab.core.layout import cache_dir

    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    path = cache_dir() / "logs" / f"crash-{stamp}.txt"
    write_text_atomic(path, "".join(traceback.format_exception(err)))
    return path


@contextlib.contextmanager
def exit_codes() -> Iterator[None]:
    """Map every way a command can end to the README's exit codes."""
    try:
        yield
    except typer.Exit:
        raise
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]")
        raise typer.Exit(130) from None
    except QuantlabError as e:
        err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        raise typer.Exit(e.exit_code) from None
    except Exception as e:  # a bug or an unforeseen engine failure: a run failure, never "blocked"
        try:
            where = f"traceback in {_crash_log(e)}"
        except OSError as log_err:
            where = f"traceback could not be written: {log_err}"
        line = "".join(traceback.format_exception_only(type(e), e)).strip().splitlines()[-1]
        err.print(f"[bold red]error:[/] unexpected {escape(line)} ({escape(where)})", highlight=False, soft_wrap=True)
        raise typer.Exit(3) from None


def _version(value: bool) -> None:
    if value:
        out.print(f"quantlab {__version__}")
        raise typer.Exit(0)


def _sigterm_as_interrupt() -> None:
    import signal

    def handler(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


@app.callback()
def main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                               help="Print the version and exit.")] = False) -> None:
    _sigterm_as_interrupt()  # a stopped CI job still stops the servers it started
    with exit_codes():  # QUANTLAB_EMULATE_CPU=avx2: torch's limits must be set before torch loads
        cpu_emulation.apply(os.environ)


@app.command()
def quantize(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML file.")],
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Checkpoint folder to write.")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output folder.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show llm-compressor's own output here "
                                          "instead of in <output>.llmcompressor.log.")] = False,
) -> None:
    """Calibrate and quantize a model with llm-compressor; write a compressed-tensors checkpoint."""
    from quantlab.pipeline.loop import default_output_dir, quantize_only
    from quantlab.recipe.file import load_recipe

    with exit_codes():
        loaded = load_recipe(recipe)
        result = quantize_only(loaded, output or default_output_dir(loaded), overwrite=overwrite, progress=progress,
                               verbose=verbose)
    typer.echo(result["checkpoint"]["path"])  # plain: scripts read this line


@app.command()
def sensitivity(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML file: its model, scheme, targets and ignore, and its "
                                           "calibration files (held-out rows are read).")],
    granularity: Annotated[str, typer.Option(help="layer: a decoder layer's modules together; module: each "
                                             "alone.")] = "layer",
    method: Annotated[str, typer.Option(help="alone: each group quantized by itself; restored: the rest "
                                        "quantized, each group kept (what keeping it buys back).")] = "alone",
    texts: Annotated[Optional[int], typer.Option(help="Held-out sequences (default 8 of calibration text, 32 "
                                                 "answers with --answers-from).")] = None,
    tokens: Annotated[int, typer.Option(help="Tokens per sequence (the most, with --answers-from).")] = 256,
    answers_from: Annotated[Optional[Path], typer.Option(
        help="A run folder (runs/<recipe>/<id>/): score KL on the baseline's answers to its evaluation prompts, "
        "those of the tasks that failed there, instead of on calibration text.")] = None,
    tasks: Annotated[Optional[str], typer.Option(
        help="With --answers-from: these tasks' samples (comma-separated) instead of the failed ones.")] = None,
    losses_from: Annotated[Optional[Path], typer.Option(
        help="A checkpoint folder quantlab quantized with GPTQ: its per-module losses join the table.")] = None,
    runs_dir: Annotated[Path, typer.Option(help="Root folder for outputs (sensitivity/<recipe>/<id>/).")] = \
        Path("runs"),
    top: Annotated[int, typer.Option(help="Rows of the table printed here (all are in the JSON).")] = 10,
) -> None:
    """Rank the parts of the model by how far quantizing each alone moves it: next-token KL
    against the unquantized model on held-out text (or, with --answers-from, on the baseline's
    answers to a blocked run's failing prompts), in-process, no server. Writes
    sensitivity.json, sensitivity.md and sensitivity.png; prints the table's top rows."""
    from pydantic import ValidationError

    from quantlab.pipeline.loop import sensitivity_only
    from quantlab.recipe.file import load_recipe
    from quantlab.search.ranking import markdown
    from quantlab.recipe.sensitivity import SensitivitySpec

    with exit_codes():
        try:
            if tasks and not answers_from:
                raise RecipeError("--tasks picks a run's samples: give the run with --answers-from RUN_DIR",
                                  field="--tasks")
            spec = SensitivitySpec(granularity=granularity, method=method, texts=texts, tokens=tokens,
                                   answers_from=str(answers_from) if answers_from else None,
                                   tasks=[t.strip() for t in tasks.split(",") if t.strip()] if tasks else None)
        except ValidationError as e:
            problems = "; ".join(f"--{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors())
            raise RecipeError(f"sensitivity options: {problems}") from None
        folder, result = sensitivity_only(load_recipe(recipe), runs_dir, spec, losses_from=losses_from,
                                          progress=progress)
        for line in markdown(result, top=top).splitlines():
            err.print(escape(line), highlight=False, soft_wrap=True)
    typer.echo(str(folder / "sensitivity.json"))


@app.command()
def search(
    recipe: Annotated[Path, typer.Argument(help="A recipe whose candidate is blocked (its gates are the bar).")],
    sensitivity: Annotated[Optional[Path], typer.Option(
        help="The ranking: a sensitivity.json of this recipe (default: computed first, layer groups).")] = None,
    max_layers: Annotated[Optional[int], typer.Option(
        help="The most layer groups a trial may keep unquantized (default: a quarter of them).")] = None,
    width: Annotated[int, typer.Option(help="Trials a round, served together beside one baseline.")] = 2,
    max_trials: Annotated[int, typer.Option(help="Stop after this many trials.")] = 8,
    time_budget_s: Annotated[Optional[float], typer.Option(
        help="Start no round that would end after this many seconds (from the previous round's time).")] = None,
    knob: Annotated[Optional[list[str]], typer.Option(
        help="SECTION.FIELD=V1,V2,...: the recipe's own setting, choices in order of preference, tried before "
        "any layer is kept (e.g. quantization.group_size=128,64,32); repeatable.")] = None,
    runs_dir: Annotated[Path, typer.Option(help="Root folder for outputs (search/<recipe>/<id>/).")] = Path("runs"),
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show the engines' own output here.")] = False,
) -> None:
    """Find the fewest of the most sensitive layers to keep unquantized so that every
    required gate of the recipe passes: bisection over how many, each round a comparison
    of trials against one baseline. Writes the recipe to commit (the original plus the
    ignore list), search.json, search.md and search.png; the passing trial is released.
    Exit 0 one passed, 1 none passed within the budget, 2 bad input, 3 run failure."""
    from quantlab.recipe.file import load_recipe
    from quantlab.pipeline.search import markdown as search_markdown, run_search

    with exit_codes():
        if width < 1 or max_trials < 1:
            raise RecipeError("--width and --max-trials must be at least 1", field="--width")
        result = run_search(load_recipe(recipe), runs_dir, sensitivity=sensitivity, max_layers=max_layers,
                            width=width, max_trials=max_trials, time_budget_s=time_budget_s,
                            knobs=tuple(knob or ()), progress=progress, verbose=verbose)
        err.print("[bold]search[/]", highlight=False)
        for line in search_markdown(result).splitlines():
            err.print(f"  {escape(line)}", highlight=False, soft_wrap=True)
    typer.echo(str(Path(result["folder"]) / "search.json"))
    if not result["passed"]:
        raise typer.Exit(1)


@app.command()
def run(
    recipes: Annotated[list[Path], typer.Argument(help="Recipe YAML file; several: compare them as candidates "
                                                  "against one baseline and choose one.")],
    runs_dir: Annotated[Path, typer.Option(help="Root folder for run directories.")] = Path("runs"),
    resume: Annotated[Optional[str], typer.Option(
        help="Resume a run: its directory, or 'latest' for this recipe's newest run.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show the engines' own output here instead "
                                          "of in the run folder's logs/.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check the recipe and run every preflight, print the "
                                          "plan with estimated seconds; start nothing.")] = False,
    checkpoint: Annotated[Optional[list[str]], typer.Option(
        "--checkpoint", help="NAME=DIR (or DIR): an existing checkpoint as one more candidate, judged by the first "
        "recipe's checks; repeatable.")] = None,
) -> None:
    """Quantize, serve baseline and candidate, run the checks, sign the release (runs/<name>/<id>/).

    With several recipes: each is a candidate against one shared baseline (one baseline
    server, its results computed once, performance measured in interleaved blocks); the
    recipes' `selection` rule chooses among the released ones (runs/compare/<id>/).
    Exit 0 released (or one chosen), 1 blocked by a gate (or none released), 2 bad input,
    3 run failure, 130 interrupted."""
    from quantlab.recipe.file import load_recipe
    from quantlab.core.run import RunDir

    with exit_codes():
        if len(recipes) > 1 or checkpoint:
            if resume or dry_run:
                raise RecipeError("--resume and --dry-run take one recipe; a comparison of several starts afresh "
                                  "(checkpoints and baseline results still come from the cache)")
            _compare_with_summary(recipes, runs_dir, verbose=verbose, checkpoints=named_checkpoints(checkpoint))
            return
        loaded = load_recipe(recipes[0])
        if dry_run:
            _print_plan(loaded, runs_dir)
            return
        resume_path = None
        if resume == "latest":
            resume_path = RunDir.latest(runs_dir, loaded.recipe.name)
            if resume_path is None:
                raise RecipeError(f"no earlier run of '{loaded.recipe.name}' under {runs_dir} to resume")
        elif resume:
            resume_path = Path(resume)
        _run_with_summary(loaded, runs_dir, resume=resume_path, verbose=verbose)


def named_checkpoints(values: list[str] | None) -> dict[str, Path]:
    """--checkpoint NAME=DIR (or DIR, named after its folder) -> {name: folder}."""
    import re

    named: dict[str, Path] = {}
    for value in values or []:
        name, sep, folder = value.partition("=")
        if not sep or Path(value).is_dir():  # a folder whose path holds '=' is a folder
            folder, name = value, re.sub(r"[^a-z0-9._-]+", "-", Path(value).resolve().name.lower()).strip("-._")
        if not name or not folder:
            raise RecipeError(f"--checkpoint {value!r}: expected NAME=DIR or DIR", field="--checkpoint")
        if name in named:
            raise RecipeError(f"--checkpoint: two checkpoints are named '{name}' ({named[name]} and {folder}); "
                              "name them apart with NAME=DIR", field="--checkpoint")
        named[name] = Path(folder)
    return named


def _compare_with_summary(files: list[Path], runs_dir: Path, *, verbose: bool,
                          checkpoints: dict[str, Path] | None = None, judge_by: Path | None = None) -> None:
    """Several candidates, one baseline: the comparison, its table, then one line on the choice."""
    from quantlab.pipeline.candidates.run import run_comparison

    result = run_comparison(files, runs_dir, checkpoints=checkpoints, judge_by=judge_by, progress=progress,
                            verbose=verbose)
    err.print("[bold]comparison[/]", highlight=False)
    for line in result.table_md.rstrip().splitlines():
        err.print(f"  {escape(line)}", highlight=False, soft_wrap=True)
    err.print(f"  report: {escape(str(result.folder / 'comparison.md'))}", highlight=False, soft_wrap=True)
    typer.echo(str(result.folder / "comparison.json"))
    if result.exit_code:
        raise typer.Exit(result.exit_code)


@app.command()
def validate(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML file (its quantization section is not used).")],
    checkpoint: Annotated[list[str], typer.Option(
        help="The checkpoint folder to validate: compressed-tensors, GPTQ, AWQ or FP8 safetensors, as vLLM serves "
        "them. Repeat it (NAME=DIR or DIR) to compare several against one baseline and choose one.")],
    runs_dir: Annotated[Path, typer.Option(help="Root folder for run directories.")] = Path("runs"),
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show the engines' own output here.")] = False,
) -> None:
    """Validate an existing checkpoint: serve it beside the recipe's baseline, run the checks, sign.

    The checkpoint is copied into the run folder first (the original is not modified).
    With several --checkpoint: each is a candidate against one baseline, as `quantlab run a.yaml b.yaml` compares.
    Exit 0 released, 1 blocked by a gate, 2 bad input, 3 run failure, 130 interrupted."""
    from quantlab.recipe.file import load_recipe

    with exit_codes():
        named = named_checkpoints(checkpoint)
        if len(named) > 1:
            _compare_with_summary([], runs_dir, verbose=verbose, checkpoints=named, judge_by=recipe)
            return
        _run_with_summary(load_recipe(recipe), runs_dir, verbose=verbose, checkpoint=next(iter(named.values())))


def _run_with_summary(loaded, runs_dir: Path, **kwargs) -> None:
    """The pipeline, then the run's summary whatever its outcome, then the record's path."""
    from quantlab.pipeline.loop import run_pipeline

    try:
        result = run_pipeline(loaded, runs_dir, progress=progress, **kwargs)
    except BaseException as e:
        _summary(getattr(e, "run_dir", None))
        raise
    _summary(result.path)
    typer.echo(str(result.path / "run.json"))


def _print_plan(loaded, runs_dir: Path, checkpoint: Path | None = None) -> None:
    from quantlab.pipeline.loop import dry_run

    plan = dry_run(loaded, runs_dir, progress=progress, checkpoint=checkpoint)
    typer.echo(f"plan for {loaded.recipe.name} (preflights passed; nothing was started):")
    total, unknown = 0.0, []
    for step in plan:
        est = step["estimate_s"]
        if step["stage"] == "quantize" and step["reuses"]:
            est, when = 0.0, "~0 s (cached)"  # a copy of the cached checkpoint
        elif est is None:
            unknown.append(step["stage"])
            when = "no estimate (not run ok before)"
        else:
            when = f"~{est:.0f} s (run {step['from_run']})"
        total += est or 0.0
        why = step["why"] + (f"; {step['reuses']}" if step["reuses"] else "")
        typer.echo(f"  {step['stage']:<12} {when:<44} {why}")
        for line in step["details"]:
            typer.echo(f"      {line}")
    typer.echo(f"  estimated total: ~{total:.0f} s" + (f" plus {', '.join(unknown)}" if unknown else ""))


def _summary(run_dir: Path | None) -> None:
    """The run's last lines on the terminal: stages, decision, where the report is."""
    from quantlab.reports.report import summary_lines
    from quantlab.core.run import RunDir

    if run_dir is None:
        return
    try:
        run = RunDir.open(run_dir)
    except QuantlabError:
        return
    err.print("[bold]summary[/]", highlight=False)
    for line in summary_lines(run.record, run.path):
        err.print(f"  {escape(line)}", highlight=False, soft_wrap=True)


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="A run folder (it holds run.json).")],
) -> None:
    """Re-render a run's reports (report.md, report.html, junit.xml) from its record; runs nothing."""
    from quantlab.reports.report import write_reports
    from quantlab.core.run import RunDir

    with exit_codes():
        run = RunDir.open(run_dir)
        for path in write_reports(run.path, run.record).values():
            typer.echo(str(path))


@app.command()
def serve(
    target: Annotated[Path, typer.Argument(
        help="A checkpoint folder, or a recipe (serves its latest run's checkpoint).")],
    recipe: Annotated[Optional[Path], typer.Option(help="Take the serve settings from this recipe.")] = None,
    baseline: Annotated[bool, typer.Option(help="With a recipe: serve its unquantized model instead.")] = False,
    runs_dir: Annotated[Path, typer.Option(help="Where `quantlab run` keeps runs.")] = Path("runs"),
    log_dir: Annotated[Optional[Path], typer.Option(help="Folder for the server log (default: a temp folder).")] = None,
) -> None:
    """Serve a checkpoint on vLLM in the foreground, print its URL and engine facts; Ctrl-C stops it (exit 0)."""
    import tempfile
    import time

    from quantlab.pipeline.loop import latest_checkpoint, serve_one
    from quantlab.recipe.file import load_recipe
    from quantlab.recipe.serve import ServeSpec

    with exit_codes():
        dtype, spec, role = "bfloat16", ServeSpec(), "candidate"
        if target.suffix in (".yaml", ".yml"):
            loaded = load_recipe(target)
            spec, dtype = loaded.recipe.serve, loaded.recipe.model.dtype
            if baseline:
                from quantlab.models.source import resolve_recipe_model

                model_dir, role = resolve_recipe_model(loaded, progress=progress).path, "baseline"
            else:
                model_dir = latest_checkpoint(runs_dir, loaded)
        elif baseline:
            raise RecipeError("--baseline needs a recipe (its model is the baseline), not a checkpoint folder")
        else:
            model_dir = target
        if recipe is not None:
            settings = load_recipe(recipe).recipe
            spec, dtype = settings.serve, settings.model.dtype
        if spec.mode == "endpoint":
            raise RecipeError("`quantlab serve` starts a server; this recipe's serve.mode is 'endpoint' (a server "
                              "that already runs). Use a recipe with mode launch or command", field="serve.mode")
        log_dir = log_dir or Path(tempfile.mkdtemp(prefix="quantlab-serve-"))
        with serve_one(Path(model_dir), role, spec, dtype=dtype, log_dir=log_dir, progress=progress) as (server,
                                                                                                         facts):
            # plain stdout (no wrapping): scripts read the JSON and the URL line
            typer.echo(json.dumps(facts, indent=2))
            typer.echo(f"serving {model_dir} as '{server.served_name}' at {server.base_url}/v1 (Ctrl-C to stop)")
            try:
                while True:
                    server.ensure_alive("while serving")
                    time.sleep(1)
            except KeyboardInterrupt:
                err.print("stopping the server")
        # Ctrl-C is how a foreground server is meant to end: a clean stop exits 0.


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
) -> None:
    """Check a released folder: the signature, every file hash, no file added, missing or
    linked, the signer the manifest names, and that the decision follows from the gate
    verdicts. Exit 0 verified and released, 1 not verified (or verified but blocked, unless
    --allow-blocked), 2 bad input."""
    from quantlab.release.manifest import read_manifest, verify_folder

    with exit_codes():
        if not folder.is_dir():
            raise RecipeError(f"{folder} is not a folder; pass the released checkpoint folder")
        for p in [public_key, *(certificate_chain or [])]:
            if p is not None and not p.is_file():
                raise RecipeError(f"key or certificate file not found: {p}")
        problems = verify_folder(folder, public_key=public_key, certificate_chain=certificate_chain,
                                 sigstore_identity=sigstore_identity, sigstore_issuer=sigstore_issuer)
        if problems:
            err.print(f"[bold red]NOT VERIFIED[/] {escape(str(folder))}: {len(problems)} problem(s)", highlight=False,
                      soft_wrap=True)
            for p in problems:
                err.print(f"  - {escape(p)}", highlight=False, soft_wrap=True)
            raise typer.Exit(1)
        m = read_manifest(folder)
        typer.echo(f"verified {folder}: {len(m.checkpoint_files)} files and the manifest match the signature; "
                   f"decision '{m.decision.decision}' ({m.decision.why})")
        if m.signer is not None and m.signer.key_fingerprint:
            typer.echo(f"signed by key {m.signer.key_fingerprint}"
                       + (" (quantlab's local development key: not for shipping)" if m.signer.development_key
                          else ""))
        if m.decision.decision != "release" and not allow_blocked:
            err.print(f"[bold red]NOT RELEASED[/] {escape(str(folder))}: the signed decision is "
                      f"'{m.decision.decision}'; pass --allow-blocked to check integrity alone", highlight=False,
                      soft_wrap=True)
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
def manifest_schema() -> None:
    """Print the JSON Schema of the release manifest."""
    from quantlab.release.manifest import json_schema

    sys.stdout.write(json.dumps(json_schema(), indent=2) + "\n")


@app.command("default-model")
def default_model() -> None:
    """Build (once) and print the folder of the embedded default model, SmolLM2-135M-Instruct."""
    from quantlab.models.source import build_default_model

    with exit_codes():
        resolved = build_default_model(progress=progress)
    typer.echo(str(resolved.path))


@recipes_app.command("check")
def recipes_check(
    files: Annotated[list[Path], typer.Argument(help="Recipe files to validate.")],
    preflight: Annotated[bool, typer.Option(
        help="Also check the recipe against the model's layer layout (reads the model config, no "
        "weights; builds the default model once if needed) and whether the serving environment can "
        "serve the scheme it will export.")] = False,
) -> None:
    """Validate recipes: schema, method/scheme combination, calibration files."""
    from quantlab.quantize.calibration import read_rows
    from quantlab.recipe.file import load_recipe

    failed = 0
    with exit_codes():
        for f in files:
            try:
                loaded = load_recipe(f)
                for i, p in enumerate(loaded.calibration_paths()):
                    read_rows(p, field_path=f"calibration.datasets.{i}.path")
                if loaded.recipe.quality is not None:
                    from quantlab.quality.traffic import load_rows

                    for t in loaded.recipe.quality.traffic:  # every row checked, schemas and scorers found
                        load_rows(loaded.resolve(t.path))
                notes = []
                if preflight:
                    from quantlab.pipeline.loop import preflight_recipe

                    notes = preflight_recipe(loaded, progress=progress)
                out.print(f"[green]ok[/]   {f}", highlight=False)
                for note in notes:
                    out.print(f"     note: {escape(note)}", highlight=False)
            except QuantlabError as e:
                failed += 1
                err.print(f"[red]fail[/] {escape(str(e))}", highlight=False)
        if failed:
            raise typer.Exit(2)


@recipes_app.command("servable")
def recipes_servable(
    files: Annotated[list[Path], typer.Argument(help="Recipe files, in order of preference.")],
) -> None:
    """Print the first recipe whose scheme this host's serving engine can serve (for
    scripts: `quantlab run $(quantlab recipes servable a.yaml b.yaml)`); say on stderr why
    each one before it was passed over. Exit 2 when none can be served here."""
    from quantlab.pipeline.loop import first_servable

    with exit_codes():
        chosen, refused = first_servable(files)
        for f, why in refused.items():
            err.print(f"[yellow]passed over[/] {f}: {escape(why)}", highlight=False, soft_wrap=True)
        if chosen is None:
            raise RecipeError(f"none of {len(files)} recipe(s) can be served by the serving engine on this host "
                              "(reasons above)")
        if refused:
            err.print(f"[green]chosen[/] {chosen}: the first of the given recipes this host can serve",
                      highlight=False)
        sys.stdout.write(f"{chosen}\n")


@recipes_app.command("schema")
def recipes_schema() -> None:
    """Print the recipe JSON Schema (for editor completion and validation)."""
    from quantlab.recipe.file import json_schema

    sys.stdout.write(json.dumps(json_schema(), indent=2) + "\n")


@recipes_app.command("list")
def recipes_list(
    directory: Annotated[Path, typer.Option("--dir", help="Folder of recipes.")] = SHIPPED_RECIPES,
) -> None:
    """List recipes with their method, scheme and one-line description."""
    from quantlab.recipe.file import load_recipe

    if not directory.is_dir():
        err.print(f"no recipe folder at {directory}")
        raise typer.Exit(2)
    files = sorted(directory.glob("*.yaml"))
    width = max((len(f.name) for f in files), default=0)
    for f in files:
        try:
            r = load_recipe(f).recipe
            q = r.quantization
            what = f"{q.method} {q.scheme or ''}".strip() + (" +kv-fp8" if q.kv_cache else "")
            first = (r.description.strip().splitlines() or [""])[0]
            out.print(f"{f.name:<{width}} {what:<26} {first}", highlight=False, soft_wrap=True)
        except QuantlabError as e:
            out.print(f"{f.name:<{width}} [red]invalid[/]: {escape(str(e).splitlines()[0])}", highlight=False)


if __name__ == "__main__":
    app()
