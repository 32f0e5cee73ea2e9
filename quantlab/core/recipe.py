"""The recipe file: its schema, loading, path resolution and content hash.

A recipe is YAML. Every section forbids unknown keys so a typo is an error, not a
silently ignored setting. Later pipeline stages (serve, checks, gates, signing) add
their own optional top-level sections here; nothing else in the schema moves.
This module imports no engine: `quantlab recipes check` must stay instant.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from quantlab.core.errors import RecipeError
from quantlab.performance.spec import PerformanceSpec
from quantlab.quality.spec import QualitySpec
from quantlab.stability.spec import StabilitySpec

SCHEMA_VERSION = 1

Method = Literal["rtn", "gptq", "awq", "smoothquant+gptq", "smoothquant+rtn", "fp8", "raw"]
Scheme = Literal["W4A16", "W8A16", "W8A8", "FP8", "FP8_DYNAMIC", "FP8_BLOCK"]

INT_WEIGHT_ONLY = {"W4A16", "W8A16"}
FP8_SCHEMES = {"FP8", "FP8_DYNAMIC", "FP8_BLOCK"}
# Schemes whose activation scales are computed at run time (no calibration needed
# for the activations themselves).
DYNAMIC_ACTIVATIONS = {"W8A8", "FP8_DYNAMIC", "FP8_BLOCK"}

# Which schemes each method can produce, and why the others make no sense.
METHOD_SCHEMES: dict[str, set[str]] = {
    "rtn": {"W4A16", "W8A16", "W8A8"},
    "gptq": {"W4A16", "W8A16", "W8A8"},
    "awq": {"W4A16", "W8A16"},
    "smoothquant+gptq": {"W8A8"},
    "smoothquant+rtn": {"W8A8"},
    "fp8": FP8_SCHEMES,
}
METHOD_HINT = {
    "rtn": "use method 'fp8' for FP8 schemes",
    "gptq": "GPTQ here produces integer weights; use method 'fp8' for FP8 schemes",
    "awq": "AWQ protects salient weight channels of weight-only integer schemes; "
    "for W8A8 use 'smoothquant+gptq'",
    "smoothquant+gptq": "SmoothQuant moves activation outliers into the weights, which only "
    "helps when activations are quantized (W8A8); for weight-only use 'gptq' or 'awq'",
    "smoothquant+rtn": "SmoothQuant only helps when activations are quantized (W8A8); "
    "for weight-only use 'rtn'",
    "fp8": "method 'fp8' produces FP8 schemes only; for integer schemes use 'rtn' or 'gptq'",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class ModelSpec(_Strict):
    source: str = Field(
        "default",
        description="'default' (the embedded SmolLM2-135M-Instruct), a local Hugging Face "
        "model folder, or a hub id such as 'org/name'.",
    )
    revision: str | None = Field(None, description="Hub revision (hub ids only).")
    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        "bfloat16", description="dtype the unquantized model is loaded and served in."
    )
    trust_remote_code: bool = Field(
        False, description="Run model code shipped with the checkpoint. Off unless you trust it."
    )


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
        if s is None:
            raise ValueError(f"method '{m}' needs a 'scheme', one of {sorted(METHOD_SCHEMES[m])}")
        if s not in METHOD_SCHEMES[m]:
            raise ValueError(
                f"method '{m}' cannot produce scheme '{s}' (it makes {sorted(METHOD_SCHEMES[m])}): "
                f"{METHOD_HINT[m]}"
            )
        if self.group_size is not None and s not in INT_WEIGHT_ONLY:
            raise ValueError(
                f"group_size applies to W4A16/W8A16 only; scheme '{s}' fixes its own granularity: "
                "remove group_size"
            )
        if not self.symmetric and s not in INT_WEIGHT_ONLY:
            raise ValueError(f"scheme '{s}' is symmetric only; remove 'symmetric: false'")
        for opt, needs in (("gptq", "gptq"), ("awq", "awq"), ("smoothquant", "smoothquant")):
            if getattr(self, opt) is not None and needs not in m:
                raise ValueError(f"'{opt}' options given but method '{m}' does not run {opt}; remove them")
        return self

    @property
    def needs_calibration(self) -> bool:
        """Whether this method/scheme reads calibration samples at all."""
        if self.method == "raw":
            return True  # unknown: let the raw recipe decide, data is harmless
        if self.method in ("gptq", "awq", "smoothquant+gptq", "smoothquant+rtn"):
            return True
        if self.kv_cache is not None:
            return True
        return self.scheme == "FP8"  # static activation scales


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


PRIMARY_TARGET = "primary"  # the serve section's own target, in decisions and reports
TARGET_OVERRIDES = ("mode", "device", "python", "command", "endpoint", "candidate_endpoint", "served_model_name",
                    "candidate_served_model_name", "allow_same_endpoint", "startup_timeout_s", "cpu_kv_cache_space_gib")


class ServeTarget(_Strict):
    """One more place the release is meant for (another device, engine build or endpoint).
    Unset fields are the serve section's; engine_args and env are merged over it."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$", description="Short name used in "
                      "reports, decisions and server log names.")
    required: bool = Field(True, description="The exit code follows this target's decision. An optional "
                           "target that cannot serve the scheme, or does not start, is recorded as blocked.")
    roles: list[Literal["baseline", "candidate"]] = Field(
        default_factory=lambda: ["baseline", "candidate"], min_length=1,
        description="What is served on this target. With the baseline too, the candidate's mismatch "
        "against the primary target is judged against the baseline's (hardware changes greedy text too).")
    max_mismatch_excess: float | None = Field(
        0.25, ge=0, le=1, description="Candidate's greedy mismatch rate against the primary target minus the "
        "baseline's (needs both roles; otherwise inconclusive).")
    max_mismatch: float | None = Field(None, ge=0, le=1, description="Candidate's greedy mismatch rate against "
                                       "the primary target, absolute.")
    mode: Literal["launch", "command", "endpoint"] | None = None
    device: Literal["auto", "cpu", "cuda"] | None = None
    python: str | None = None
    command: list[str] | None = None
    endpoint: str | None = None
    candidate_endpoint: str | None = None
    served_model_name: str | None = None
    candidate_served_model_name: str | None = None
    allow_same_endpoint: bool | None = None
    startup_timeout_s: float | None = Field(None, gt=0, le=7200)
    cpu_kv_cache_space_gib: float | None = Field(None, gt=0)
    engine_args: dict[str, str | int | float | bool | None] = Field(
        default_factory=dict, description="Merged over serve.engine_args (null removes a key).")
    env: dict[str, str] = Field(default_factory=dict, description="Merged over serve.env.")


