"""The commands that quantize, serve and run the checks: quantize, sensitivity, search,
run, validate, report, serve."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape


from quantlab.core.errors import QuantlabError, RecipeError
from quantlab.cli.base import app, err, exit_codes, progress
from quantlab.cli.candidate_options import declared_family, named_checkpoints, refuse_alone
from quantlab.cli.plans import print_plan, print_plans
from quantlab.cli.executor_option import compare, executor_for


@app.command()
def quantize(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML file.")],
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Checkpoint folder to write.")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output folder.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show llm-compressor's own output here "
                                          "instead of in <output>.llmcompressor.log.")] = False,
) -> None:
    """Calibrate and quantize a model with llm-compressor; write a compressed-tensors checkpoint."""
    from quantlab.pipeline.commands import default_output_dir, quantize_only
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

    from quantlab.search.sensitivity import run_sensitivity
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
        folder, result = run_sensitivity(load_recipe(recipe), runs_dir, spec, losses_from=losses_from,
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
    schemes: Annotated[str, typer.Option(
        help="Other methods and schemes, tried first and cheapest first (the cost selection.rule ranks: weight "
        "bytes, or each scheme's kernel time measured on the target): shipped recipe "
        "names or recipe files, comma-separated; 'auto' (gptq-w4a16, awq-w4a16, smoothquant-gptq-w8a8, "
        "rtn-w8a16, fp8-dynamic); 'none' for the recipe's own scheme only. A scheme the preflight refuses uses "
        "no trial.")] = "auto",
    runs_dir: Annotated[Path, typer.Option(help="Root folder for outputs (search/<recipe>/<id>/).")] = Path("runs"),
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show the engines' own output here.")] = False,
    ray: Annotated[Optional[str], typer.Option(
        "--ray", help="Run each round's trials as tasks on this Ray cluster (as `quantlab run --ray`); the "
        "sensitivity ranking is computed here.")] = None,
    storage: Annotated[Optional[Path], typer.Option(
        help="With --ray: a folder every node sees; default <runs-dir>/storage with --ray local.")] = None,
    ray_cpus: Annotated[int, typer.Option(min=1, help="With --ray: the CPUs each trial's task asks of its "
                                          "node.")] = 1,
) -> None:
    """Find the cheapest variant of the recipe that passes every required gate: other
    methods and schemes first (--schemes, default auto; cheapest first); then --knob choices; then
    the fewest of the most sensitive layers kept unquantized (bisection over how many).
    Each round is a comparison of trials against one baseline server, kept up across
    rounds. Writes the recipe to commit (the original plus the scheme's sections or the
    ignore list), search.json, search.md and search.png; the passing trial is released.
    Exit 0 one passed, 1 none passed within the budget, 2 bad input, 3 run failure."""
    from quantlab.recipe.file import load_recipe
    from quantlab.pipeline.search import run_search

    with exit_codes():
        settings = _search_settings(sensitivity=sensitivity, max_layers=max_layers, width=width, max_trials=max_trials,
                                    time_budget_s=time_budget_s, knob=knob, schemes=schemes, verbose=verbose)
        loaded = load_recipe(recipe)
        executor = executor_for(ray, storage, runs_dir, ray_cpus)
        with executor:  # with --ray: the cluster joined, the storage folder checked
            result = run_search(loaded, runs_dir, executor=executor, **settings)
        _show_search(result)
    typer.echo(str(Path(result["folder"]) / "search.json"))
    if not result["passed"]:
        raise typer.Exit(1)


def _search_settings(*, sensitivity, max_layers, width: int, max_trials: int, time_budget_s, knob, schemes: str,
                     verbose: bool) -> dict:
    """run_search's settings from the options (bad input when --width or --max-trials is below 1)."""
    if width < 1 or max_trials < 1:
        raise RecipeError("--width and --max-trials must be at least 1", field="--width")
    return dict(sensitivity=sensitivity, max_layers=max_layers, width=width, max_trials=max_trials,
                time_budget_s=time_budget_s, knobs=tuple(knob or ()), progress=progress, verbose=verbose,
                schemes=() if schemes.strip() == "none" else
                tuple(x.strip() for x in schemes.split(",") if x.strip()))


