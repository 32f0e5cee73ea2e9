"""`quantlab sensitivity`: each group of a recipe's quantized modules fake-quantized
alone on the unquantized model and ranked; the folder it writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantlab.core.layout import SENSITIVITY_DIR  # noqa: F401 (also read from here)
from quantlab.core.errors import RecipeError
from quantlab.core.fsutil import write_text_atomic
from quantlab.core.progress import Progress
from quantlab.recipe.file import LoadedRecipe




def run_sensitivity(loaded: LoadedRecipe, runs_root: Path, spec: Any, *, losses_from: Path | None = None,
                     progress: Progress) -> tuple[Path, dict[str, Any]]:
    """`quantlab sensitivity`: each group of the recipe's quantized modules fake-quantized
    alone on the unquantized model, ranked by how far it moves the next-token
    distribution on held-out text; sensitivity.json, .md and .png in a new folder (and
    the engines' output in its logs/). Returns the folder and the result."""
    import contextlib
    import hashlib
    import json
    import shutil

    from quantlab.core.fsutil import write_json_atomic
    from quantlab.core.layout import LOG_DIR, QUANTIZE_RESULT_FILE
    from quantlab.core.run import new_run_folder
    from quantlab.models.source import resolve_recipe_model
    from quantlab.models.tokenizer import load_tokenizer
    from quantlab.quantize.calibration import held_out_chunks
    from quantlab.quantize.llmcompressor import check_layout, llmcompressor_log
    from quantlab.reports.plots import sensitivity_bars
    from quantlab.search.answers import answer_tasks, run_answers, whole
    from quantlab.search.measure import PROXY, measure
    from quantlab.search.ranking import markdown, ranked, with_quantizer_loss

    recipe = loaded.recipe
    if recipe.calibration is None and not spec.answers_from:
        raise RecipeError("sensitivity is measured on held-out rows of the recipe's calibration datasets, and "
                          "this recipe has no calibration section: add one (its rows are only read; the recipe's "
                          "method need not calibrate), or score a run's answers (--answers-from RUN_DIR)",
                          file=str(loaded.path), field="calibration")
    losses = None
    if losses_from is not None:
        qfile = Path(losses_from) / QUANTIZE_RESULT_FILE
        if not qfile.is_file():
            raise RecipeError(f"--losses-from {losses_from}: no {QUANTIZE_RESULT_FILE} there; pass a checkpoint "
                              "folder quantlab quantized (a run's checkpoint/)", field="--losses-from")
        losses = (json.loads(qfile.read_text()).get("gptq") or {}).get("layer_losses")
        if not losses:
            progress(f"--losses-from {losses_from}: no per-layer quantizer losses recorded there (not GPTQ)")
    if spec.answers_from:  # a folder that is not a run with samples: refused before anything is made
        answer_tasks(Path(spec.answers_from), spec.tasks)
    model = resolve_recipe_model(loaded, progress=progress)
    digest = hashlib.sha256((loaded.content_hash + spec.model_dump_json()).encode()).hexdigest()
    folder = new_run_folder(Path(runs_root) / SENSITIVITY_DIR / recipe.name, digest)
    log_file = folder / LOG_DIR / "engines.log"
    try:  # llm-compressor logs from its import on (the layout imports it): to the log, as quantize does
        with llmcompressor_log(log_file):
            _, quantized = check_layout(loaded, model)
            tokenizer = load_tokenizer(model.path, trust_remote_code=recipe.model.trust_remote_code)
            if spec.answers_from:
                sequences, source = run_answers(Path(spec.answers_from), tokenizer, tasks=spec.tasks,
                                                count=spec.sequences, tokens=spec.tokens)
            else:
                chunks, source = held_out_chunks(recipe.calibration, loaded.calibration_paths(), tokenizer,
                                                 count=spec.sequences, tokens=spec.tokens, seed=spec.seed)
                sequences = whole(chunks)
            pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
            measured = measure(loaded, model, [m.name for m in quantized], sequences, spec, pad_id=pad or 0,
                               progress=progress, log_file=log_file)
    except RecipeError:
        shutil.rmtree(folder, ignore_errors=True)  # bad input, found before any result: leave nothing behind
        for parent in (folder.parent, folder.parent.parent):  # <runs>/sensitivity/<recipe>/, when made for it
            with contextlib.suppress(OSError):
                parent.rmdir()  # only an empty one
        raise
    rows = with_quantizer_loss(ranked(measured.pop("groups")), losses)
    result = {"recipe": recipe.name, "recipe_sha256": loaded.content_hash, "model": str(model.path),
              "proxy": PROXY, "spec": spec.model_dump(mode="json"), "texts": len(sequences), "tokens": spec.tokens,
              "text_source": source, "quantizer_loss_from": str(losses_from) if losses else None,
              **measured, "groups": rows}
    write_json_atomic(folder / "sensitivity.json", result)
    write_text_atomic(folder / "sensitivity.md", markdown(result))
    try:
        sensitivity_bars(rows, folder / "sensitivity.png", f"{recipe.name} ({spec.granularity} groups)")
    except (ImportError, OSError, ValueError) as err:
        progress(f"the sensitivity plot could not be drawn: {type(err).__name__}: {err}")
    return folder, result