class ServeSpec(_Strict):
    """How to reach a vLLM engine. Baseline and candidate get identical engine args."""

    mode: Literal["launch", "command", "endpoint"] = Field(
        "launch",
        description="launch: start vLLM from the serving environment; command: start it with "
        "'command' (a container, a cluster job); endpoint: use an already running server.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Target device; auto detects a GPU.")
    python: str | None = Field(
        None, description="Python of the serving environment (default: .venv-vllm/bin/python, "
        "or $QUANTLAB_VLLM_PYTHON).",
    )
    command: list[str] | None = Field(
        None, description="Launch command (mode 'command'), one list item per argument, with "
        "placeholders {model}, {port}, {host}, {served_model_name}; engine_args are appended.",
    )
    endpoint: str | None = Field(None, description="Base URL of a running server serving the baseline "
                                 "(mode 'endpoint').")
    candidate_endpoint: str | None = Field(None, description="Mode 'endpoint': base URL serving the candidate.")
    served_model_name: str | None = Field(
        None, description="Model name the external baseline server serves (mode 'endpoint', or a 'command' "
        "without {served_model_name}). Unset: the one model the server lists.")
    candidate_served_model_name: str | None = Field(
        None, description="Model name the external candidate server serves; unset: the one model it lists.")
    allow_same_endpoint: bool = Field(
        False, description="Mode 'endpoint': allow baseline and candidate to be the same server and model "
        "(a self-comparison, e.g. to check that the gates pass on identical models).")
    host: str = Field("127.0.0.1", description="Interface a launched server binds to.")
    port: int | None = Field(None, ge=1, le=65535, description="Port for a launched server (default: a free one).")
    startup_timeout_s: float = Field(900, gt=0, le=7200, description="Deadline for /health to answer 200.")
    shutdown_timeout_s: float = Field(30, gt=0, le=600, description="Grace period after SIGTERM before SIGKILL.")
    engine_args: dict[str, str | int | float | bool | None] = Field(
        default_factory=dict,
        description="vLLM server arguments without the leading dashes (max_model_len: 2048, "
        "kv_cache_dtype: fp8, tensor_parallel_size: 2, ...). true -> a bare flag, false/null -> omitted.",
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="dtype both servers compute in. auto: model.dtype, except on a CPU whose 16-bit "
        "matmul measures slower than float32 (torch emulates bf16 without AVX-512 BF16/AMX): float32 there. "
        "engine_args.dtype, if set, wins.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for the server process.")
    cpu_kv_cache_space_gib: float = Field(
        1, gt=0, description="CPU only: KV cache size (VLLM_CPU_KVCACHE_SPACE) in GiB.")
    side_by_side: bool = Field(
        False, description="Serve baseline and candidate at the same time (needs memory for both).")
    targets: list[ServeTarget] = Field(
        default_factory=list, description="More serve targets (devices, engine builds, endpoints) beside this "
        "primary one: each serves the same checkpoint, its greedy outputs are compared with the primary "
        "target's, and it gets its own release decision. Quality and performance are measured on the primary.")

    @model_validator(mode="after")
    def _mode_fields(self) -> "ServeSpec":
        if self.mode == "command" and not self.command:
            raise ValueError("mode 'command' needs 'command' (a list, e.g. [docker, run, ..., '{model}'])")
        if self.mode == "endpoint" and not self.endpoint:
            raise ValueError("mode 'endpoint' needs 'endpoint' (e.g. http://127.0.0.1:8000)")
        if self.mode == "endpoint" and not self.allow_same_endpoint:
            same_url = (self.candidate_endpoint or self.endpoint).rstrip("/") == self.endpoint.rstrip("/")
            same_name = self.candidate_served_model_name == self.served_model_name
            if same_url and same_name:
                raise ValueError(
                    "baseline and candidate would be the same server and model: set 'candidate_endpoint' "
                    "(or a different 'candidate_served_model_name'), or 'allow_same_endpoint: true' if a "
                    "self-comparison is intended")
        if self.mode != "endpoint":
            for key in ("endpoint", "candidate_endpoint"):
                if getattr(self, key):
                    raise ValueError(f"'{key}' is only used with mode 'endpoint'")
        if self.mode != "command" and self.command:
            raise ValueError("'command' is only used with mode 'command'")
        for key in self.engine_args:
            if key.startswith("-") or key in ("model", "port", "host", "served_model_name", "served-model-name"):
                raise ValueError(f"engine_args.{key}: quantlab sets model, port, host and the served name itself; "
                                 "write other keys without dashes")
        names = [t.name for t in self.targets]
        for i, t in enumerate(self.targets):
            if t.name == PRIMARY_TARGET or names.count(t.name) > 1:
                raise ValueError(f"targets[{i}].name '{t.name}': target names must be unique and not "
                                 f"'{PRIMARY_TARGET}' (the serve section itself)")
            try:
                self.for_target(t)
            except ValidationError as err:
                first = err.errors()[0]
                raise ValueError(f"targets[{i}] ('{t.name}'), once merged over the serve section: "
                                 f"{first['msg'].removeprefix('Value error, ')}") from None
        return self

    @property
    def optional_targets(self) -> set[str]:
        """Names of the serve targets whose decision does not decide the run (required: false)."""
        return {t.name for t in self.targets if not t.required}

    def for_target(self, target: "ServeTarget") -> "ServeSpec":
        """The serve section as this target sees it: its overrides applied, engine_args and
        env merged (a null engine arg removes the key), no further targets."""
        data = self.model_dump(exclude={"targets"})
        for key in TARGET_OVERRIDES:
            value = getattr(target, key)
            if value is not None:
                data[key] = value
        if target.mode is not None and target.mode != self.mode:
            for key in ("endpoint", "candidate_endpoint", "command"):  # the primary's mode-only fields
                if getattr(target, key) is None:
                    data[key] = None
        if len(target.roles) == 1:  # one role served there: no baseline/candidate pair to confuse
            data["allow_same_endpoint"] = True
        args = {**self.engine_args, **target.engine_args}
        data["engine_args"] = {k: v for k, v in args.items() if v is not None}
        data["env"] = {**self.env, **target.env}
        return ServeSpec.model_validate(data)


