"""lm-eval 0.4.x's own output (`--output_path DIR --log_samples`) read as quality evidence:
the results file and each task's samples file turned into the rows and summary quantlab's
lm-eval child writes (quality/lmeval.py), so a baseline's and a candidate's logs made
elsewhere are paired and gated as quantlab's own runs are; check_pairable refuses two logs
that did not ask the same questions. Pure: no lm-eval import.

lm-eval's tracker (lm_eval/loggers/evaluation_tracker.py in 0.4.13) names a run's files after its
start: results_<date>.json and, beside it, samples_<task>_<date>.jsonl, opened in append
mode; several runs can share a folder. Files pair by that date id, never by the newest, and
the task names come from the results file (a task's name may hold underscores).
The samples' shapes are given back in quality/lmeval_log_samples.py.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantlab.core import redact
from quantlab.core.errors import RecipeError
from quantlab.core.stage_context import once
from quantlab.core.fsutil import write_json_atomic, write_text_atomic
from quantlab.quality.lmeval_log_samples import HOW, OUTPUT_TYPES, read_samples_file
from quantlab.quality.sample_format import compact_sample

# datetime.now().isoformat() with ':' made '-', as lm-eval's tracker names its files
DATE_ID = re.compile(r"_(\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}(?:\.\d+)?)$")
# lm-eval's own order for the model's name (loggers/evaluation_tracker._get_model_name)
MODEL_KEYS = ("peft", "delta", "pretrained", "model", "path", "engine")


@dataclass(frozen=True)
class TaskLog:
    task: str
    rows: list[dict]  # compact_sample of each restored sample line, as quantlab's child writes them
    summary: dict  # the <task>.summary.json quantlab's child writes ("seconds": None: not recorded per task)
    samples_file: Path
    config: dict  # the task's entry in the results file's "configs" (secret-looking metadata redacted)
    n_shot: int | None
    hashes: dict  # doc_id -> {"doc_hash", "prompt_hash", "target_hash"} as lm-eval recorded them


@dataclass(frozen=True)
class EvalLog:
    folder: Path
    results_file: Path
    files: list[Path]  # every file read: the results file, then each task's samples file
    lm_eval_version: str | None
    model_name: str | None
    model_args: dict
    seeds: dict  # random, numpy, torch, fewshot: as recorded, None where absent
    limit: float | int | None
    facts: dict  # what the file says of the environment; None where it says nothing
    tasks: dict[str, TaskLog]


def read_eval_log(path: Path, tasks: list[str] | None = None) -> EvalLog:
    """One lm-eval run's output: `path` is the folder given to --output_path, its model
    sub-folder, or one results_<date>.json. `tasks`: those to read (None: every task the
    results file names); a task it lacks is refused."""
    results_file = results_file_of(Path(path))
    data = _load_results(results_file)
    date = _date_id(results_file)
    known = list(data["configs"])
    for task in tasks or []:
        if task not in data["configs"]:
            raise RecipeError(f"task '{task}' is not in this lm-eval results file (its tasks: {', '.join(known)}); "
                              "run lm-eval on it too, or leave it out", file=str(results_file), field=f"configs.{task}")
    logs = {task: _task_log(data, results_file, date, task) for task in (tasks or known)}
    config = data.get("config") or {}
    model_args = _model_args(config.get("model_args"), results_file)
    return EvalLog(
        folder=results_file.parent, results_file=results_file,
        files=[results_file] + [t.samples_file for t in logs.values()],
        lm_eval_version=_known(data.get("lm_eval_version")),
        model_name=next((str(model_args[k]) for k in MODEL_KEYS if model_args.get(k) not in (None, "")),
                        _known(data.get("model_name"))),
        model_args=model_args,
        seeds={k: config.get(f"{k}_seed") for k in ("random", "numpy", "torch", "fewshot")},
        limit=config.get("limit"), facts=_facts(data, config, date), tasks=logs)


def tasks_of(path: Path) -> list[str]:
    """The tasks one lm-eval output holds (its results file's configs)."""
    return list(_load_results(results_file_of(Path(path)))["configs"])


def read_role_logs(paths: list[Path], tasks: list[str], *, field: str) -> list[EvalLog]:
    """One role's lm-eval outputs (a completions run and a chat run: lm-eval needs one of each),
    each read for the recipe's tasks it holds; every task in exactly one of them, and each
    output holding one at least (RecipeError naming the output and `field` otherwise)."""
    held = [(Path(p), [t for t in tasks if t in set(tasks_of(Path(p)))]) for p in paths]
    for task in tasks:
        where = [str(p) for p, ts in held if task in ts]
        if len(where) != 1:
            why = ("is in none of them: run lm-eval on it too, or leave it out of the recipe" if not where else
                   f"is in {len(where)} of them ({', '.join(where)}): give one run a task")
            raise RecipeError(f"task '{task}' of the recipe {why} (outputs given: {', '.join(str(p) for p, _ in held)})",
                              file=str(held[0][0]), field=field)
    for p, ts in held:
        if not ts:
            raise RecipeError(f"this lm-eval output holds none of the recipe's tasks ({', '.join(tasks)}): leave it "
                              "out, or add its tasks to the recipe", file=str(p), field=field)
    return [read_eval_log(p, ts) for p, ts in held]


def role_logs_once(ctx: Any, paths: list[Path], tasks: list[str], *, field: str) -> list[EvalLog]:
    """read_role_logs, once per run for the same files and tasks (core/stage_context.once): the
    evidence stage, the stream and the quality stage of one decision read each output once."""
    key = ("lm-eval logs", tuple(str(p) for p in paths), tuple(tasks))
    return once(ctx, repr(key), lambda: read_role_logs(paths, tasks, field=field))


def results_file_of(path: Path) -> Path:
    """The one results file at `path` (a file, a folder, or a folder of model sub-folders)."""
    if path.is_file():
        if path.name.startswith("samples_"):
            raise RecipeError(f"this is one task's samples file; give the run's results_<date>.json beside it, or "
                              f"its folder ({path.parent})", file=str(path))
        return path
    if not path.is_dir():
        raise RecipeError(f"no such file or folder; {HOW}", file=str(path))
    found = sorted(path.glob("results_*.json")) or sorted(path.glob("*/results_*.json"))
    if not found:
        raise RecipeError(f"no lm-eval results file (results_<date>.json) here or in a model sub-folder; {HOW}",
                          file=str(path))
    if len(found) > 1:  # lm-eval appends: several runs can share a folder, and none is more right
        raise RecipeError(f"{len(found)} lm-eval runs are in this folder ({', '.join(str(f) for f in found)}); "
                          "name the run to use: its model sub-folder or its results file", file=str(path))
    return found[0]


def _load_results(file: Path) -> dict[str, Any]:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise RecipeError(f"not an lm-eval results file: it is not JSON ({err}); {HOW}", file=str(file)) from None
    for key in ("results", "configs"):
        if not isinstance(data, dict) or not isinstance(data.get(key), dict):
            raise RecipeError(f"not an lm-eval results file: no '{key}' object (lm-eval 0.4.x writes 'results', "
                              f"'configs', 'config' and the versions); {HOW}", file=str(file), field=key)
    if not data["configs"]:
        raise RecipeError(f"the results file names no task; {HOW}", file=str(file), field="configs")
    return data


def _date_id(file: Path) -> str:
    m = DATE_ID.search(file.stem)
    if not m:
        raise RecipeError("the results file is not named as lm-eval names it (results_<date>.json, the date as "
                          "2026-01-31T12-00-00.123456): its samples files cannot be told from another run's; "
                          "give the file lm-eval wrote, under its own name", file=str(file))
    return m.group(1)


def _task_log(data: dict[str, Any], results_file: Path, date: str, task: str) -> TaskLog:
    config = data["configs"][task]
    if not isinstance(config, dict):
        raise RecipeError("a task's config is not an object", file=str(results_file), field=f"configs.{task}")
    kind = config.get("output_type")
    if kind not in OUTPUT_TYPES:
        raise RecipeError(f"task '{task}' has output_type {kind!r}; expected one of {', '.join(OUTPUT_TYPES)} "
                          "(lm-eval 0.4.x)", file=str(results_file), field=f"configs.{task}.output_type")
    samples_file = results_file.parent / f"samples_{task}_{date}.jsonl"
    if not samples_file.is_file():
        why = ("the run was made without --log_samples (its results file has no task_hashes): run it again with "
               "--log_samples" if not (data.get("task_hashes") or {}).get(task) else
               "it was moved or deleted: give the folder lm-eval wrote, whole")
        raise RecipeError(f"no samples file for task '{task}' beside the results file (expected {samples_file.name}); "
                          f"{why}", file=str(results_file), field=f"configs.{task}")
    samples = read_samples_file(samples_file, kind, config.get("doc_to_choice") is not None)
    _check_count(samples, data, task, samples_file)
    rows = [json.loads(json.dumps(compact_sample(s), default=str)) for s in samples]
    n_shot = (data.get("n-shot") or {}).get(task, config.get("num_fewshot"))
    summary = {"task": task, "results": data["results"].get(task, {}),
               "higher_is_better": (data.get("higher_is_better") or {}).get(task, {}), "n_samples": len(rows),
               "seconds": None, "lm_eval": _known(data.get("lm_eval_version"))}
    hashes = {s["doc_id"]: {k: s.get(k) for k in ("doc_hash", "prompt_hash", "target_hash")} for s in samples}
    return TaskLog(task=task, rows=rows, summary=summary, samples_file=samples_file,
                   config=_redacted(config), n_shot=n_shot, hashes=hashes)


def _check_count(samples: list[dict[str, Any]], data: dict[str, Any], task: str, path: Path) -> None:
    effective = ((data.get("n-samples") or {}).get(task) or {}).get("effective")
    docs = {s["doc_id"] for s in samples}
    if isinstance(effective, int) and effective != len(docs):
        raise RecipeError(f"the samples file holds {len(docs)} documents, its results file says {effective} "
                          f"(n-samples.{task}.effective): a cut or mixed file; give the folder lm-eval wrote, whole",
                          file=str(path), field="doc_id")


def _model_args(raw: Any, file: Path) -> dict[str, Any]:
    """lm-eval records model_args as it was given: a dict, or its "k=v,k=v" string."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, str):
        parsed = {}
        for part in raw.split(","):
            key, sep, value = part.partition("=")
            if key.strip():
                parsed[key.strip()] = value.strip() if sep else True
        raw = parsed
    if not isinstance(raw, dict):
        raise RecipeError(f"model_args is {type(raw).__name__}; expected an object or 'k=v,...' text",
                          file=str(file), field="config.model_args")
    return _redacted(raw)


def _redacted(data: Any) -> Any:
    """Secret-looking values (api keys, tokens, credentials in URLs) out; lm-eval copies
    model_args into every task's metadata too."""
    if isinstance(data, dict):
        return {k: redact.REDACTED if (redact.secret_name(str(k)) and v not in (None, "", False)) or
                redact.secret_value(v) else _redacted(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_redacted(v) for v in data]
    return data


def _known(value: Any) -> Any:
    """None for what a record says it could not tell."""
    if value is None or (isinstance(value, str) and value.strip() in ("", "N/A", "Could not collect", "None")):
        return None
    return value.strip() if isinstance(value, str) else value


ENV_LINES = {"torch_version": "PyTorch version", "cuda_built": "CUDA used to build PyTorch",
             "cuda_runtime_version": "CUDA runtime version", "nvidia_driver_version": "Nvidia driver version",
             "cudnn_version": "cuDNN version", "os": "OS", "python_version": "Python version",
             "cpu_model": "Model name", "hip_runtime_version": "HIP runtime version"}


def _facts(data: dict[str, Any], config: dict[str, Any], date: str) -> dict[str, Any]:
    facts = {k: _known(data.get(k)) for k in ("lm_eval_version", "transformers_version", "git_hash", "upper_git_hash",
                                              "model_source", "chat_template_sha", "system_instruction_sha",
                                              "fewshot_as_multiturn", "max_length", "total_evaluation_time_seconds")}
    facts.update({k: _known(config.get(k)) for k in ("model_dtype", "model_num_parameters", "model_revision",
                                                     "model_sha", "device", "batch_size")})
    facts.update(date=_known(data.get("date")), date_id=date)
    facts.update(env_facts(data.get("pretty_env_info")))
    return facts


def env_facts(text: Any) -> dict[str, Any]:
    """The hardware and versions lines of torch's collect_env (lm-eval's pretty_env_info)."""
    lines = text.split("\n") if isinstance(text, str) else []
    values: dict[str, Any] = dict.fromkeys([*ENV_LINES, "gpus"])
    for i, line in enumerate(lines):
        name, sep, value = line.partition(":")
        for key, label in ENV_LINES.items():
            if sep and name.strip() == label and values[key] is None:
                values[key] = _known(value)
        if sep and name.strip() == "GPU models and configuration":
            # one GPU on the line; several on the lines after it ("GPU 0: ...")
            more = [x.strip() for x in lines[i + 1:i + 65] if re.match(r"\s*GPU \d+:", x)] if not value.strip() else []
            gpus = more or ([value.strip()] if _known(value) else [])
            values["gpus"] = gpus or None
    return values


def write_quantlab_form(log: EvalLog, out_dir: Path, tasks: list[str]) -> None:
    """Each task's <task>.jsonl and <task>.summary.json in out_dir, as quantlab's lm-eval
    child writes them (quality/lmeval.read_samples reads them), each file atomically."""
    for task in tasks:
        if task not in log.tasks:
            raise RecipeError(f"task '{task}' was not read from this log (read: {', '.join(log.tasks)})",
                              file=str(log.results_file), field=f"configs.{task}")
        t = log.tasks[task]
        write_text_atomic(Path(out_dir) / f"{task}.jsonl",
                          "".join(json.dumps(row, default=str) + "\n" for row in t.rows))
        write_json_atomic(Path(out_dir) / f"{task}.summary.json", t.summary)


# Task config fields that change what is asked or how it is scored. Not compared: metadata
# (lm-eval copies the model's arguments and the YAML's path into it; the task's version is
# compared from "versions"), the data's location (dataset_path, dataset_kwargs: a copy of the
# data elsewhere is the same data, and doc_hash says whether it is) and the task's name.
PROMPT_FIELDS = (
    "test_split", "validation_split", "fewshot_split", "process_docs",  # which documents
    "doc_to_text", "doc_to_target", "doc_to_choice", "doc_to_image", "doc_to_audio", "gen_prefix", "description",
    "target_delimiter", "fewshot_delimiter", "fewshot_config", "num_fewshot", "use_prompt",  # the prompt
    "multiple_input", "multiple_target",
    "output_type", "generation_kwargs", "repeats",  # the request: a longer max_gen_toks keeps the prompt's hash
    "filter_list", "process_results", "metric_list",  # what is scored, and how
)
HASHES = ("prompt_hash", "target_hash", "doc_hash")


def check_pairable(baseline: EvalLog, candidate: EvalLog, tasks: list[str]) -> None:
    """Refuse (RecipeError naming the file and field) two logs whose samples would not be
    the same questions: quantlab pairs them doc by doc. The model, its arguments and the
    dates may differ; so may seeds that change no prompt (few-shot ones where no task has
    few-shot examples). lm-eval versions are compared where both files say theirs (an older
    results file may not); the prompt, target and document hashes are compared always."""
    for log in (baseline, candidate):
        missing = [t for t in tasks if t not in log.tasks]
        if missing:
            raise RecipeError(f"task(s) {', '.join(missing)} not in this lm-eval log (it has: "
                              f"{', '.join(log.tasks) or 'none'}); run lm-eval on them for both models",
                              file=str(log.results_file), field=f"configs.{missing[0]}")
    file = str(candidate.results_file)
    if baseline.lm_eval_version and candidate.lm_eval_version and \
            baseline.lm_eval_version != candidate.lm_eval_version:
        raise RecipeError(f"lm-eval {candidate.lm_eval_version} made this log, {baseline.lm_eval_version} the "
                          f"baseline's ({baseline.results_file}): prompts and metrics can change between versions; "
                          "run both with the same lm-eval", file=file, field="lm_eval_version")
    if baseline.limit != candidate.limit:
        raise RecipeError(f"limit {candidate.limit} here, {baseline.limit} in the baseline's log "
                          f"({baseline.results_file}); run both with the same --limit", file=file, field="config.limit")
    few_shot = [t for t in tasks if baseline.tasks[t].n_shot or candidate.tasks[t].n_shot]
    if few_shot and baseline.seeds.get("fewshot") != candidate.seeds.get("fewshot"):
        raise RecipeError(f"few-shot seed {candidate.seeds.get('fewshot')} here, {baseline.seeds.get('fewshot')} in "
                          f"the baseline's log ({baseline.results_file}); task {few_shot[0]} draws few-shot examples "
                          "with it: run both with the same --seed", file=file, field="config.fewshot_seed")
    for task in tasks:
        _check_task(baseline.tasks[task], candidate.tasks[task], baseline, candidate)


def _check_task(base: TaskLog, cand: TaskLog, baseline: EvalLog, candidate: EvalLog) -> None:
    task, file = base.task, str(candidate.results_file)
    if base.n_shot != cand.n_shot:
        raise RecipeError(f"task {task}: {cand.n_shot} few-shot examples here, {base.n_shot} in the baseline's log "
                          f"({baseline.results_file}); run both with the same --num_fewshot", file=file,
                          field=f"configs.{task}.num_fewshot")
    for key in PROMPT_FIELDS:
        if base.config.get(key) != cand.config.get(key):
            raise RecipeError(f"task {task}: its config's {key} differs from the baseline's "
                              f"({baseline.results_file}): {_short(cand.config.get(key))} here, "
                              f"{_short(base.config.get(key))} there; the two runs did not ask (or score) the same "
                              "thing: run both with the same task definition", file=file,
                              field=f"configs.{task}.{key}")
    version = (base.config.get("metadata") or {}).get("version"), (cand.config.get("metadata") or {}).get("version")
    if version[0] != version[1]:
        raise RecipeError(f"task {task}: version {version[1]} here, {version[0]} in the baseline's log; run both "
                          "with the same task version", file=file, field=f"configs.{task}.metadata.version")
    b_docs, c_docs = set(base.hashes), set(cand.hashes)
    if b_docs != c_docs:
        only_b, only_c = sorted(b_docs - c_docs, key=str), sorted(c_docs - b_docs, key=str)
        raise RecipeError(f"task {task}: the two logs answered different documents ({len(b_docs)} in the baseline's, "
                          f"{len(c_docs)} here; only the baseline's: {only_b[:5]}, only here: {only_c[:5]}); run both "
                          "with the same --limit or --samples", file=str(cand.samples_file), field="doc_id")
    for key in HASHES:
        differ = sorted((d for d in b_docs if base.hashes[d].get(key) != cand.hashes[d].get(key)), key=str)
        if differ:
            raise RecipeError(f"task {task}: {len(differ)} of {len(b_docs)} documents have another {key} than in the "
                              f"baseline's log (doc ids {differ[:5]}): the two runs did not ask the same thing; "
                              "check the tokenizer's chat template, --apply_chat_template, --system_instruction, "
                              "the few-shot setup and the data", file=str(cand.samples_file), field=key)


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 120 else text[:117] + "..."
