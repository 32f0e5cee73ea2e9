"""The `quantlab` command line: parse, call the pipeline, map errors to exit codes.

Exit codes: 0 released/ok, 1 blocked by a gate, 2 bad input, 3 engine or run failure,
130 interrupted. Engines are imported lazily so --help and `recipes check` are instant.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from quantlab import __version__
from quantlab.errors import QuantlabError, RecipeError

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Quantize an LLM from a recipe, serve it on vLLM, and gate its release.")
recipes_app = typer.Typer(no_args_is_help=True, help="Validate, list and describe recipe files.")
app.add_typer(recipes_app, name="recipes")

out = Console()
err = Console(stderr=True)
SHIPPED_RECIPES = Path(__file__).resolve().parent.parent / "recipes"


def progress(msg: str) -> None:
    err.print(f"[bold cyan]quantlab[/] {msg}", highlight=False)


def _fail(e: BaseException) -> typer.Exit:
    if isinstance(e, KeyboardInterrupt):
        err.print("[yellow]interrupted[/]")
        return typer.Exit(130)
    assert isinstance(e, QuantlabError)
    err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
    return typer.Exit(e.exit_code)


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


@app.command()
def quantize(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML file.")],
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Checkpoint folder to write.")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output folder.")] = False,
) -> None:
    """Calibrate and quantize a model with llm-compressor; write a compressed-tensors checkpoint."""
    from quantlab.recipe import load_recipe

    try:
        loaded = load_recipe(recipe)
        from quantlab.stages.quantize import default_output_dir, quantize as run_quantize

        result = run_quantize(loaded, output or default_output_dir(loaded), overwrite=overwrite, progress=progress)
    except (QuantlabError, KeyboardInterrupt) as e:
        raise _fail(e) from None
    typer.echo(result["checkpoint"]["path"])  # plain: scripts read this line


@app.command()
def run(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML file.")],
    runs_dir: Annotated[Path, typer.Option(help="Root folder for run directories.")] = Path("runs"),
    resume: Annotated[Optional[str], typer.Option(
        help="Resume a run: its directory, or 'latest' for this recipe's newest run.")] = None,
) -> None:
    """Run the whole pipeline for a recipe, writing runs/<name>/<id>/run.json after each stage."""
    from quantlab.pipeline import run_pipeline
    from quantlab.recipe import load_recipe
    from quantlab.run import RunDir

    try:
        loaded = load_recipe(recipe)
        resume_path = None
        if resume == "latest":
            resume_path = RunDir.latest(runs_dir, loaded.recipe.name)
            if resume_path is None:
                raise RecipeError(f"no earlier run of '{loaded.recipe.name}' under {runs_dir} to resume")
        elif resume:
            resume_path = Path(resume)
        result = run_pipeline(loaded, runs_dir, resume=resume_path, progress=progress)
    except (QuantlabError, KeyboardInterrupt) as e:
        raise _fail(e) from None
    typer.echo(str(result.path / "run.json"))


@app.command()
def serve(
    target: Annotated[Path, typer.Argument(help="A checkpoint folder, or a recipe (serves its latest run's checkpoint).")],
    recipe: Annotated[Optional[Path], typer.Option(help="Take the serve settings from this recipe.")] = None,
    baseline: Annotated[bool, typer.Option(help="With a recipe: serve its unquantized model instead.")] = False,
    runs_dir: Annotated[Path, typer.Option(help="Where `quantlab run` keeps runs.")] = Path("runs"),
    log_dir: Annotated[Optional[Path], typer.Option(help="Folder for the server log (default: a temp folder).")] = None,
) -> None:
    """Serve a checkpoint on vLLM in the foreground, print its URL and engine facts; Ctrl-C stops it."""
    import tempfile
    import time

    from quantlab.recipe import ServeSpec, load_recipe

    try:
        dtype, spec, role = "bfloat16", ServeSpec(), "candidate"
        if target.suffix in (".yaml", ".yml"):
            loaded = load_recipe(target)
            spec, dtype = loaded.recipe.serve, loaded.recipe.model.dtype
            if baseline:
                from quantlab.models import resolve_model

                r = loaded.recipe
                model_dir, role = resolve_model(r.model.source, base_dir=loaded.base_dir, revision=r.model.revision,
                                                progress=progress).path, "baseline"
            else:
                from quantlab.pipeline import CHECKPOINT_DIR
                from quantlab.run import RunDir

                latest = RunDir.latest(runs_dir, loaded.recipe.name)
                model_dir = latest / CHECKPOINT_DIR if latest else None
                if model_dir is None or not (model_dir / "config.json").is_file():
                    raise RecipeError(f"no quantized checkpoint for '{loaded.recipe.name}' under {runs_dir}: run "
                                      f"`quantlab run {target}` first, pass a checkpoint folder, or use --baseline")
        else:
            model_dir = target
        if recipe is not None:
            loaded_settings = load_recipe(recipe).recipe
            spec, dtype = loaded_settings.serve, loaded_settings.model.dtype
        from quantlab.stages.serve import EngineTarget, collect_facts, open_engine, preflight_serving

        t = EngineTarget(role, Path(model_dir), role)
        _, device, engine_args, compat = preflight_serving(spec, [t], dtype=dtype, progress=progress)
        log_dir = log_dir or Path(tempfile.mkdtemp(prefix="quantlab-serve-"))
        with open_engine(spec, t, device=device, engine_args=engine_args, log_dir=log_dir,
                         progress=progress) as server:
            facts = collect_facts(server, quant_config=t.quant_config, device=device)
            # plain stdout (no wrapping): scripts read the JSON and the URL line
            typer.echo(json.dumps({"url": server.base_url, "model": role, "device": device,
                                   "engine_args": engine_args, "compat": compat[role], "facts": facts}, indent=2))
            typer.echo(f"serving {model_dir} as '{role}' at {server.base_url}/v1 (Ctrl-C to stop)")
            try:
                while True:
                    server.ensure_alive("while serving")
                    time.sleep(1)
            except KeyboardInterrupt:
                err.print("stopping the server")
        # Ctrl-C is how a foreground server is meant to end: a clean stop exits 0.
    except (QuantlabError, KeyboardInterrupt) as e:
        raise _fail(e) from None


@app.command("default-model")
def default_model() -> None:
    """Build (once) and print the folder of the embedded default model, SmolLM2-135M-Instruct."""
    from quantlab.models import build_default_model

    try:
        resolved = build_default_model(progress=progress)
    except QuantlabError as e:
        raise _fail(e) from None
    typer.echo(str(resolved.path))


@recipes_app.command("check")
def recipes_check(
    files: Annotated[list[Path], typer.Argument(help="Recipe files to validate.")],
    preflight: Annotated[bool, typer.Option(
        help="Also check the recipe against the model's layer layout (reads the model config, "
        "no weights; builds the default model once if needed).")] = False,
) -> None:
    """Validate recipes: schema, method/scheme combination, calibration files."""
    from quantlab.calibration import read_rows
    from quantlab.recipe import load_recipe

    failed = 0
    for f in files:
        try:
            loaded = load_recipe(f)
            for i, p in enumerate(loaded.calibration_paths()):
                read_rows(p, field_path=f"calibration.datasets.{i}.path")
            if preflight:
                from quantlab.models import resolve_model
                from quantlab.preflight import run_preflight
                from quantlab.stages.quantize import model_layout

                r = loaded.recipe
                model = resolve_model(r.model.source, base_dir=loaded.base_dir, revision=r.model.revision,
                                      progress=progress)
                run_preflight(r, model_layout(model.path, trust_remote_code=r.model.trust_remote_code),
                              file=str(f))
            out.print(f"[green]ok[/]   {f}", highlight=False)
        except QuantlabError as e:
            failed += 1
            err.print(f"[red]fail[/] {escape(str(e))}", highlight=False)
    if failed:
        raise typer.Exit(2)


@recipes_app.command("schema")
def recipes_schema() -> None:
    """Print the recipe JSON Schema (for editor completion and validation)."""
    from quantlab.recipe import json_schema

    sys.stdout.write(json.dumps(json_schema(), indent=2) + "\n")


@recipes_app.command("list")
def recipes_list(
    directory: Annotated[Path, typer.Option("--dir", help="Folder of recipes.")] = SHIPPED_RECIPES,
) -> None:
    """List recipes with their method, scheme and one-line description."""
    from quantlab.recipe import load_recipe

    if not directory.is_dir():
        err.print(f"no recipe folder at {directory}")
        raise typer.Exit(2)
    for f in sorted(directory.glob("*.yaml")):
        try:
            r = load_recipe(f).recipe
            q = r.quantization
            what = f"{q.method} {q.scheme or ''}".strip() + (" +kv-fp8" if q.kv_cache else "")
            first = (r.description.strip().splitlines() or [""])[0]
            out.print(f"{f.name:<28} {what:<26} {first}", highlight=False, soft_wrap=True)
        except QuantlabError as e:
            out.print(f"{f.name:<28} [red]invalid[/]: {escape(str(e).splitlines()[0])}", highlight=False)


if __name__ == "__main__":
    app()