class SigningSpec(_Strict):
    """How the release manifest (with the weights) is signed, by OpenSSF model-signing."""

    method: Literal["key", "certificate", "sigstore", "none"] = Field(
        "key", description="key: EC P-256 private key (offline); certificate: key + X.509 certificate chain; "
        "sigstore: keyless through Sigstore (needs its services); none: an unsigned manifest.")
    private_key: str | None = Field(
        None, description="PEM private key (key and certificate methods), relative to the recipe. Unset with "
        "method 'key': a local development key in quantlab's cache, created once (`quantlab keygen` makes one "
        "to keep).")
    password_env: str | None = Field(None, description="Name of the environment variable holding the key's "
                                     "password (never the password itself).")
    signing_certificate: str | None = Field(None, description="Certificate of the signing key (method certificate).")
    certificate_chain: list[str] = Field(default_factory=list, description="Certificates up to the root.")
    sigstore_staging: bool = Field(False, description="Sigstore's staging instance (for trying it out).")
    identity_token_env: str | None = Field(None, description="Environment variable with an OIDC token for "
                                           "Sigstore (CI workload identity); unset: Sigstore's own flow.")

    @model_validator(mode="after")
    def _fields_for_method(self) -> "SigningSpec":
        if self.method == "certificate" and not (self.private_key and self.signing_certificate):
            raise ValueError("method 'certificate' needs 'private_key' and 'signing_certificate'")
        return self


