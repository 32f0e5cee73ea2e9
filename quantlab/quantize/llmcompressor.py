"""llm-compressor, in-process: the model's layer layout for the preflight, calibration,
`oneshot`, and the compressed-tensors checkpoint written atomically with
`quantize.json` beside it. The quantize stage and `quantlab quantize` both call this."""

from __future__ import annotations

import contextlib
import json
import platform
import resource
import sys
import time
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import yaml

from quantlab.quantize.calibration import build_calibration_set
from quantlab.quantize.compute_dtype import SIXTEEN_BIT, DtypeChoice, choose_dtype, float32_bytes
from quantlab.core import redact
from quantlab.core.engine_time import engine_busy
from quantlab.quantize import dtype_speed
from quantlab.core.errors import EngineError, RecipeError
from quantlab.core.fsutil import (
    atomic_directory,
    sha256_file,
    write_json_atomic,
    write_text_atomic,
)
from quantlab.core.layout import QUANTIZE_RESULT_FILE, RECIPE_COPY_FILE
from quantlab.models.source import ResolvedModel
from quantlab.quantize.modifier_plan import plan_modifiers, raw_recipe_text
from quantlab.quantize.preflight import ModelLayout, ModuleInfo, run_preflight
from quantlab.core.progress import Progress, step
from quantlab.recipe.file import LoadedRecipe, Recipe
from quantlab.recipe.quantize import QuantizationSpec
from quantlab.quantize.engine_output import engine_warnings, llmcompressor_log, output_to_file


