"""Who the candidates of a comparison are (recipes, or checkpoints judged by a recipe) and
whether they can be compared against one baseline."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantlab.core.layout import CANDIDATES_DIR, COMPARE_DIR  # noqa: F401 (also read from here)
from quantlab.reports.comparison_records import Choice
from quantlab.recipe.selection import SelectionSpec
from quantlab.pipeline.candidate_run import CandidateRun
from quantlab.pipeline.context import RunContext
from quantlab.core.errors import RecipeError
from quantlab.recipe.file import LoadedRecipe, load_recipe
from quantlab.core.run import RunDir, new_run_folder


# recipe sections that must be equal: one baseline, served and loaded the same way for all
SHARED_SECTIONS = ("serve", "performance")


# what each candidate may set for itself in its serve section (mode 'endpoint': where it is served)
CANDIDATE_SERVE_FIELDS = ("candidate_endpoint", "candidate_served_model_name")


@dataclass
class Candidate:
    name: str
    loaded: LoadedRecipe
    checkpoint: Path | None = None  # an existing checkpoint (validated, not quantized)
    lifecycle: CandidateRun | None = None  # its run folder, context and stages to run, once prepared
    refused: str | None = None  # by its preflight, before any work
    failed: str | None = None  # a stage failed or its server died; the others go on

    @property
    def active(self) -> bool:
        return self.refused is None and self.failed is None

    @property
    def run(self) -> RunDir | None:
        return self.lifecycle.run if self.lifecycle is not None else None

    @property
    def ctx(self) -> RunContext | None:
        return self.lifecycle.ctx if self.lifecycle is not None else None

    @property
    def origin(self) -> str:
        return f"checkpoint {self.checkpoint}" if self.checkpoint is not None else str(self.loaded.path)


def candidates_of(recipes: list[Path | LoadedRecipe], checkpoints: dict[str, Path] | None = None,
                  judge_by: Path | None = None) -> list[Candidate]:
    """Each recipe (a file, or one already loaded) a candidate, then each existing
    checkpoint, judged by `judge_by` (the first recipe by default): its checks, baseline
    and serving, under the checkpoint's name."""
    cands = [Candidate(lr.recipe.name, lr) for lr in (r if isinstance(r, LoadedRecipe) else load_recipe(r)
                                                      for r in recipes)]
    if checkpoints:
        judge_file = judge_by or (recipes[0] if recipes else None)
        if judge_file is None:
            raise RecipeError("existing checkpoints are judged by a recipe's checks: pass one")
        judge = judge_file if isinstance(judge_file, LoadedRecipe) else load_recipe(judge_file)
        for name, folder in checkpoints.items():
            if not Path(folder).is_dir():
                raise RecipeError(f"checkpoint candidate '{name}': {folder} is not a folder; pass a checkpoint "
                                  "folder (config.json and safetensors) as --checkpoint NAME=DIR")
            cands.append(Candidate(name, _renamed(judge, name), checkpoint=Path(folder)))
    return cands


def _renamed(judge: LoadedRecipe, name: str) -> LoadedRecipe:
    """The judging recipe under a checkpoint candidate's name (its run folder and row)."""
    try:
        return judge.variant(name)
    except ValueError:
        raise RecipeError(f"checkpoint candidate name '{name}' is not a valid name (lower-case letters, digits, "
                          "'.', '_', '-'; at most 64): give one as --checkpoint NAME=DIR", field="--checkpoint") \
            from None


@dataclass
class Comparison:
    folder: Path
    candidates: list[Candidate]
    choice: Choice | None
    table_md: str
    exit_code: int  # 0 one chosen, 1 none released, 3 none could be judged
    data: dict[str, Any] = field(default_factory=dict)  # what comparison.json holds