class Recipe(_Strict):
    version: Literal[1] = Field(SCHEMA_VERSION, description="Recipe schema version.")
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$", description="Short slug; names the outputs.")
    description: str = ""
    model: ModelSpec = Field(default_factory=ModelSpec)
    quantization: QuantizationSpec
    calibration: CalibrationSpec | None = None
    serve: ServeSpec = Field(default_factory=ServeSpec)
    quality: QualitySpec | None = Field(
        None, description="Quality checks: eval suites on baseline and candidate, compared sample by sample, gates.")
    performance: PerformanceSpec | None = Field(
        None, description="Performance checks: load workloads on baseline and candidate, SLOs, gates.")
    stability: StabilitySpec | None = Field(
        None, description="Stability checks: batch and length sweeps, determinism, bad requests, soak, fallback.")
    signing: SigningSpec = Field(default_factory=SigningSpec, description="How the release manifest is signed.")

    @model_validator(mode="after")
    def _calibration_present(self) -> "Recipe":
        q = self.quantization
        if q.needs_calibration and self.calibration is None and q.method != "raw":
            why = "a KV cache scheme" if q.kv_cache else f"method '{q.method}' with scheme '{q.scheme}'"
            raise ValueError(
                f"{why} needs calibration data: add a 'calibration' section with 'datasets' "
                "(e.g. [{path: ../calib_data/prose.jsonl}])"
            )
        return self


class LoadedRecipe(BaseModel):
    """A validated recipe plus where it came from."""

    model_config = ConfigDict(frozen=True)

    recipe: Recipe
    path: Path

    @property
    def base_dir(self) -> Path:
        return self.path.parent

    def resolve(self, relative: str) -> Path:
        p = Path(relative).expanduser()
        return p if p.is_absolute() else (self.base_dir / p).resolve()

    def calibration_paths(self) -> list[Path]:
        if self.recipe.calibration is None:
            return []
        return [self.resolve(d.path) for d in self.recipe.calibration.datasets]

    @property
    def content_hash(self) -> str:
        return recipe_hash(self.recipe)


