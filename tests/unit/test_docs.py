"""README.md and docs/*.md stay true to the code: no engine is started, no model built.

What is checked, in README.md and every docs/*.md:

- Command lines. Every line of a fenced block typed bash, sh, shell or console, or
  untyped, that starts with `quantlab ` or `.venv/bin/quantlab ` (after an optional `$ `
  prompt and `VAR=value` assignments) must parse with the real CLI: the subcommand chain
  is resolved on typer's click command and the last command's `make_context` must accept
  the arguments (a `click.UsageError` fails with the file and line). Trailing
  `# comments` are dropped and `\\` continuations joined; the line ends at a pipe or a
  redirection; a command substitution `$(...)` stands as one argument and is parsed on
  its own when it is a quantlab command. Placeholders (`RECIPE`, `RUN_DIR`, `<id>`) are
  fine: no argument or option of the CLI checks that its path exists, which
  `test_no_cli_path_must_exist` keeps true (if one ever does, substitute a shipped file
  for such placeholders here). ```text blocks are synopses (`[optional]`, `a|b`) and are
  not parsed.
- Recipes. A ```yaml block is a whole recipe when its top level has `extends:` or
  `name:`; it is a fragment when every top-level key is a recipe section (`serve:`,
  `quality:`, ...), and a fragment is laid over `recipes/gptq-w4a16.yaml` with `extends:`
  (mappings merge key by key, as a user's file would). Other YAML (CI files, suite files)
  is not a recipe and is skipped. Each recipe is written into a temporary copy of
  `recipes/` beside a copy of `calib_data/`, so its relative paths (`../calib_data/...`,
  `extends: gptq-w4a16.yaml`, `traffic/...`) mean what they mean in `recipes/`, and is
  loaded with the project's recipe loader. Files the loader requires to exist and that the
  docs name only as examples (a signing key, a certificate, a workload's prompt dataset)
  are created empty in the copy first.
- Paths. Every backticked span in the prose (not in code blocks) whose first word starts
  with `recipes/`, `scripts/`, `docs/`, `tests/`, `calib_data/`, `eval_suites/`,
  `requirements/`, `quantlab/`, `.ci/` or `deploy/`, or is `Makefile`, names something in the
  repository (a glob must match something; spans with `<placeholders>` are skipped).
  Paths relative to the package (`core/recipe.py` in docs/design.md) are not checked.
- Links. Every relative Markdown link points at a file, and its `#anchor` at a heading.
- The README is a map: at most 260 lines, and its table of pages lists every docs/*.md,
  each of which exists. docs/cli.md names every command and every option of the CLI.
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest
import typer
import yaml

import quantlab.cli

from quantlab.recipe.file import load_recipe

try:  # typer 0.29 carries its own copy of click
    from typer._click.exceptions import UsageError
except ImportError:  # an older typer: click itself
    from click.exceptions import UsageError
try:
    from click.exceptions import Exit as ClickExit
except ImportError:
    ClickExit = typer.Exit
EXITS = (typer.Exit, ClickExit)  # what --help and --version end with

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [REPO / "README.md", *DOCS]
README_MAX_LINES = 260
SHELL_LANGS = {"", "bash", "sh", "shell", "console"}
PATH_PREFIXES = ("recipes/", "scripts/", "docs/", "tests/", "calib_data/", "eval_suites/", "requirements/",
                 "quantlab/", ".ci/", "deploy/")
FRAGMENT_BASE = "gptq-w4a16.yaml"
# what the loader insists exists, and the docs name as an example of a file the user makes
EXAMPLE_FILES = (("signing", "private_key"), ("signing", "signing_certificate"))


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def fenced_blocks(text: str) -> list[tuple[str, int, list[str]]]:
    """(language, line number of the first code line, code lines) of every fenced block."""
    blocks, lang, start, body = [], None, 0, []
    for n, line in enumerate(text.splitlines(), 1):
        fence = re.match(r"^\s*```\s*([\w+-]*)", line)
        if fence and lang is None:
            lang, start, body = fence.group(1).lower(), n + 1, []
        elif fence and line.strip() == "```":
            blocks.append((lang, start, body))
            lang = None
        elif lang is not None:
            body.append(line)
    return blocks


def prose(text: str) -> str:
    """The text with fenced blocks blanked out (line numbers kept)."""
    out, inside = [], False
    for line in text.splitlines():
        if re.match(r"^\s*```", line):
            inside = not inside
            out.append("")
        else:
            out.append("" if inside else line)
    return "\n".join(out)


# ---------------------------------------------------------------- command lines

CLI = typer.main.get_command(quantlab.cli.app)
PROMPT = re.compile(r"^\$\s+")
ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*\s+")
COMMAND = re.compile(r"^(?:\.venv/bin/)?quantlab(?:\s|$)")
SUBSTITUTION = re.compile(r"\$\(([^()]*)\)")
SHELL_STOP = {"|", "||", "&", "&&", ";", ">", ">>", "<", "2>", "2>&1"}


def command_lines(lines: list[str], first: int) -> list[tuple[int, str]]:
    """(line number, command) for each quantlab command in a shell block's lines."""
    out, held, held_at = [], "", 0
    for n, raw in enumerate(lines, first):
        line = PROMPT.sub("", raw.strip()) if not held else raw.strip()
        if not held:
            held_at = n
            while ASSIGNMENT.match(line):
                line = ASSIGNMENT.sub("", line, count=1)
        line = re.sub(r"(^|\s)#.*$", "", line).rstrip()
        if line.endswith("\\"):
            held += line[:-1] + " "
            continue
        line, held = held + line, ""
        if COMMAND.match(line):
            out.append((held_at, line))
    return out