def _show_search(result: dict) -> None:
    """The search's Markdown on the terminal."""
    from quantlab.reports.search_report import markdown as search_markdown

    err.print("[bold]search[/]", highlight=False)
    for line in search_markdown(result).splitlines():
        err.print(f"  {escape(line)}", highlight=False, soft_wrap=True)


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
    ray: Annotated[Optional[str], typer.Option(
        "--ray", help="Run each recipe as a task on a node of this Ray cluster (quantize, serve, checks there; "
        "the choice and signing here): host:port, 'auto' (RAY_ADDRESS, or the one `ray start` made here) or "
        "'local' (start one in this process).")
    ] = None,
    storage: Annotated[Optional[Path], typer.Option(
        help="With --ray: a folder every node sees (NFS, a mounted bucket) for the checkpoints, the shared "
        "cache and the run folders; default <runs-dir>/storage with --ray local.")] = None,
    ray_cpus: Annotated[int, typer.Option(min=1, help="With --ray: the CPUs each candidate's task asks for "
                                          "of its node.")] = 1,
    family: Annotated[Optional[str], typer.Option(
        help="Judge these candidates as members of a family declared across runs (with --family-size): every "
        "member, in any run, at confidence 1 - (1 - c) / N, and at most N members.")] = None,
    family_size: Annotated[Optional[int], typer.Option(
        help="With --family: the most candidates the family will judge, fixed by its first run.")] = None,
    alone: Annotated[bool, typer.Option("--alone", help="Judged alone at the recipe's alpha, not in a stream.")] = False,
) -> None:
    """Quantize, serve baseline and candidate, run the checks, sign the release (runs/<name>/<id>/).

    With several recipes: each is a candidate against one shared baseline (one baseline
    server, its results computed once, performance measured in interleaved blocks); the
    recipes' `selection` rule chooses among the released ones (runs/compare/<id>/).
    Exit 0 released (or one chosen), 1 blocked by a gate (or none released), 2 bad input,
    3 run failure, 130 interrupted."""
    with exit_codes():
        if dry_run and not checkpoint and not resume and (len(recipes) > 1 or ray):
            print_plans(recipes, runs_dir, ray=ray, storage=storage)
            return
        _refuse_run_options(recipes, resume=resume, dry_run=dry_run, checkpoint=checkpoint, ray=ray, alone=alone,
                            family=family, family_size=family_size)
        declared = declared_family(family, family_size, recipes, named_checkpoints(checkpoint)) \
            if family and not dry_run else None
        if ray or len(recipes) > 1 or checkpoint:  # with --ray, a dry run has printed its plans above
            _compare_recipes(recipes, runs_dir, checkpoint=checkpoint, ray=ray, storage=storage, ray_cpus=ray_cpus,
                             verbose=verbose, family=declared)
        else:
            _run_one(recipes[0], runs_dir, resume, dry_run, verbose=verbose, family=declared, alone=alone)


def _refuse_run_options(recipes: list[Path], *, resume, dry_run: bool, checkpoint, ray, alone: bool, family,
                        family_size) -> None:
    """Bad input (exit 2) for options that do not go together, before any work on a cluster."""
    if (len(recipes) > 1 or checkpoint) and (resume or dry_run):  # before any work on a cluster
        raise RecipeError("--resume takes one recipe, and --dry-run recipes without --checkpoint; a "
                          "comparison of several starts afresh (checkpoints and baseline results still come "
                          "from the cache)")
    if ray and (resume or checkpoint):
        raise RecipeError("--ray runs recipes afresh on the cluster's nodes: drop --resume and --checkpoint "
                          "(or drop --ray to resume, or to judge an existing checkpoint here)", field="--ray")
    refuse_alone(alone, several=len(recipes) > 1 or bool(checkpoint) or bool(ray))
    if (family is None) != (family_size is None):
        raise RecipeError("--family and --family-size go together: the family's name and the most candidates "
                          "it will judge", field="--family" if family is None else "--family-size")


