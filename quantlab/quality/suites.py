"""Eval suites as data: a folder with `suite.yaml`, lm-eval task YAML and local JSONL.

Loading checks what can be checked without starting lm-eval: the suite file's schema,
that every listed task has a task YAML here (or is a hub task), that every data file a
task YAML names exists, and that each task's gated metric is one its YAML lists. The
suite hash (every file in the folder) keys the baseline cache.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import ValidationError

from quantlab.core.shipped import EVAL_SUITES
from quantlab.core.errors import RecipeError
from quantlab.core.fsutil import sha256_file
from quantlab.core.safe_yaml import BudgetLoader, load_file
from quantlab.recipe.quality import QualitySpec, SuiteFile, SuiteTask
from quantlab.quality.standard_suite import BUILD_HINT, LOCK_FILE, built_copy, verify

SHIPPED = EVAL_SUITES  # the shipped suites (core/shipped.py)
SUITE_FILE = "suite.yaml"
# metrics lm-eval computes for an output type without a metric_list entry naming them
IMPLICIT = {"loglikelihood_rolling": {"word_perplexity", "byte_perplexity", "bits_per_byte"}}
# directions of lm-eval's own metrics, for tasks whose YAML (or a hub task) does not state one
KNOWN_DIRECTIONS = {"acc": True, "acc_norm": True, "exact_match": True, "f1": True, "mcc": True, "bleu": True,
                    "pass@1": True, "word_perplexity": False, "byte_perplexity": False, "bits_per_byte": False,
                    "perplexity": False}


class TaskYamlLoader(BudgetLoader):
    """Reads lm-eval task YAML without importing the functions `!function` names (within
    core/safe_yaml's size and alias budget)."""


TaskYamlLoader.add_constructor("!function", lambda loader, node: f"!function {loader.construct_scalar(node)}")


@dataclass
class Suite:
    name: str
    folder: Path | None  # None for the recipe's hub tasks
    tasks: list[SuiteTask]
    kl_texts: Path | None = None
    sha256: str = ""
    task_files: dict[str, Path] = field(default_factory=dict)
    directions: dict[str, bool] = field(default_factory=dict)  # task -> its metric is higher-is-better
    code_tasks: set[str] = field(default_factory=set)  # tasks whose task YAML says `unsafe_code: true`


def suite_folder(name: str, recipe_dir: Path) -> Path:
    direct = (recipe_dir / name).resolve()
    if (direct / SUITE_FILE).is_file():
        return direct
    if (SHIPPED / name / SUITE_FILE).is_file():
        if (SHIPPED / name / LOCK_FILE).is_file():  # its data is built on this machine, into the user cache
            built = built_copy(SHIPPED / name)
            return built if (built / SUITE_FILE).is_file() else SHIPPED / name  # unbuilt: loading says how
        return SHIPPED / name
    shipped = sorted(p.parent.name for p in SHIPPED.glob(f"*/{SUITE_FILE}"))
    raise RecipeError(f"eval suite '{name}' not found: no {direct / SUITE_FILE} and no shipped suite of that name "
                      f"(shipped: {', '.join(shipped) or 'none'})", field="quality.suites")


def folder_sha256(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        # what lm-eval reads: task YAML, data, scorers (a README edit is not a new suite)
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".md":
            h.update(p.relative_to(folder).as_posix().encode() + b"\0")
            h.update(bytes.fromhex(sha256_file(p)))
    return h.hexdigest()


def _task_yamls(folder: Path) -> dict[str, tuple[Path, dict]]:
    out = {}
    for path in sorted(folder.rglob("*.yaml")):
        if path.name == SUITE_FILE:
            continue
        try:
            data = load_file(path, loader=TaskYamlLoader)
        except yaml.YAMLError as err:
            raise RecipeError(f"task YAML {path} does not parse: {err}", file=str(path)) from None
        if isinstance(data, dict) and isinstance(data.get("task"), str):
            out[data["task"]] = (path, data)
        include = (path.parent / data["include"]) if isinstance(data, dict) and isinstance(data.get("include"), str) \
            else None
        if include is not None and include.suffix != ".yaml" and include.is_file():
            try:  # lm-eval reads it too: within the same budget (the *.yaml here are read above)
                load_file(include, loader=TaskYamlLoader)
            except yaml.YAMLError as err:
                raise RecipeError(f"{include}, which task YAML {path.name} includes, does not parse: {err}",
                                  file=str(include)) from None
    return out


def _check_task(folder: Path, suite_path: Path, i: int, task: SuiteTask, path: Path, data: dict) -> None:
    where = f"tasks.{i}"
    files = ((data.get("dataset_kwargs") or {}).get("data_files") or {})
    for split, rel in (files.items() if isinstance(files, dict) else []):
        for one in [rel] if isinstance(rel, str) else rel:
            if not (folder / one).is_file():
                raise RecipeError(f"task '{task.task}' ({path.name}) reads {split} data from '{one}', which does "
                                  f"not exist in {folder}", file=str(suite_path), field=where)
    listed = {m.get("metric") for m in data.get("metric_list") or [] if isinstance(m, dict)}
    listed |= IMPLICIT.get(data.get("output_type", ""), set())
    if listed and task.metric not in listed:
        raise RecipeError(f"task '{task.task}' gates metric '{task.metric}', which its task YAML {path.name} does "
                          f"not produce (it lists: {', '.join(sorted(m for m in listed if m))})",
                          file=str(suite_path), field=f"{where}.metric")
    unsafe = data.get("unsafe_code", False)  # lm-eval's own key: the task executes model output
    if not isinstance(unsafe, bool):
        raise RecipeError(f"task '{task.task}' ({path.name}) has unsafe_code: {unsafe!r}; expected true (the task "
                          "executes code the model wrote) or false", file=str(path), field="unsafe_code")
    if unsafe and data.get("output_type") != "generate_until":
        raise RecipeError(f"task '{task.task}' ({path.name}) says unsafe_code: true but is a "
                          f"{data.get('output_type')} task: only a generated answer is code to run",
                          file=str(path), field="unsafe_code")
    if task.api == "chat" and data.get("output_type") != "generate_until":
        raise RecipeError(f"task '{task.task}' is a {data.get('output_type')} task: the chat API only generates, "
                          "so it needs api: completions", file=str(suite_path), field=f"{where}.api")


def metric_direction(task: SuiteTask, data: dict | None, *, file: str, field: str) -> bool:
    """Whether the task's gated metric is higher-is-better: the suite's word, else its task
    YAML's metric_list, else lm-eval's known metrics. Unknown is refused: a gate that
    guessed the direction would read a regression as a gain."""
    if task.higher_is_better is not None:
        return task.higher_is_better
    for m in (data or {}).get("metric_list") or []:
        if isinstance(m, dict) and m.get("metric") == task.metric and isinstance(m.get("higher_is_better"), bool):
            return m["higher_is_better"]
    if task.metric in KNOWN_DIRECTIONS:
        return KNOWN_DIRECTIONS[task.metric]
    raise RecipeError(f"task '{task.task}' gates metric '{task.metric}', whose direction is not known: its task "
                      "YAML's metric_list gives no higher_is_better for it. Set higher_is_better: true or false on "
                      "the task", file=file, field=field)


def load_suite(folder: Path) -> Suite:
    path = folder / SUITE_FILE
    try:
        data = load_file(path) or {}
        if not isinstance(data, dict):
            raise RecipeError(f"expected a YAML mapping (name, tasks, ...), found {type(data).__name__}",
                              file=str(path))
        spec = SuiteFile(**data)
    except yaml.YAMLError as err:
        raise RecipeError(f"suite file does not parse: {err}", file=str(path)) from None
    except ValidationError as err:
        first = err.errors()[0]
        raise RecipeError(f"suite file is not valid: {first['msg']}", file=str(path),
                          field=".".join(str(x) for x in first["loc"])) from None
    if (folder / LOCK_FILE).is_file():  # data built from pinned sources: the files must be those
        problems = verify(folder)
        if problems:
            raise RecipeError(f"suite '{spec.name}': {'; '.join(problems)}. Build it with {BUILD_HINT}",
                              file=str(folder / LOCK_FILE))
    yamls = _task_yamls(folder)
    task_files, directions, code_tasks = {}, {}, set()
    for i, task in enumerate(spec.tasks):
        if task.task not in yamls:
            raise RecipeError(f"task '{task.task}' has no task YAML in {folder} (found: "
                              f"{', '.join(sorted(yamls)) or 'none'})", file=str(path), field=f"tasks.{i}.task")
        task_path, data = yamls[task.task]
        _check_task(folder, path, i, task, task_path, data)
        task_files[task.task] = task_path
        directions[task.task] = metric_direction(task, data, file=str(path), field=f"tasks.{i}.higher_is_better")
        if data.get("unsafe_code"):
            code_tasks.add(task.task)
    kl = folder / spec.kl_texts if spec.kl_texts else None
    if kl is not None and not kl.is_file():
        raise RecipeError(f"kl_texts file '{spec.kl_texts}' does not exist in {folder}", file=str(path),
                          field="kl_texts")
    return Suite(spec.name, folder, spec.tasks, kl, folder_sha256(folder), task_files, directions, code_tasks)


def load_suites(spec: QualitySpec, recipe_dir: Path) -> list[Suite]:
    """The recipe's suites (each task once), filtered by quality.tasks, plus hub tasks."""
    suites = [load_suite(suite_folder(name, recipe_dir)) for name in spec.suites]
    if spec.hub_tasks:
        hub_id = hashlib.sha256(repr([t.model_dump() for t in spec.hub_tasks]).encode()).hexdigest()
        directions = {t.task: metric_direction(t, None, file="<recipe>",
                                               field=f"quality.hub_tasks.{i}.higher_is_better")
                      for i, t in enumerate(spec.hub_tasks)}
        suites.append(Suite("hub", None, list(spec.hub_tasks), None, hub_id, directions=directions))
    seen: dict[str, str] = {}
    for s in suites:
        for t in s.tasks:
            if t.task in seen:
                raise RecipeError(f"task '{t.task}' is in two suites ({seen[t.task]} and {s.name})",
                                  field="quality.suites")
            seen[t.task] = s.name
    if spec.tasks is not None:
        unknown = sorted(set(spec.tasks) - set(seen))
        if unknown:
            raise RecipeError(f"quality.tasks names {', '.join(unknown)}, not in the suites "
                              f"(they have: {', '.join(sorted(seen))})", field="quality.tasks")
        for s in suites:
            s.tasks = [t for t in s.tasks if t.task in spec.tasks]
    for name in list(spec.task_gates):
        if name not in seen:
            raise RecipeError(f"quality.task_gates names task '{name}', which no suite runs "
                              f"(tasks: {', '.join(sorted(seen))})", field=f"quality.task_gates.{name}")
    slices = {t.slice for s in suites for t in s.tasks}
    for name in list(spec.slice_gates):
        if name not in slices:
            raise RecipeError(f"quality.slice_gates names slice '{name}', which no task belongs to "
                              f"(slices: {', '.join(sorted(slices))})", field=f"quality.slice_gates.{name}")
    return [s for s in suites if s.tasks]