def argv(line: str) -> list[list[str]]:
    """The command's arguments after `quantlab`, then those of any quantlab command substituted in it."""
    inner = [m.group(1).strip() for m in SUBSTITUTION.finditer(line)]
    words = []
    for word in shlex.split(SUBSTITUTION.sub("SUBSTITUTED", line)):
        if word in SHELL_STOP:
            break
        words.append(word)
    return [words[1:], *(argv(i)[0] for i in inner if COMMAND.match(i))]


def is_group(cmd) -> bool:
    return hasattr(cmd, "get_command") and hasattr(cmd, "list_commands")


def parse(args: list[str]) -> str | None:
    """None when the real CLI accepts `quantlab ARGS`, else why not."""
    try:
        ctx = CLI.make_context("quantlab", list(args), resilient_parsing=False)
        cmd = CLI
        while is_group(cmd):
            rest = [*ctx.__dict__.get("_protected_args", ctx.__dict__.get("protected_args", [])), *ctx.args]
            if not rest:
                return f"'{ctx.command_path}' needs a subcommand"
            sub = cmd.get_command(ctx, rest[0])
            if sub is None:
                return f"'{ctx.command_path}' has no command '{rest[0]}'"
            ctx, cmd = sub.make_context(rest[0], rest[1:], parent=ctx, resilient_parsing=False), sub
    except EXITS:  # --help, --version
        return None
    except UsageError as e:
        return e.format_message()
    return None


def test_the_parser_refuses_what_the_cli_refuses():
    assert parse(["run", "recipes/gptq-w4a16.yaml", "--dry-run"]) is None
    assert parse(["recipes", "check", "a.yaml", "--preflight"]) is None
    assert parse(["run", "a.yaml", "--no-such-option"]) is not None
    assert parse(["validate", "a.yaml"]) is not None  # --checkpoint is required
    assert parse(["recipes", "frobnicate"]) is not None
    assert parse(["recipes", "list", "schema"]) is not None