def _compare_recipes(recipes: list[Path], runs_dir: Path, *, checkpoint, ray, storage, ray_cpus: int,
                     verbose: bool, family) -> None:
    """The recipes (and --checkpoint's folders) as candidates against one baseline, on the executor named."""
    here_only = {"checkpoints": named_checkpoints(checkpoint)} if checkpoint else {}
    _compare_with_summary(executor_for(ray, storage, runs_dir, ray_cpus), recipes, runs_dir,
                          verbose=verbose, family=family, **here_only)


def _run_one(recipe: Path, runs_dir: Path, resume: str | None, dry_run: bool, *, verbose: bool, family,
             alone: bool) -> None:
    """One recipe: its plan with --dry-run, else its run (resumed with --resume) and summary."""
    from quantlab.recipe.file import load_recipe
    from quantlab.core.run import RunDir

    loaded = load_recipe(recipe)
    if dry_run:
        print_plan(loaded, runs_dir)
        return
    resume_path = None
    if resume == "latest":
        resume_path = RunDir.latest(runs_dir, loaded.recipe.name)
        if resume_path is None:
            raise RecipeError(f"no earlier run of '{loaded.recipe.name}' under {runs_dir} to resume")
    elif resume:
        resume_path = Path(resume)
    run_with_summary(loaded, runs_dir, resume=resume_path, verbose=verbose, family=family, alone=alone)


def _compare_with_summary(executor, files: list[Path], runs_dir: Path, *, verbose: bool, family=None,
                          **here_only) -> None:
    """Several candidates, one baseline: the comparison, its table, then one line on the choice."""
    _show_comparison(compare(executor, files, runs_dir, verbose=verbose, family=family, **here_only))


def _show_comparison(result) -> None:
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
            _compare_with_summary(executor_for(None, None, runs_dir), [], runs_dir, verbose=verbose,
                                  checkpoints=named, judge_by=recipe)
            return
        run_with_summary(load_recipe(recipe), runs_dir, verbose=verbose, checkpoint=next(iter(named.values())))


def run_with_summary(loaded, runs_dir: Path, **kwargs) -> None:
    """The pipeline, then the run's summary whatever its outcome, then the record's path."""
    from quantlab.pipeline.loop import run_pipeline

    try:
        result = run_pipeline(loaded, runs_dir, progress=progress, **kwargs)
    except BaseException as e:
        _summary(getattr(e, "run_dir", None))
        raise
    _summary(result.path)
    typer.echo(str(result.path / "run.json"))


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

    from quantlab.pipeline.commands import latest_checkpoint, serve_one
    from quantlab.recipe.file import load_recipe
    from quantlab.recipe.serve import ServeSpec

    with exit_codes():
        dtype, spec, role, trust = "bfloat16", ServeSpec(), "candidate", False
        if target.suffix in (".yaml", ".yml"):
            loaded = load_recipe(target)
            spec, dtype, trust = loaded.recipe.serve, loaded.recipe.model.dtype, loaded.recipe.model.trust_remote_code
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
            spec, dtype, trust = settings.serve, settings.model.dtype, settings.model.trust_remote_code
        if spec.mode == "endpoint":
            raise RecipeError("`quantlab serve` starts a server; this recipe's serve.mode is 'endpoint' (a server "
                              "that already runs). Use a recipe with mode launch or command", field="serve.mode")
        log_dir = log_dir or Path(tempfile.mkdtemp(prefix="quantlab-serve-"))
        with serve_one(Path(model_dir), role, spec, dtype=dtype, log_dir=log_dir, progress=progress,
                       trust_remote_code=trust) as (server, facts):
            # plain stdout (no wrapping): scripts read the JSON and the URL line
            typer.echo(json.dumps(facts, indent=2))
            key = f"; send Authorization: Bearer <the key in {facts['api_key_file']}>" if facts["api_key_file"] else ""
            typer.echo(f"serving {model_dir} as '{server.served_name}' at {server.base_url}/v1 (Ctrl-C to stop){key}")
            try:
                while True:
                    server.ensure_alive("while serving")
                    time.sleep(1)
            except KeyboardInterrupt:
                err.print("stopping the server")
