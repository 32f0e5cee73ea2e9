"""[engine: torch, transformers, compressed-tensors, llm-compressor] Per-group sensitivity
of the unquantized model to a recipe's scheme, in-process.

The proxy: each group's modules are fake-quantized alone (round-to-nearest in the
recipe's scheme: weights by llm-compressor's min-max observer and compressed-tensors'
fake_quantize; int8/FP8 activations per token, as the served kernels do dynamically),
the held-out sequences run through the model, and the next-token distribution is
compared with the unquantized model's: mean KL(unquantized || quantized) over the scored
positions (every one of calibration text; only the answer of a run's prompt + baseline
answer, `answers.py`), and how often the top token stays the same. Then the weights are put back.
Method-specific corrections (GPTQ's error feedback, AWQ's and SmoothQuant's scales) are
not simulated: this ranks where a scheme's rounding hurts, which is what they reduce."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from quantlab.core.progress import Progress, step
from quantlab.core.engine_time import engine_busy
from quantlab.recipe.file import LoadedRecipe
from quantlab.models.source import ResolvedModel
from quantlab.quantize.modifier_plan import scheme_kwargs
from quantlab.recipe.quantize import QuantizationSpec
from quantlab.recipe.schemes import SCHEMES
from quantlab.search.answers import Sequence
from quantlab.search.groups import group_modules
from quantlab.recipe.sensitivity import SensitivitySpec

PROXY = "round-to-nearest of the recipe's scheme, one group at a time"


def _scheme_args(q: QuantizationSpec):
    """(weight QuantizationArgs, input-activation QuantizationArgs or None) of the recipe's scheme."""
    from compressed_tensors.quantization import QuantizationArgs, preset_name_to_scheme

    if SCHEMES[str(q.scheme)].preset:
        preset = preset_name_to_scheme(q.scheme, list(q.targets))
        return preset.weights, preset.input_activations
    group = scheme_kwargs(q)["config_groups"]["group_0"]
    acts = group.get("input_activations")
    return QuantizationArgs(**group["weights"]), QuantizationArgs(**acts) if acts else None


def _fake_quantize(x, args, base_name: str):
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from llmcompressor.observers import Observer

    observer = Observer.load_from_registry("memoryless_minmax", base_name=base_name, args=args)
    observer(x)
    q = observer.get_qparams()
    return fake_quantize(x, q["scale"], q["zero_point"], args, global_scale=q.get("global_scale"))


class _Quantized:
    """Within the block: these modules' weights (and inputs) fake-quantized; restored after."""

    def __init__(self, modules: list[Any], weight_args, act_args):
        self.modules, self.weight_args, self.act_args = modules, weight_args, act_args
        self.saved: list[Any] = []
        self.hooks: list[Any] = []
        self.err = self.norm = 0.0

    def __enter__(self) -> "_Quantized":
        for m in self.modules:
            w = m.weight.data
            self.saved.append(w.clone())
            q = _fake_quantize(w.float(), self.weight_args, "weight").to(w.dtype)
            self.err += float(((w.float() - q.float()) ** 2).sum())
            self.norm += float((w.float() ** 2).sum())
            m.weight.data.copy_(q)
            if self.act_args is not None:
                self.hooks.append(m.register_forward_pre_hook(self._quantize_input))
        return self

    def _quantize_input(self, _module, inputs):
        x = inputs[0]
        flat = x.reshape(-1, x.shape[-1]).float()
        return (_fake_quantize(flat, self.act_args, "input").reshape(x.shape).to(x.dtype), *inputs[1:])

    def __exit__(self, *exc) -> None:
        for h in self.hooks:
            h.remove()
        for m, w in zip(self.modules, self.saved):
            m.weight.data.copy_(w)

    @property
    def weight_rel_error(self) -> float:
        return self.err / self.norm if self.norm else 0.0


BATCH_TOKENS = 4096  # padded tokens a forward pass holds: bounds the logits' memory, not the result