def check_comparable(cands: list[Candidate], minimum: int = 2) -> None:
    """Two or more candidates that can share one baseline; RecipeError naming file and field otherwise."""
    if len(cands) < minimum:
        raise RecipeError("a comparison needs two or more candidates; for one, `quantlab run RECIPE` "
                          "(or `quantlab validate RECIPE --checkpoint DIR`)")
    seen: dict[str, str] = {}
    for c in cands:
        if c.name in seen:
            where = c.origin if c.origin != seen[c.name] else f"{c.origin}, given twice"
            raise RecipeError(f"two candidates are named '{c.name}' ({seen[c.name]} and {where}): each "
                              "candidate's run folder and row in the comparison go by its name; rename one",
                              file=str(c.loaded.path), field="name" if c.checkpoint is None else "--checkpoint")
        seen[c.name] = c.origin
    loaded = [c.loaded for c in cands]
    first = loaded[0]
    for lr in loaded:
        _check_same_host(lr)
    for lr in loaded[1:]:
        model_a = _model_identity(first)
        model_b = _model_identity(lr)
        if model_a != model_b:
            raise RecipeError(f"'{lr.recipe.name}' starts from a different model than '{first.recipe.name}' "
                              f"({model_b} against {model_a}): candidates are compared with one baseline, so they "
                              "must quantize the same model", file=str(lr.path), field="model")
        for section in SHARED_SECTIONS:
            a, b = _dump(first, section), _dump(lr, section)
            if section == "serve" and a and b:  # each candidate may be served elsewhere (its own endpoint)
                a, b = ({k: v for k, v in x.items() if k not in CANDIDATE_SERVE_FIELDS} for x in (a, b))
            if section == "performance" and (a is None or b is None):
                continue  # a candidate without one is judged on the other checks (e.g. served on another host)
            if a != b:
                diff = sorted(k for k in set(a or {}) | set(b or {}) if (a or {}).get(k) != (b or {}).get(k))
                raise RecipeError(f"'{lr.recipe.name}' has a different `{section}` section than "
                                  f"'{first.recipe.name}' (differs in: {', '.join(diff) or 'presence'}): one baseline "
                                  f"server and one paired load need one {section} section; make them equal",
                                  file=str(lr.path), field=section)
        if lr.recipe.selection is not None and first.recipe.selection is not None \
                and lr.recipe.selection != first.recipe.selection:
            raise RecipeError(f"'{lr.recipe.name}' and '{first.recipe.name}' choose by different `selection` "
                              "sections; give it in one recipe (or the same in all)", file=str(lr.path),
                              field="selection")


def _check_same_host(lr: LoadedRecipe) -> None:
    """Performance is compared only between servers on one host: a candidate served at an
    endpoint on another host than the baseline's is judged on quality and stability only."""
    spec = lr.recipe.serve
    if spec.mode != "endpoint" or lr.recipe.performance is None:
        return
    where, base = host_of(spec.candidate_endpoint or spec.endpoint), host_of(spec.endpoint)
    if where != base:
        raise RecipeError(f"'{lr.recipe.name}' is served on {where}, the baseline on {base}: performance is "
                          "compared only between servers on the same host; remove its `performance` section "
                          "(its quality and stability are still compared with the baseline's) or serve it on "
                          f"{base}", file=str(lr.path), field="performance")


def host_of(url: str) -> str:
    """The host a base URL points at; the loopback names are one host."""
    from urllib.parse import urlsplit

    host = (urlsplit(url).hostname or "").lower()
    return "localhost" if host in ("localhost", "127.0.0.1", "::1") else host


def _model_identity(lr: LoadedRecipe) -> dict[str, Any]:
    m = lr.recipe.model.model_dump(mode="json")
    source = m.get("source")
    if isinstance(source, str) and source != "default" and lr.resolve(source).exists():
        m["source"] = str(lr.resolve(source))  # relative to each recipe's own folder
    return m


def _dump(lr: LoadedRecipe, section: str) -> dict[str, Any] | None:
    value = getattr(lr.recipe, section)
    return value.model_dump(mode="json") if value is not None else None


def selection_of(loaded: list[LoadedRecipe]) -> SelectionSpec:
    return next((lr.recipe.selection for lr in loaded if lr.recipe.selection is not None), SelectionSpec())


def create_folder(runs_root: Path, cands: list[Candidate]) -> Path:
    import hashlib

    digest = hashlib.sha256("".join(c.loaded.content_hash + c.origin for c in cands).encode()).hexdigest()
    return new_run_folder(Path(runs_root) / COMPARE_DIR, digest)
