"""The table of methods and schemes (recipe/schemes.py) and the recipe schema name the same
rows, and every row is one its readers can read."""

from typing import get_args

from quantlab.recipe.quantize import Method, QuantizationSpec, Scheme
from quantlab.recipe.schemes import METHODS, MODIFIER_OPTIONS, SCHEMES
from quantlab.serving.kernel_bench import SCRIPT

QUANTIZERS = {"GPTQModifier", "QuantizationModifier"}  # the modifiers that quantize the weights


def test_every_scheme_the_schema_accepts_has_a_row_and_every_row_is_accepted():
    assert set(get_args(Scheme)) == set(SCHEMES)
    assert all(name == row.name for name, row in SCHEMES.items())


def test_every_method_the_schema_accepts_has_a_row_and_every_row_is_accepted():
    assert set(get_args(Method)) == set(METHODS)
    assert all(name == row.name for name, row in METHODS.items())


def test_every_scheme_is_made_by_some_method_and_every_method_makes_only_rows():
    made = set().union(*(m.schemes for m in METHODS.values()))
    assert made == set(SCHEMES)


def test_every_method_but_raw_ends_in_one_quantizer_after_its_transforms():
    for method in METHODS.values():
        if method.name == "raw":
            assert not method.modifiers and not method.schemes
            continue
        *transforms, last = method.modifiers
        assert last in QUANTIZERS and set(transforms) <= set(MODIFIER_OPTIONS) - QUANTIZERS, method


def test_a_row_is_readable_by_every_reader():
    for scheme in SCHEMES.values():
        assert scheme.weights.type in ("int", "float") and scheme.weights.strategy
        # a scheme given as explicit config groups states all it asks llm-compressor for
        if not scheme.preset:
            assert scheme.weights.type == "int"
            assert scheme.activations is None or scheme.activations.strategy is not None
        if scheme.group_size:  # the recipe's group size replaces the strategy without one
            assert scheme.weights.strategy == "channel" and scheme.activations is None
        if scheme.timed_as:  # the microbenchmark script builds that layer
            assert f'"{scheme.timed_as}"' in SCRIPT


# what the schema accepted before the table (recipe/quantize.py at adac628): literals, so the
# test holds the table to the old schema rather than to itself
OPTIONS_BEFORE_THE_TABLE = {"rtn": set(), "gptq": {"gptq"}, "awq": {"awq"}, "smoothquant+gptq": {"gptq", "smoothquant"},
                            "smoothquant+rtn": {"smoothquant"}, "fp8": set(), "raw": set()}


def test_the_schema_takes_each_methods_options_and_refuses_the_rest():
    assert set(OPTIONS_BEFORE_THE_TABLE) == set(METHODS)
    for method in METHODS.values():
        for scheme in sorted(method.schemes):
            for option in MODIFIER_OPTIONS.values():
                try:
                    QuantizationSpec(method=method.name, scheme=scheme, **{option: {}})
                    took = True
                except ValueError:
                    took = False
                assert took == (option in OPTIONS_BEFORE_THE_TABLE[method.name]), (method.name, scheme, option)
