"""The table of methods and schemes (pure): one row per quantization scheme and per method a
recipe may name, the one place their meaning is written.

Every reader derives what it needs from a row instead of branching on the name: the
recipe schema's combinations (recipe/quantize.py), the modifiers llm-compressor is asked
for (quantize/modifier_plan.py), the sensitivity proxy (search/measure.py), the
`quantization_config` the serve preflight predicts (serving/compat.predict_quant_config),
the layer the kernel microbenchmark times (serving/kernel_bench.scheme_kind) and the
bits a weight takes in a scheme search (search/schemes.weight_bits).

Adding a scheme: a row here and its name in `recipe/quantize.Scheme` (the schema's
literal, which tests/unit/recipe/test_schemes_table.py holds to the rows), and its name in
the `schemes` of each method that makes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Numbers:
    """How one tensor of a scheme is quantized."""

    type: Literal["int", "float"]
    bits: int
    strategy: str | None  # one scale per: "channel", "group", "block", "token"; None: the preset's own
    dynamic: bool | None = None  # activations: scales computed at run time (True) or calibrated (False)


@dataclass(frozen=True)
class Scheme:
    name: str  # as a recipe writes it (`quantization.scheme`)
    weights: Numbers  # its strategy is the one without a group size
    activations: Numbers | None  # None: weight-only (activations stay 16-bit)
    group_size: bool = False  # the recipe's `group_size` (and `symmetric: false`) apply
    preset: bool = False  # llm-compressor is asked by compressed-tensors' preset name, not config groups
    timed_as: str | None = None  # the layer serving/kernel_bench.py times for it on a CPU (None: none there)

    @property
    def static_activations(self) -> bool:
        """Activation scales calibrated ahead of time (so calibration data is read)."""
        return self.activations is not None and self.activations.dynamic is False


def _fp8(name: str, weight_strategy: str, dynamic: bool) -> Scheme:
    # the strategies are what the preflight predicts; the preset sets its own (FP8's weights: one per tensor)
    return Scheme(name, Numbers("float", 8, weight_strategy), Numbers("float", 8, None, dynamic), preset=True)


_INT8_TOKEN = Numbers("int", 8, "token", dynamic=True)  # one dynamic scale per token: nothing to calibrate
SCHEMES: dict[str, Scheme] = {s.name: s for s in (
    Scheme("W4A16", Numbers("int", 4, "channel"), None, group_size=True, timed_as="wna16"),
    Scheme("W8A16", Numbers("int", 8, "channel"), None, group_size=True),
    Scheme("W8A8", Numbers("int", 8, "channel"), _INT8_TOKEN, timed_as="w8a8_int8"),
    _fp8("FP8", "channel", dynamic=False),  # static activation scales, calibrated
    _fp8("FP8_DYNAMIC", "channel", dynamic=True),
    _fp8("FP8_BLOCK", "block", dynamic=True),
)}


@dataclass(frozen=True)
class Method:
    name: str  # as a recipe writes it (`quantization.method`)
    schemes: frozenset[str]  # the schemes it can produce
    hint: str  # why the others make no sense, and what to use instead
    modifiers: tuple[str, ...]  # the llm-compressor modifiers it runs, in order
    calibrates: bool  # reads calibration samples whatever the scheme

    @property
    def options(self) -> set[str]:
        """The recipe's option sections it reads (`gptq`, `awq`, `smoothquant`)."""
        return {MODIFIER_OPTIONS[m] for m in self.modifiers if m in MODIFIER_OPTIONS}


MODIFIER_OPTIONS = {"SmoothQuantModifier": "smoothquant", "AWQModifier": "awq", "GPTQModifier": "gptq"}
_INT = frozenset(name for name, s in SCHEMES.items() if s.weights.type == "int")
_FP8 = frozenset(name for name, s in SCHEMES.items() if s.weights.type == "float")
METHODS: dict[str, Method] = {m.name: m for m in (
    Method("rtn", _INT, "use method 'fp8' for FP8 schemes", ("QuantizationModifier",), calibrates=False),
    Method("gptq", _INT, "GPTQ here produces integer weights; use method 'fp8' for FP8 schemes",
           ("GPTQModifier",), calibrates=True),
    # AWQ only rescales; the weights are quantized by the QuantizationModifier after it
    Method("awq", frozenset({"W4A16", "W8A16"}), "AWQ protects salient weight channels of weight-only integer "
           "schemes; for W8A8 use 'smoothquant+gptq'", ("AWQModifier", "QuantizationModifier"), calibrates=True),
    Method("smoothquant+gptq", frozenset({"W8A8"}), "SmoothQuant moves activation outliers into the weights, "
           "which only helps when activations are quantized (W8A8); for weight-only use 'gptq' or 'awq'",
           ("SmoothQuantModifier", "GPTQModifier"), calibrates=True),
    Method("smoothquant+rtn", frozenset({"W8A8"}), "SmoothQuant only helps when activations are quantized "
           "(W8A8); for weight-only use 'rtn'", ("SmoothQuantModifier", "QuantizationModifier"), calibrates=True),
    Method("fp8", _FP8, "method 'fp8' produces FP8 schemes only; for integer schemes use 'rtn' or 'gptq'",
           ("QuantizationModifier",), calibrates=False),
    # the escape hatch: its llm-compressor recipe decides everything; calibration data is harmless
    Method("raw", frozenset(), "", (), calibrates=True),
)}


def weight_strategy(scheme: Scheme, group_size: int | None) -> str:
    """The weights' scale strategy under the recipe's group size."""
    return "group" if scheme.group_size and group_size is not None else str(scheme.weights.strategy)