def library_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for pkg in ("quantlab", "torch", "transformers", "llmcompressor", "compressed-tensors", "accelerate"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def model_layout(model_dir: Path, *, trust_remote_code: bool) -> ModelLayout:
    """The module tree of the model, built on the meta device: no weights are read."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    except ValueError as err:
        raise RecipeError(f"cannot read the model config in {model_dir}: {err}", field="model.source") from None
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    modules = []
    for name, module in model.named_modules():
        classes = tuple(c.__name__ for c in type(module).__mro__
                        if isinstance(c, type) and issubclass(c, torch.nn.Module))
        modules.append(ModuleInfo(name, classes, getattr(module, "in_features", None),
                                  getattr(module, "out_features", None)))
    arch = (config.architectures or [type(model).__name__])[0]
    try:
        from llmcompressor.modifiers.transform.awq.mappings import AWQ_MAPPING_REGISTRY

        awq_arches = sorted(AWQ_MAPPING_REGISTRY)
    except ImportError:
        awq_arches = None
    return ModelLayout(arch, modules, getattr(config, "max_position_embeddings", None),
                       {"awq_architectures": awq_arches})


def check_layout(loaded: LoadedRecipe, model_ref: ResolvedModel) -> tuple[ModelLayout, list[ModuleInfo]]:
    """The recipe against the model's layer layout (no weights read). Raises RecipeError."""
    layout = model_layout(model_ref.path, trust_remote_code=loaded.recipe.model.trust_remote_code)
    return layout, run_preflight(loaded.recipe, layout, file=str(loaded.path))


def peak_rss_bytes() -> int:
    # ru_maxrss is KiB on Linux, bytes on macOS
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def summarize_checkpoint(folder: Path) -> dict[str, Any]:
    config = json.loads((folder / "config.json").read_text())
    files = {
        p.name: {"size": p.stat().st_size, "sha256": sha256_file(p)}
        for p in sorted(folder.iterdir())
        if p.is_file() and p.suffix in (".safetensors", ".json", ".jinja", ".yaml")
    }
    return {"quantization_config": config.get("quantization_config"), "files": files,
            "size_bytes": sum(f["size"] for f in files.values())}


def _decoder_layers(model) -> Any:
    """The model's list of decoder layers (the ModuleList as long as num_hidden_layers)."""
    import torch

    n = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    return next((m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n), None)


@contextlib.contextmanager
def _layer_progress(layers, bar) -> Iterator[None]:
    """Count decoder layers reached by calibration (llm-compressor's sequential pipeline
    runs them one after the other), through forward pre-hooks removed afterwards."""
    if layers is None:
        yield
        return
    hooks = [layer.register_forward_pre_hook(lambda *_, i=i: bar.update(done=i)) for i, layer in enumerate(layers)]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()
        bar.update(done=len(layers))


def calibration_dtype(recipe, model_dir: Path) -> DtypeChoice:
    """quantization.calibration_dtype resolved on this host: 'auto' measures the CPU's
    16-bit matmul against float32 (about 0.1-3 s) where that could change the answer."""
    import psutil
    import torch

    q = recipe.quantization
    device = "cuda" if torch.cuda.is_available() else "cpu"
    measure = q.calibration_dtype == "auto" and device == "cpu" and recipe.model.dtype in SIXTEEN_BIT
    return choose_dtype(q.calibration_dtype, recipe.model.dtype, device=device,
                        speed=dtype_speed.measure() if measure else None,
                        float32_bytes=float32_bytes([model_dir], recipe.model.dtype),
                        available_bytes=psutil.virtual_memory().available)


def export_in_dtype(folder: Path, dtype: str) -> None:
    """A checkpoint calibrated in float32, exported as a model.dtype one: every float32
    tensor (unquantized weights, norms, scales) cast to `dtype`, as a run in that dtype
    writes them; integer, packed and FP8 tensors are left as they are. The integers were
    rounded against the float32 scales, so nothing is re-quantized."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    target = getattr(torch, dtype)
    for path in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata()
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        tensors = {k: v.to(target) if v.dtype == torch.float32 else v for k, v in tensors.items()}
        save_file(tensors, str(path), metadata=metadata)
    config_path = Path(folder) / "config.json"
    config = json.loads(config_path.read_text())
    for key in ("dtype", "torch_dtype"):
        if key in config:
            config[key] = dtype
    write_json_atomic(config_path, config)


def default_output_dir(loaded: LoadedRecipe) -> Path:
    return Path("out") / f"{loaded.recipe.name}-{loaded.content_hash[:10]}"


def quantize_checkpoint(loaded: LoadedRecipe, model_ref: ResolvedModel, output: Path, *, overwrite: bool = False,
                        progress: Progress = print, log_file: Path | None = None) -> dict[str, Any]:
    """Preflight, calibrate, quantize and export. Returns the dict also written as quantize.json.
    With `log_file`, what llm-compressor and transformers print goes there, not to the terminal."""
    with llmcompressor_log(log_file):
        return _quantize_checkpoint(loaded, model_ref, Path(output), overwrite=overwrite, progress=progress,
                                    log_file=log_file)


def calibrate_as_rank(loaded: LoadedRecipe, model_ref: ResolvedModel, *, log_file: Path | None = None) -> None:
    """quantization.distributed, a rank other than 0: the same calibration and oneshot as
    rank 0 (llm-compressor combines the ranks' observations), no export (llm-compressor's
    save writes on the source process only)."""
    with llmcompressor_log(log_file):
        _quantize_checkpoint(loaded, model_ref, None, overwrite=True, progress=lambda _msg: None, log_file=log_file)


def _quantize_checkpoint(loaded: LoadedRecipe, model_ref: ResolvedModel, output: Path | None, *, overwrite: bool,
                         progress: Progress, log_file: Path | None) -> dict[str, Any]:
    """output None: calibrate and quantize without exporting (a distributed rank but 0)."""
    recipe = loaded.recipe
    q = recipe.quantization
    if output is not None and output.exists() and not overwrite:
        raise RecipeError(
            f"output folder {output} already exists; pass --overwrite to replace it or choose another --output"
        )
    timings: dict[str, float] = {}
    t0 = time.perf_counter()

    def lap(name: str, since: float) -> float:
        now = time.perf_counter()
        timings[name] = round(now - since, 3)
        return now

    progress(f"preflight: {recipe.name} on {model_ref.path.name}")
    layout, targeted = check_layout(loaded, model_ref)
    t = lap("preflight_s", t0)

    with engine_busy():  # the engines' imports are their start-up cost
        import torch
        from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_ref.path, trust_remote_code=recipe.model.trust_remote_code)
    calib = None
    if recipe.calibration is not None and q.needs_calibration:
        calib = build_calibration_set(recipe.calibration, loaded.calibration_paths(), tokenizer)
        progress(f"calibration: {calib.num_samples} samples, {calib.num_tokens} tokens, sha256 {calib.sha256[:12]}")
    t = lap("calibration_data_s", t)

    compute = calibration_dtype(recipe, model_ref.path)
    if compute.changed:
        progress(f"calibrating in {compute.dtype}, exporting {compute.model_dtype}: {compute.reason}")
    t = lap("dtype_choice_s", t)
    model = load_model(recipe, model_ref, compute, log_file)
    t = lap("load_model_s", t)
    plan, modifiers, shims = _modifiers(q)
    if output is None:
        _oneshot(recipe, model, tokenizer, modifiers, calib, None, progress=progress, log_file=log_file)
        return {}

    with atomic_directory(output, replace=overwrite) as tmp:
        warnings, losses = _oneshot(recipe, model, tokenizer, modifiers, calib, tmp, progress=progress,
                                    log_file=log_file)
        if compute.changed:
            export_in_dtype(tmp, compute.model_dtype)
        t = lap("oneshot_and_save_s", t)
        _check_quantized(tmp, recipe.name)
        # the released recipe copy: secrets (serve.env, secret engine args) as their digests (core/redact)
        write_text_atomic(tmp / RECIPE_COPY_FILE, yaml.safe_dump(redact.recipe(recipe.model_dump(mode="json")),
                                                                 sort_keys=False))
        result = {
            "stage": "quantize",
            "recipe": {"name": recipe.name, "path": str(loaded.path), "sha256": loaded.content_hash},
            "model": model_ref.as_record() | {"architecture": layout.architecture},
            "method": q.method,
            "scheme": q.scheme,
            "modifiers": plan,
            "layers_quantized": len(targeted),
            "calibration": calib.summary(recipe.calibration) if calib is not None else None,
            "checkpoint": summarize_checkpoint(tmp) | {"path": str(output.resolve())},
            "gptq": _gptq_summary(losses),
            "compute_dtype": compute.as_record(),
            "engine_warnings": warnings,
            "shims": shims,
            "timings": timings | {"total_s": round(time.perf_counter() - t0, 3)},
            "peak_rss_bytes": peak_rss_bytes(),
            "versions": library_versions(),
            "device": "cuda" if torch.cuda.is_available() else "cpu",
        }
        write_json_atomic(tmp / QUANTIZE_RESULT_FILE, result)
    progress(f"checkpoint written: {output} ({result['checkpoint']['size_bytes'] / 1e6:.1f} MB, "
             f"{result['timings']['total_s']:.1f} s)")
    return result


def load_model(recipe: Recipe, model_ref: ResolvedModel, compute: DtypeChoice, log_file: Path | None) -> Any:
    """The unquantized model, in the dtype calibration runs in (safetensors only)."""
    with engine_busy():
        import torch
        from transformers import AutoModelForCausalLM

    import contextlib

    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if distributed:  # rank 0 loads the weights, the others the meta device; the offload is shared
        from compressed_tensors.offload import load_offloaded_model
    with output_to_file(log_file), engine_busy(), (load_offloaded_model() if distributed
                                                    else contextlib.nullcontext()):  # transformers' loading bar
        return AutoModelForCausalLM.from_pretrained(
            model_ref.path, dtype=getattr(torch, compute.dtype),
            trust_remote_code=recipe.model.trust_remote_code, use_safetensors=True,
            **({"device_map": "auto_offload"} if distributed else {}),
        )


def _modifiers(q: QuantizationSpec) -> tuple[Any, Any, list[str]]:
    """(the plan as recorded, what oneshot is given, the shims applied for it)."""
    from quantlab.quantize.shims import awq_pin_memory_without_accelerator

    shims = []
    uses_awq = q.method == "awq" or (q.method == "raw" and "AWQModifier" in raw_recipe_text(q))
    if uses_awq and awq_pin_memory_without_accelerator():
        shims.append("awq_pin_memory_without_accelerator (llm-compressor PR #2813 on CPU)")
    if q.method == "raw":
        modifiers = raw_recipe_text(q)
        return {"raw_recipe": modifiers}, modifiers, shims
    plan = plan_modifiers(q)
    return plan, instantiate(plan), shims


def _oneshot(recipe: Recipe, model, tokenizer, modifiers, calib, tmp: Path | None, *, progress: Progress,
             log_file: Path | None) -> tuple[list[str], dict[str, float]]:
    """llm-compressor's oneshot into `tmp` (None: no export), with a bar per calibrated layer;
    returns the engine's warnings and GPTQ's loss per layer (empty where its hook is not available)."""
    with engine_busy():
        import torch
        from llmcompressor import oneshot

    from quantlab.quantize.shims import gptq_layer_losses

    q = recipe.quantization
    where = "accelerator" if torch.accelerator.is_available() else "CPU"
    progress(f"oneshot: {q.method} {q.scheme or ''} on {where}"
             + (f" (llm-compressor's log: {log_file})" if log_file else ""))
    kwargs: dict[str, Any] = {}
    if calib is not None:
        kwargs.update(
            dataset=calib.to_dataset(),
            num_calibration_samples=calib.num_samples,
            max_seq_length=recipe.calibration.max_seq_length,
            shuffle_calibration_samples=False,  # our sample order is part of the hash
        )
    layers = _decoder_layers(model)
    calibrating = calib is not None and layers is not None
    try:
        with output_to_file(log_file), engine_busy(), engine_warnings() as warnings, \
                gptq_layer_losses(model) as losses, \
                step(progress, f"oneshot {q.method}", total=len(layers) if calibrating else None,
                     unit="layers calibrated", announce=False) as bar, \
                _layer_progress(layers if calibrating else None, bar):
            if tmp is not None:
                kwargs.update(output_dir=str(tmp), save_compressed=True)
            oneshot(model=model, tokenizer=tokenizer, recipe=modifiers, **kwargs)
    except (ValueError, RuntimeError, TypeError, KeyError) as err:
        where_log = f" (its output: {log_file})" if log_file else ""
        raise EngineError(f"llm-compressor oneshot failed for recipe '{recipe.name}': "
                          f"{type(err).__name__}: {err}{where_log}") from err
    if tmp is not None and not (tmp / "config.json").is_file():
        raise EngineError(f"llm-compressor wrote no config.json into the checkpoint for '{recipe.name}'")
    return warnings, losses


def _check_quantized(folder: Path, name: str) -> None:
    if "quantization_config" not in json.loads((folder / "config.json").read_text()):
        # e.g. a raw recipe whose modifiers llm-compressor did not recognise
        raise EngineError(
            f"recipe '{name}' produced an unquantized checkpoint (no quantization_config): "
            "llm-compressor applied no quantization modifier. Check the modifier names and "
            "structure of quantization.raw_recipe"
        )


def _gptq_summary(losses: dict[str, float]) -> dict[str, Any] | None:
    """None also where the loss hook is not available."""
    if not losses:
        return None
    return {"layer_losses": losses, "max_loss": max(losses.values()),
            "worst_layers": sorted(losses, key=losses.get, reverse=True)[:5]}


def instantiate(plan: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """The modifier plan as llm-compressor modifier objects."""
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier
    from llmcompressor.modifiers.transform.awq import AWQModifier
    from llmcompressor.modifiers.transform.smoothquant import SmoothQuantModifier

    classes = {c.__name__: c for c in (GPTQModifier, QuantizationModifier, AWQModifier, SmoothQuantModifier)}
    return [classes[name](**kwargs) for name, kwargs in plan]
