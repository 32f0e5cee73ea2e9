"""The recipe's quantization and calibration sections: methods, schemes, their options."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from quantlab.recipe.schemes import METHODS, SCHEMES


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


Method = Literal["rtn", "gptq", "awq", "smoothquant+gptq", "smoothquant+rtn", "fp8", "raw"]
Scheme = Literal["W4A16", "W8A16", "W8A8", "FP8", "FP8_DYNAMIC", "FP8_BLOCK"]
# the rows of recipe/schemes.py (what each means, which method makes which scheme), named
# here for the schema and the editor; tests/unit/recipe/test_schemes_table.py holds them equal
GROUPED = "/".join(name for name, scheme in SCHEMES.items() if scheme.group_size)  # W4A16/W8A16


class GPTQOptions(_Strict):
    block_size: int = Field(128, ge=1, description="Columns processed per GPTQ block.")
    dampening_frac: float = Field(
        0.01, gt=0, lt=1, description="Hessian dampening as a fraction of its mean diagonal."
    )
    actorder: Literal["static", "group", "weight"] | None = Field(
        "static", description="Activation ordering; null disables it."
    )


class AWQOptions(_Strict):
    duo_scaling: bool | Literal["both"] = Field(
        True, description="Scale search from activations and weights (true), activations only (false), or both."
    )
    n_grid: int = Field(20, ge=1, le=100, description="Grid points searched per scale.")


class SmoothQuantOptions(_Strict):
    smoothing_strength: float = Field(
        0.8, gt=0, lt=1, description="alpha: how much activation range moves into the weights."
    )


class KVCacheSpec(_Strict):
    dtype: Literal["fp8"] = Field("fp8", description="KV cache storage type.")


class DistributedSpec(_Strict):
    """llm-compressor's distributed oneshot under torchrun on one node (quantize/distributed.py)."""

    nproc_per_node: int = Field(ge=2, le=64, description="Processes, one per accelerator of the node; "
                                "llm-compressor splits the calibration samples across them. Needs that many "
                                "GPUs: refused by the preflight on a host without them.")


class QuantizationSpec(_Strict):
    method: Method
    scheme: Scheme | None = Field(None, description="Quantization scheme (required unless method is 'raw').")
    group_size: int | None = Field(
        None,
        ge=1,
        description="Weights per scale for W4A16/W8A16; null means one scale per output channel. "
        "Must divide the input width of every targeted layer.",
    )
    symmetric: bool = Field(True, description="Symmetric (no zero point) weight quantization.")
    targets: list[str] = Field(default_factory=lambda: ["Linear"], min_length=1)
    ignore: list[str] = Field(
        default_factory=lambda: ["lm_head"],
        description="Module names, class names or 're:<regex>' patterns left unquantized.",
    )
    gptq: GPTQOptions | None = None
    awq: AWQOptions | None = None
    smoothquant: SmoothQuantOptions | None = None
    kv_cache: KVCacheSpec | None = Field(None, description="Quantize the KV cache with calibrated scales.")
    calibration_dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="dtype the model is loaded in for calibration and quantization; the checkpoint is "
        "exported in model.dtype either way. auto: model.dtype, except on a CPU whose 16-bit matmul measures "
        "slower than float32 (no native bf16): float32 there, which is also at least as precise.")
    reuse_checkpoint: bool = Field(True, description="Reuse a checkpoint quantized earlier (on this machine) from "
                                   "the same model files, quantization and calibration sections, calibration data "
                                   "and library versions, instead of quantizing again.")
    distributed: DistributedSpec | None = Field(None, description="Calibrate with one process per GPU of the "
                                                "node under torchrun; null: one process.")
    raw_recipe: dict[str, Any] | str | None = Field(
        None,
        description="Escape hatch (method 'raw'): an llm-compressor recipe, as a YAML string or "
        "mapping, passed to oneshot unchanged.",
    )

    @field_validator("group_size")
    @classmethod
    def _power_of_two(cls, v: int | None) -> int | None:
        if v is not None and v & (v - 1):
            raise ValueError(f"got {v}; expected a power of two such as 32, 64 or 128")
        return v

    @model_validator(mode="after")
    def _combination(self) -> "QuantizationSpec":
        m, s = self.method, self.scheme
        if m == "raw":
            if self.raw_recipe is None:
                raise ValueError("method 'raw' needs 'raw_recipe' (an llm-compressor recipe)")
            for name in ("scheme", "group_size", "gptq", "awq", "smoothquant", "kv_cache"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"method 'raw' takes everything from 'raw_recipe'; remove '{name}'"
                    )
            return self
        if self.raw_recipe is not None:
            raise ValueError("'raw_recipe' is only read with method 'raw'; set method: raw or remove it")
        method = METHODS[m]
        if s is None:
            raise ValueError(f"method '{m}' needs a 'scheme', one of {sorted(method.schemes)}")
        if s not in method.schemes:
            raise ValueError(
                f"method '{m}' cannot produce scheme '{s}' (it makes {sorted(method.schemes)}): {method.hint}"
            )
        if self.group_size is not None and not SCHEMES[s].group_size:
            raise ValueError(
                f"group_size applies to {GROUPED} only; scheme '{s}' fixes its own granularity: "
                "remove group_size"
            )
        if not self.symmetric and not SCHEMES[s].group_size:
            raise ValueError(f"scheme '{s}' is symmetric only; remove 'symmetric: false'")
        for opt in ("gptq", "awq", "smoothquant"):
            if getattr(self, opt) is not None and opt not in method.options:
                raise ValueError(f"'{opt}' options given but method '{m}' does not run {opt}; remove them")
        return self

    @property
    def needs_calibration(self) -> bool:
        """Whether this method/scheme reads calibration samples at all."""
        if METHODS[self.method].calibrates or self.kv_cache is not None:
            return True  # raw among them: unknown, let its recipe decide, data is harmless
        return self.scheme is not None and SCHEMES[self.scheme].static_activations


class CalibrationDataset(_Strict):
    path: str = Field(description="JSONL file, relative to the recipe file. Rows hold 'text' or 'messages'.")
    weight: float = Field(1.0, gt=0, description="Relative share of samples drawn from this file.")


class CalibrationSpec(_Strict):
    datasets: list[CalibrationDataset] = Field(min_length=1)
    num_samples: int = Field(64, ge=1, le=100_000)
    max_seq_length: int = Field(512, ge=16, le=131_072)
    seed: int = 0
    chat_template: bool = Field(
        True, description="Render 'messages' rows with the tokenizer's chat template."
    )