def recipe_hash(recipe: Recipe) -> str:
    """sha256 of the recipe's canonical JSON (defaults filled in, keys sorted)."""
    canonical = json.dumps(recipe.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _allowed_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    """Walk the schema along `loc` to list the keys allowed at that level."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        ann = field.annotation
        for candidate in getattr(ann, "__args__", (ann,)):
            inner = getattr(candidate, "__args__", (candidate,))
            found = next((c for c in (candidate, *inner) if isinstance(c, type) and issubclass(c, BaseModel)), None)
            if found is not None:
                current = found
                break
    return sorted(getattr(current, "model_fields", {}))


def _is_branch_tag(part: object) -> bool:
    """pydantic puts the tried union/literal branch into an error's location
    ('str', 'literal['fp8']', 'dict[str,...]'); those are not recipe keys."""
    s = str(part)
    return s in ("str", "int", "float", "bool", "none") or "[" in s


def _format_validation_error(err: ValidationError, file: str) -> RecipeError:
    lines = []
    for e in err.errors():
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        # pydantic puts the union/literal branch in the location: keep only real keys
        dotted = ".".join(str(p) for p in loc if not _is_branch_tag(p))
        if e["type"] == "extra_forbidden":
            allowed = _allowed_keys(Recipe, loc)
            key = str(loc[-1])
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            lines.append(f"field '{dotted}': unknown key.{hint} Allowed here: {', '.join(allowed)}")
        elif e["type"] == "missing":
            lines.append(f"field '{dotted}': required but missing")
        else:
            got = e.get("input")
            shown = "" if isinstance(got, (dict, list)) else f" (got {got!r})"
            msg = e["msg"].removeprefix("Value error, ")
            lines.append(f"field '{dotted or '<top>'}': {msg}{shown}")
    head = f"{file}: invalid recipe ({len(lines)} problem{'s' if len(lines) > 1 else ''})"
    return RecipeError(head + "\n  - " + "\n  - ".join(lines))


def parse_recipe(data: Any, *, file: str = "<recipe>") -> Recipe:
    if not isinstance(data, dict):
        raise RecipeError(
            f"expected a YAML mapping at the top level, found {type(data).__name__}", file=file
        )
    try:
        return Recipe.model_validate(data)
    except ValidationError as err:
        raise _format_validation_error(err, file) from None


def load_recipe(path: str | Path) -> LoadedRecipe:
    p = Path(path)
    if not p.is_file():
        raise RecipeError(
            f"recipe file not found: '{p}'. Pass the path to a recipe YAML file "
            "(`quantlab recipes list` shows the shipped ones)."
        )
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise RecipeError(f"not valid YAML: {err}", file=str(p)) from None
    except UnicodeDecodeError:
        raise RecipeError("not a UTF-8 text file", file=str(p)) from None
    recipe = parse_recipe(data, file=str(p))
    loaded = LoadedRecipe(recipe=recipe, path=p.resolve())
    for i, ds in enumerate(recipe.calibration.datasets if recipe.calibration else []):
        resolved = loaded.resolve(ds.path)
        if not resolved.is_file():
            raise RecipeError(
                f"calibration file not found: '{ds.path}' (resolved to {resolved}). Paths are "
                "relative to the recipe file; point it at a JSONL file.",
                file=str(p),
                field=f"calibration.datasets.{i}.path",
            )
    for i, w in enumerate(recipe.performance.workloads if recipe.performance else []):
        if w.dataset is not None and not loaded.resolve(w.dataset).is_file():
            raise RecipeError(f"prompt dataset not found: '{w.dataset}' (resolved to {loaded.resolve(w.dataset)}); "
                              "paths are relative to the recipe file", file=str(p),
                              field=f"performance.workloads.{i}.dataset")
    s = recipe.signing
    for key in ("private_key", "signing_certificate"):
        value = getattr(s, key)
        if value is not None and not loaded.resolve(value).is_file():
            raise RecipeError(f"file not found: '{value}' (resolved to {loaded.resolve(value)}); paths are relative "
                              "to the recipe file", file=str(p), field=f"signing.{key}")
    return loaded


def json_schema() -> dict[str, Any]:
    schema = Recipe.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "quantlab recipe"
    return schema
