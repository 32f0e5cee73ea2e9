"""A user's YAML within a budget: alias bombs, deep nesting, cycles and huge files are
refused at once naming the file, through every loader that reads a user's YAML; every
shipped recipe, suite and task YAML still loads."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import RECIPES, REPO

from quantlab.core import safe_yaml
from quantlab.core.errors import RecipeError
from quantlab.core.safe_yaml import MAX_DEPTH, MAX_FILE_BYTES, MAX_NODES, load_file, load_text
from quantlab.quality.suites import SHIPPED, load_suite
from quantlab.recipe.file import load_recipe


def bomb(depth: int, fan: int = 9) -> str:
    """The billion laughs: each level an anchored list of `fan` aliases of the level below
    (fan ** depth leaves; a few hundred bytes)."""
    lines = ["x0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * fan)}]" for i in range(1, depth + 1)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("depth", [7, 9])
def test_a_parent_recipe_alias_bomb_is_refused_within_a_second(tmp_path, depth):
    parent = tmp_path / "parent.yaml"
    parent.write_text("name: parent\nquantization: {method: rtn, scheme: W4A16}\n" + bomb(depth))
    assert parent.stat().st_size < 1000  # a few hundred bytes that would expand to 9 ** depth nodes
    child = tmp_path / "child.yaml"
    child.write_text("extends: parent.yaml\nname: child\n")
    start = time.perf_counter()
    with pytest.raises(RecipeError, match=f"more than {MAX_NODES:,} nodes") as err:
        load_recipe(child)
    assert time.perf_counter() - start < 1.0
    assert err.value.file == str(parent.resolve())  # the file that holds the bomb is named
    assert err.value.exit_code == 2


def test_the_cli_refuses_a_bomb_with_exit_2_naming_the_file(tmp_path):
    (tmp_path / "bomb.yaml").write_text("name: bomb\nquantization: {method: rtn, scheme: W4A16}\n" + bomb(9))
    start = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "quantlab", "recipes", "check", "bomb.yaml"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    elapsed = time.perf_counter() - start  # the interpreter's own start included
    assert r.returncode == 2, r.stderr
    assert "bomb.yaml" in r.stderr and "alias" in r.stderr
    assert elapsed < 10, elapsed  # 9 ** 9 nodes would take hours; the refusal itself is milliseconds (above)


def test_the_expansion_is_counted_not_the_text():
    # the last list of bomb(4) holds 9 ** 5 = 59,049 leaves: under the budget, it loads; bomb(5) is over it
    data = load_text(bomb(4), source="four")
    assert len(data["x4"]) == 9 and data["x4"][0] is data["x3"]  # still shared objects once loaded
    with pytest.raises(RecipeError, match="more than 100,000 nodes"):
        load_text(bomb(5), source="five")


def test_a_long_string_repeated_by_aliases_is_refused():
    text = "s: &s " + "y" * 100_000 + "\nl: [" + ", ".join(["*s"] * 100) + "]\n"  # 10 MB once written out
    with pytest.raises(RecipeError, match="MiB of text"):
        load_text(text, source="strings")


@pytest.mark.parametrize("text, needle", [
    ("a: &a [1, *a]\n", "refers to a node that contains it"),
    ("a: &a {b: {c: *a}}\n", "refers to a node that contains it"),
    ("x: " + "[" * 100_000, f"nested more than {MAX_DEPTH} levels"),
    ("x: " + "{a: " * 5_000, f"nested more than {MAX_DEPTH} levels"),
])
def test_cycles_and_deep_nesting_are_refused_not_a_recursion_error(text, needle):
    with pytest.raises(RecipeError, match=needle):
        load_text(text, source="t")


def test_deep_nesting_through_aliases_is_refused():
    # each level is shallow in the text; written out, the last nests 70 levels deep
    lines = ["l0: &l0 [x]"] + [f"l{i}: &l{i} [*l{i - 1}]" for i in range(1, 70)]
    with pytest.raises(RecipeError, match=f"more than {MAX_DEPTH} levels deep once its aliases"):
        load_text("\n".join(lines), source="t")


def test_merge_keys_and_ordinary_aliases_still_load():
    text = "base: &b {dtype: bfloat16, seed: 1}\none: {<<: *b, seed: 2}\ntwo: *b\n"
    assert load_text(text, source="t") == {"base": {"dtype": "bfloat16", "seed": 1},
                                            "one": {"dtype": "bfloat16", "seed": 2},
                                            "two": {"dtype": "bfloat16", "seed": 1}}


def test_a_file_over_the_size_limit_is_refused_before_it_is_read_whole(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("# padding\n" * (MAX_FILE_BYTES // 10 + 10))
    with pytest.raises(RecipeError, match="larger than the 1 MiB") as err:
        load_file(big)
    assert err.value.file == str(big)


def test_a_character_device_is_read_only_up_to_the_limit():
    with pytest.raises(RecipeError, match="larger than the 1 MiB"):
        load_file("/dev/zero")  # endless: a read of the whole file would never return


def test_not_utf8_and_unreadable_files_are_refused(tmp_path):
    (tmp_path / "latin1.yaml").write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(RecipeError, match="not a UTF-8"):
        load_file(tmp_path / "latin1.yaml")
    with pytest.raises(RecipeError, match="cannot read it"):
        load_file(tmp_path / "missing.yaml")


def test_unsafe_tags_stay_refused():
    with pytest.raises(yaml.YAMLError):
        load_text("!!python/object/apply:os.system ['true']", source="t")


def test_every_shipped_yaml_file_loads_within_the_budget():
    from quantlab.quality.suites import TaskYamlLoader  # the loader the suites use

    # what the project ships (tracked by git), not what a run wrote into the checkout (a run
    # folder's checkpoint holds llm-compressor's own recipe.yaml, with a Python tuple tag)
    listed = subprocess.run(["git", "ls-files", "*.yaml"], cwd=REPO, capture_output=True, text=True, check=True)
    files = [REPO / line for line in listed.stdout.splitlines()]
    assert len(files) > 20
    for p in files:
        load_file(p, loader=TaskYamlLoader)
    for p in sorted(RECIPES.glob("*.yaml")):
        load_recipe(p)
    load_suite(SHIPPED / "default")


def _suite_copy(tmp_path: Path) -> Path:
    dst = tmp_path / "mine"
    shutil.copytree(SHIPPED / "default", dst)
    return dst


def test_a_suite_file_bomb_is_refused(tmp_path):
    suite = _suite_copy(tmp_path)
    (suite / "suite.yaml").write_text((suite / "suite.yaml").read_text() + bomb(9).replace("x", "y"))
    with pytest.raises(RecipeError, match="alias") as err:
        load_suite(suite)
    assert err.value.file == str(suite / "suite.yaml")


def test_a_task_yaml_bomb_and_one_it_includes_are_refused(tmp_path):
    suite = _suite_copy(tmp_path)
    code = suite / "code.yaml"
    original = code.read_text()
    code.write_text(original + bomb(9).replace("x", "ql_bomb_"))
    with pytest.raises(RecipeError, match="alias") as err:
        load_suite(suite)
    assert err.value.file == str(code)
    # an include lm-eval would read, outside the *.yaml files quantlab reads by themselves
    (suite / "base.yml").write_text(bomb(9))
    code.write_text(original + "include: base.yml\n")
    with pytest.raises(RecipeError, match="alias") as err:
        load_suite(suite)
    assert err.value.file == str(suite / "base.yml")


def test_a_suite_file_that_is_not_a_mapping_is_bad_input(tmp_path):
    suite = _suite_copy(tmp_path)
    (suite / "suite.yaml").write_text("- a\n- b\n")
    with pytest.raises(RecipeError, match="expected a YAML mapping"):
        load_suite(suite)


def test_the_budget_is_what_the_docs_say():
    text = (REPO / "docs" / "recipes.md").read_text()
    assert f"{MAX_FILE_BYTES >> 20} MiB" in text and f"{MAX_NODES:,} nodes" in text
    assert f"{safe_yaml.MAX_SCALAR_CHARS >> 20} MiB" in text and f"{MAX_DEPTH} levels" in text


def test_a_search_knob_value_is_read_by_the_same_loader():
    from quantlab.search.state import parse_knob

    assert parse_knob("quantization.group_size=128,null") == ("quantization.group_size", [128, None])
    with pytest.raises(ValueError, match="not a YAML value"):  # --knob's RecipeError (exit 2), not a crash
        parse_knob("quantization.group_size=[1")
    with pytest.raises(RecipeError, match="refers to a node that contains it"):
        parse_knob("quantization.targets=&a [*a]")
