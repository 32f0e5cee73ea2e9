"""The recipe file: its schema, loading, path resolution and content hash.

A recipe is YAML. Every section forbids unknown keys so a typo is an error, not a
silently ignored setting. Each section's schema is a module of its own (recipe/quantize.py,
recipe/serve.py, recipe/quality.py, ...); this module puts them together.
This module imports no engine: `quantlab recipes check` must stay instant.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from quantlab.core import redact, safe_yaml
from quantlab.core.digest import json_sha256
from quantlab.recipe.selection import SelectionSpec
from quantlab.core.errors import RecipeError
from quantlab.recipe.quantize import CalibrationSpec, QuantizationSpec
from quantlab.recipe.release import ReleaseSpec, SigningSpec
from quantlab.recipe.serve import ServeSpec
from quantlab.recipe.load_quality import LoadQualitySpec, selected_points
from quantlab.recipe.performance import PerformanceSpec
from quantlab.recipe.quality import QualitySpec
from quantlab.recipe.stability import StabilitySpec

SCHEMA_VERSION = 1

class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class SectionError(ValueError):
    """A recipe value that contradicts another section: the error names `field`, not the top."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


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
    load_quality: LoadQualitySpec | None = Field(
        None, description="Quality at load: a paired slice of the quality tasks at performance workload points "
        "and at concurrency 1, on both servers; correct answers within the SLOs per second; the batch noise floor. "
        "Needs the quality and performance sections.")
    release: ReleaseSpec = Field(default_factory=ReleaseSpec, description="What a gate that could not decide "
                                 "does to the decision (release.policy).")
    signing: SigningSpec = Field(default_factory=SigningSpec, description="How the release manifest is signed.")
    selection: SelectionSpec | None = Field(None, description="With several recipes in one run (`quantlab run "
                                            "a.yaml b.yaml`): how one candidate is chosen among those released.")

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

    @model_validator(mode="after")
    def _load_quality_sections(self) -> "Recipe":
        lq = self.load_quality
        if lq is None:
            return self
        missing = [name for name in ("quality", "performance") if getattr(self, name) is None]
        if missing:
            raise SectionError("load_quality", f"needs the {' and '.join(missing)} section"
                               f"{'s' if len(missing) > 1 else ''}: its slice is drawn from the quality tasks and "
                               "sent at the performance section's workload points. Add them, or remove "
                               "load_quality")
        try:
            selected_points(lq, self.performance)
        except ValueError as err:
            raise SectionError("load_quality.points", str(err)) from None
        return self


class LoadedRecipe(BaseModel):
    """A validated recipe plus where it came from."""

    model_config = ConfigDict(frozen=True)

    recipe: Recipe
    path: Path
    extends: tuple[Path, ...] = ()  # the files it builds on, nearest first (`extends:`)

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

    def variant(self, name: str, settings: dict[str, Any] | None = None) -> "LoadedRecipe":
        """This recipe under another name with dotted fields set (a comparison's checkpoint
        candidate, a search's trial); the same folder, so its relative paths still hold.
        pydantic's ValidationError (a ValueError) when the result is not a valid recipe."""
        data = self.recipe.model_dump(mode="json")
        for field, value in (settings or {}).items():
            data = set_field(data, field, value)
        return LoadedRecipe(recipe=Recipe.model_validate({**data, "name": name}), path=self.path)