def _batches(sequences: list[Sequence], pad_id: int, device: str) -> list[tuple[Any, Any, Any]]:
    """(input ids, attention mask, scored-position mask) per batch, padded on the right
    (a causal model's real positions do not see the padding)."""
    import torch

    out, i = [], 0
    while i < len(sequences):
        width = len(sequences[i].ids)
        j = i + 1
        while j < len(sequences) and max(width, len(sequences[j].ids)) * (j + 1 - i) <= BATCH_TOKENS:
            width = max(width, len(sequences[j].ids))
            j += 1
        part = sequences[i:j]
        ids = torch.full((len(part), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(part), width), dtype=torch.long)
        scored = torch.zeros((len(part), width), dtype=torch.bool)
        for row, s in enumerate(part):
            ids[row, :len(s.ids)] = torch.tensor(s.ids)
            attention[row, :len(s.ids)] = 1
            scored[row, s.start:s.end] = True
        out.append((ids.to(device), attention.to(device), scored.to(device)))
        i = j
    return out


def measure(loaded: LoadedRecipe, model_ref: ResolvedModel, modules: list[str], sequences: list[Sequence],
            spec: SensitivitySpec, *, pad_id: int, progress: Progress, log_file: Path | None) -> dict[str, Any]:
    """Every group's mean KL, top-1 agreement and weight error over the sequences' scored
    positions (with the group quantized alone, or everything but the group: `spec.method`),
    its score (the KL it causes alone, or the KL keeping it takes away), and the same for all
    groups quantized at once; the cost in wall seconds and
    forward passes. What transformers prints while loading goes to `log_file` (the caller
    holds llm-compressor's log there too: `llmcompressor_log`)."""
    from quantlab.quantize.llmcompressor import calibration_dtype, load_model

    t0 = time.perf_counter()
    with engine_busy():
        import torch

        compute = calibration_dtype(loaded.recipe, model_ref.path)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = load_model(loaded.recipe, model_ref, compute, log_file).eval().to(device)
    named = dict(model.named_modules())
    missing = [m for m in modules if m not in named]
    if missing:
        raise ValueError(f"modules not in the model: {missing[:5]}")
    weight_args, act_args = _scheme_args(loaded.recipe.quantization)
    groups = group_modules(modules, spec.granularity)
    batches = _batches(sequences, pad_id, device)
    passes = 0

    def run() -> Any:
        """Log-probabilities at the scored positions, [positions, vocab]."""
        nonlocal passes
        passes += 1
        parts = []
        with torch.inference_mode(), engine_busy():
            for ids, attention, scored in batches:
                logits = model(input_ids=ids, attention_mask=attention).logits
                parts.append(torch.log_softmax(logits[scored].float(), dim=-1))
        return torch.cat(parts)

    reference = run()
    ref_top = reference.argmax(-1)
    ref_p = reference.exp()

    def compare(parts: list[str]) -> dict[str, Any]:
        with _Quantized([named[m] for m in parts], weight_args, act_args) as q:
            logp = run()
        kl = (ref_p * (reference - logp)).sum(-1)  # per position
        return {"mean_kl": float(kl.mean()), "max_kl": float(kl.max()),
                "top1_agreement": float((logp.argmax(-1) == ref_top).float().mean()),
                "weight_rel_error": q.weight_rel_error}

    rows = []
    what = f"sensitivity ({spec.method}): {len(groups)} {spec.granularity} groups, {len(sequences)} sequences, " \
        f"{reference.shape[0]} positions scored"
    with step(progress, what, total=len(groups) + 1, unit="groups") as bar:
        together = compare(modules)
        bar.advance()
        for name, parts in groups.items():
            if spec.method == "alone":
                row = compare(parts)
                score = row["mean_kl"]
            else:  # the rest quantized, this group kept: what keeping it buys back
                kept = set(parts)
                row = compare([m for m in modules if m not in kept])
                score = together["mean_kl"] - row["mean_kl"]
                with _Quantized([named[m] for m in parts], weight_args, None) as own:  # its own rounding error
                    row["weight_rel_error"] = own.weight_rel_error
            rows.append({"group": name, "modules": parts, **row, "score": score})
            bar.advance()
    return {"groups": rows, "all_quantized": together, "forward_passes": passes, "dtype": compute.dtype,
            "scored_positions": int(reference.shape[0]),
            "dtype_reason": compute.reason, "device": device, "wall_s": time.perf_counter() - t0,
            "scheme": loaded.recipe.quantization.scheme,
            "weight_args": weight_args.model_dump(mode="json"),
            "input_activation_args": act_args.model_dump(mode="json") if act_args is not None else None}