def test_no_cli_path_must_exist():
    """Placeholders in the docs' command lines parse only while no path argument checks that it exists."""
    def walk(cmd, path):
        for p in cmd.params:
            if getattr(getattr(p, "type", None), "exists", False):
                yield f"{path} {p.name}"
        if is_group(cmd):
            ctx = cmd.context_class(cmd, info_name=path)
            for name in cmd.list_commands(ctx):
                yield from walk(cmd.get_command(ctx, name), f"{path} {name}")

    assert list(walk(CLI, "quantlab")) == []


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_command_lines_parse(page: Path):
    problems = []
    for n, line in page_commands(page):
        for args in argv(line):
            why = parse(args)
            if why:
                problems.append(f"{rel(page)}:{n}: `{line}`: {why}")
    assert not problems, "\n".join(problems)


def page_commands(page: Path) -> list[tuple[int, str]]:
    out = []
    for lang, first, lines in fenced_blocks(page.read_text(encoding="utf-8")):
        if lang in SHELL_LANGS:
            out += command_lines(lines, first)
    return out


def test_the_docs_hold_command_lines():
    """The check above sees the CLI page's examples (a guard against a changed fence or prompt rule)."""
    lines = page_commands(REPO / "docs" / "cli.md")
    assert len(lines) >= 20, lines
    assert any("$(" in line for _, line in lines)


# ---------------------------------------------------------------- recipes

def recipe_sections() -> set[str]:
    module = sys.modules[load_recipe.__module__]
    return set(module.Recipe.model_fields) - {"name"}