def set_field(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """A copy of recipe data with the dotted field ('quantization.group_size') set,
    missing sections made. ValueError when a parent is not a section."""
    import copy

    out = copy.deepcopy(data)
    node = out
    *parents, leaf = dotted.split(".")
    for key in parents:
        if node.get(key) is None:
            node[key] = {}
        node = node[key]
        if not isinstance(node, dict):
            raise ValueError(f"{dotted}: '{key}' is not a section")
    node[leaf] = value
    return out


def recipe_hash(recipe: Recipe) -> str:
    """sha256 of the recipe's canonical JSON (defaults filled in, keys sorted)."""
    return json_sha256(recipe.model_dump(mode="json"))


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
        if not dotted and isinstance((e.get("ctx") or {}).get("error"), SectionError):
            dotted = e["ctx"]["error"].field
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
            # a value under env or a secret-looking name is not echoed: the message reaches terminals and logs
            hidden = "env" in loc or any(redact.secret_name(str(p)) for p in loc) or redact.secret_value(got)
            shown = "" if isinstance(got, (dict, list)) or hidden else f" (got {got!r})"
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


EXTENDS = "extends"
MAX_EXTENDS_DEPTH = 8


def rebased(data: Any, from_dir: Path, to_dir: Path) -> Any:
    """A recipe's data with every relative path that exists from its old folder rewritten
    relative to its new one, so the moved recipe reads the same files."""
    if isinstance(data, dict):
        return {k: rebased(v, from_dir, to_dir) for k, v in data.items()}
    if isinstance(data, list):
        return [rebased(v, from_dir, to_dir) for v in data]
    if isinstance(data, str) and data and not os.path.isabs(data) and not re.match(r"^[a-z]+://", data) \
            and ("/" in data or "." in data) and (Path(from_dir) / data).exists():
        return os.path.relpath((Path(from_dir) / data).resolve(), Path(to_dir).resolve())
    return data


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` laid on `base`: mappings merge key by key, anything else (a list, a value,
    null) replaces what the base had."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merged(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return out


def _read_yaml(p: Path) -> Any:
    try:  # within a size and alias budget: a parent recipe is read before anything walks it
        return safe_yaml.load_file(p)
    except yaml.YAMLError as err:
        raise RecipeError(f"not valid YAML: {err}", file=str(p)) from None


def read_recipe_data(path: str | Path) -> tuple[Any, tuple[Path, ...]]:
    """A recipe file's data with the recipes it `extends` laid under it (their relative
    paths rewritten to hold from this file's folder), and those files, nearest first."""
    p = Path(path).resolve()
    data = _read_yaml(p)
    chain: list[Path] = []
    while isinstance(data, dict) and EXTENDS in data:
        ref = data.pop(EXTENDS)
        if not isinstance(ref, str) or not ref.strip():
            raise RecipeError(f"'extends' must be the path of another recipe file, found {ref!r}", file=str(path),
                              field=EXTENDS)
        here = chain[-1] if chain else p
        parent = (here.parent / Path(ref).expanduser()).resolve()
        if parent == p or parent in chain:
            circle = " -> ".join(x.name for x in (p, *chain, parent))
            raise RecipeError(f"'extends: {ref}' goes round in a circle ({circle}); a recipe cannot extend itself",
                              file=str(here), field=EXTENDS)
        if len(chain) >= MAX_EXTENDS_DEPTH:
            raise RecipeError(f"more than {MAX_EXTENDS_DEPTH} recipes extend one another", file=str(path),
                              field=EXTENDS)
        if not parent.is_file():
            raise RecipeError(f"'extends: {ref}': no recipe file at {parent}. Paths are relative to the recipe that "
                              "extends", file=str(here), field=EXTENDS)
        base = _read_yaml(parent)
        if not isinstance(base, dict):
            raise RecipeError(f"expected a YAML mapping at the top level, found {type(base).__name__}",
                              file=str(parent))
        chain.append(parent)
        nested = base.pop(EXTENDS, None)
        data = merged(rebased(base, parent.parent, p.parent), data)
        if nested is not None:  # resolved from the parent's folder on the next turn
            data[EXTENDS] = nested
    return data, tuple(chain)


def load_recipe(path: str | Path) -> LoadedRecipe:
    p = Path(path)
    if not p.is_file():
        raise RecipeError(
            f"recipe file not found: '{p}'. Pass the path to a recipe YAML file "
            "(`quantlab recipes list` shows the shipped ones)."
        )
    data, chain = read_recipe_data(p)
    label = f"{p} (extends {chain[0].name})" if chain else str(p)
    recipe = parse_recipe(data, file=label)
    loaded = LoadedRecipe(recipe=recipe, path=p.resolve(), extends=chain)
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
    schema["properties"][EXTENDS] = {  # read before validation (read_recipe_data), so not a Recipe field
        "type": "string", "description": "Another recipe file (relative to this one) this one is laid over: "
        "mappings merge key by key, a list or a value set here replaces the other's."}
    return schema