@pytest.fixture(scope="module")
def recipes_copy(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("docs-recipes")
    shutil.copytree(REPO / "recipes", root / "recipes")
    shutil.copytree(REPO / "calib_data", root / "calib_data")
    return root / "recipes"


def recipe_blocks(page: Path) -> list[tuple[int, str, dict]]:
    """(line, 'whole' or 'fragment', data) of the page's YAML blocks that are recipes."""
    sections, out = recipe_sections(), []
    for lang, first, lines in fenced_blocks(page.read_text(encoding="utf-8")):
        if lang not in ("yaml", "yml"):
            continue
        try:
            data = yaml.safe_load("\n".join(lines))
        except yaml.YAMLError as e:
            out.append((first, "broken", {"error": str(e)}))
            continue
        if not isinstance(data, dict):
            continue
        if "extends" in data or "name" in data:
            out.append((first, "whole", data))
        elif set(data) <= sections:
            out.append((first, "fragment", data))
    return out


def example_files(data: dict, folder: Path) -> None:
    """Create, empty, the files the loader insists on that a doc names as an example."""
    for section, key in EXAMPLE_FILES:
        value = (data.get(section) or {}).get(key)
        if isinstance(value, str):
            (folder / value).parent.mkdir(parents=True, exist_ok=True)
            (folder / value).touch()
    for w in (data.get("performance") or {}).get("workloads") or []:
        if isinstance(w, dict) and isinstance(w.get("dataset"), str):
            (folder / w["dataset"]).parent.mkdir(parents=True, exist_ok=True)
            (folder / w["dataset"]).touch()


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_recipe_blocks_validate(page: Path, recipes_copy: Path):
    problems = []
    for i, (line, kind, data) in enumerate(recipe_blocks(page)):
        if kind == "broken":
            problems.append(f"{rel(page)}:{line}: not YAML: {data['error']}")
            continue
        if kind == "fragment":
            data = {"extends": FRAGMENT_BASE, "name": f"docs-fragment-{i}", **data}
        file = recipes_copy / f"_docs_{page.stem}_{line}.yaml"
        file.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        example_files(data, recipes_copy)
        try:
            load_recipe(file)
        except Exception as e:  # RecipeError, or a pydantic error the loader let through
            problems.append(f"{rel(page)}:{line}: {kind} recipe does not load: {e}")
    assert not problems, "\n".join(problems)


def test_the_docs_hold_recipes():
    """The check above sees the recipe reference (a guard against a changed fence or rule)."""
    kinds = [kind for _, kind, _ in recipe_blocks(REPO / "docs" / "recipes.md")]
    assert kinds.count("whole") >= 2 and kinds.count("fragment") >= 8, kinds


# ---------------------------------------------------------------- paths and links

SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def named_paths(page: Path) -> list[tuple[int, str]]:
    out = []
    for n, line in enumerate(prose(page.read_text(encoding="utf-8")).splitlines(), 1):
        for span in SPAN.findall(line):
            word = span.split()[0].rstrip(".,:;)") if span.split() else ""
            word = word.split("#")[0]
            if "<" in word or "{" in word or "..." in word:
                continue
            if word == "Makefile" or word.startswith(PATH_PREFIXES):
                out.append((n, word))
    return out


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_named_paths_exist(page: Path):
    missing = []
    for n, word in named_paths(page):
        found = any(REPO.glob(word)) if any(c in word for c in "*?[") else (REPO / word).exists()
        if not found:
            missing.append(f"{rel(page)}:{n}: `{word}` is not in the repository")
    assert not missing, "\n".join(missing)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[`*]", "", heading.strip().lower())  # GitHub keeps underscores (they are word characters)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+)$", prose(page.read_text(encoding="utf-8")),
                                                  re.MULTILINE)}


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_links_resolve(page: Path):
    problems = []
    for n, line in enumerate(prose(page.read_text(encoding="utf-8")).splitlines(), 1):
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                problems.append(f"{rel(page)}:{n}: link to {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{rel(page)}:{n}: link to {target}: no heading '#{anchor}' in {dest.name}")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------- the README, the CLI page

def test_readme_is_a_map():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; depth belongs in docs/"
    table = [line for line in lines if line.startswith("| [docs/")]
    listed = [re.match(r"\| \[[^\]]*\]\(([^)]+)\)", line).group(1) for line in table]
    assert listed, "README.md has no table of the pages under docs/"
    assert [p for p in listed if not (REPO / p).is_file()] == []
    assert sorted(listed) == sorted(rel(p) for p in DOCS), "the README's table and docs/*.md differ"


def cli_commands(cmd=CLI, path="quantlab"):
    """(command path, its option names) of every command of the CLI."""
    ctx = cmd.context_class(cmd, info_name=path)
    for name in cmd.list_commands(ctx):
        sub = cmd.get_command(ctx, name)
        if is_group(sub):
            yield from cli_commands(sub, f"{path} {name}")
        else:
            opts = [o for p in sub.params if p.param_type_name == "option" for o in p.opts if o.startswith("--")]
            yield f"{path} {name}", opts


def test_cli_page_names_every_command_and_option():
    text = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    missing = [f"{command} {opt}".strip() for command, opts in cli_commands()
               for opt in ["", *opts] if (command not in text if not opt else opt not in text)]
    assert not missing, "docs/cli.md does not name: " + ", ".join(missing)


DOCSTRING_PATH = re.compile(r"(?<![\w./-])((?:[a-z_][a-z0-9_]*/)+[a-z_][a-z0-9_]*\.py)\b")
OTHER_PROJECTS = ("vllm/", "lm_eval/", "llmcompressor/", "torch/", "transformers/", "ray/", "guidellm/")


def docstring_paths(module: Path) -> list[tuple[int, str]]:
    """(line, path) for each `a/b.py` a docstring of this module names."""
    import ast

    found = []
    for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            doc = ast.get_docstring(node) or ""
            found += [(getattr(node, "lineno", 1), p) for p in DOCSTRING_PATH.findall(doc)]
    return found


def test_every_path_a_docstring_names_exists():
    """A docstring's `quantize/spec.py` outlives the file it named: each path is found from the
    repository, quantlab/, or the module's own package upwards; another project's (vllm/...) is
    left to that project."""
    missing = []
    for module in sorted((REPO / "quantlab").rglob("*.py")):
        roots = [REPO, *[p for p in module.parents if p == REPO / "quantlab" or REPO / "quantlab" in p.parents]]
        for line, path in docstring_paths(module):
            if not path.startswith(OTHER_PROJECTS) and not any((root / path).exists() for root in roots):
                missing.append(f"{module.relative_to(REPO)}:{line}: `{path}` is not in the repository")
    assert not missing, "\n".join(missing)
