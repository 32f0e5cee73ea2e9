"""What each reader of a recipe's scheme makes of it, pinned: the recipe schema's verdict,
the modifiers llm-compressor is asked for (quantize/modifier_plan.py), the
`quantization_config` the serve preflight predicts (serving/compat.predict_quant_config),
the bits a weight takes (search/schemes.weight_bits), the kernel the microbenchmark times
(serving/kernel_bench.scheme_kind) and whether calibration is read, for every method x
scheme x group size x symmetry x KV cache x options.

scheme_outputs.json was written once by `outputs()` (and `sensitivity_proxy()`) from the code as it stood before the
table of schemes (recipe/schemes.py), so the table changes none of them. A deliberate
change to what a scheme exports rewrites the file and says so in its commit."""

from __future__ import annotations

import json
from itertools import product
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from quantlab.quantize.modifier_plan import plan_modifiers, scheme_kwargs, weight_args
from quantlab.recipe.quantize import QuantizationSpec
from quantlab.search.schemes import weight_bits
from quantlab.serving.compat import predict_quant_config
from quantlab.serving.kernel_bench import scheme_kind

PINNED = Path(__file__).with_name("scheme_outputs.json")
METHODS = ("rtn", "gptq", "awq", "smoothquant+gptq", "smoothquant+rtn", "fp8")
SCHEMES = ("W4A16", "W8A16", "W8A8", "FP8", "FP8_DYNAMIC", "FP8_BLOCK")
OPTIONS = {"gptq": {"block_size": 64, "dampening_frac": 0.05, "actorder": None},
           "awq": {"duo_scaling": "both", "n_grid": 10},
           "smoothquant": {"smoothing_strength": 0.5}}
IN_FEATURES = (1, 96, 4096)
RAW = {"method": "raw", "raw_recipe": {"quant_stage": {"quant_modifiers": {}}}}


def combinations() -> list[dict[str, Any]]:
    """Every method x scheme x group size x symmetry; those the schema accepts also with a
    KV cache and with the method's options."""
    out = []
    for method, scheme, group_size, symmetric in product(METHODS, SCHEMES, (None, 32, 128), (True, False)):
        base: dict[str, Any] = {"method": method, "scheme": scheme, "group_size": group_size, "symmetric": symmetric}
        out.append(base)
        if "refused" in what_readers_make(base):
            continue
        options = {k: v for k, v in OPTIONS.items() if k in method}  # only the options the method runs
        out += [{**base, **extra} for extra in ({"kv_cache": {"dtype": "fp8"}}, options,
                                                {"kv_cache": {"dtype": "fp8"}, **options}) if extra]
    return out + [RAW]


def what_readers_make(spec: dict[str, Any]) -> dict[str, Any]:
    try:
        q = QuantizationSpec(**spec)
    except ValidationError as e:
        return {"refused": [err["msg"] for err in e.errors()]}
    out: dict[str, Any] = {"needs_calibration": q.needs_calibration,
                           "predict_quant_config": predict_quant_config(q),
                           "scheme_kind": scheme_kind(q),
                           "weight_bits": [weight_bits(q, n) for n in IN_FEATURES]}
    if q.method == "raw":
        return out
    out["scheme_kwargs"] = scheme_kwargs(q)
    out["plan_modifiers"] = [list(step) for step in plan_modifiers(q)]
    if "config_groups" in out["scheme_kwargs"]:  # weight_args is read for explicit config groups only
        out["weight_args"] = weight_args(q)
    return out


def key(spec: dict[str, Any]) -> str:
    return json.dumps(spec, sort_keys=True, separators=(",", ":"))


def outputs() -> dict[str, Any]:
    return {key(spec): what_readers_make(spec) for spec in combinations()}


def sensitivity_proxy(spec: dict[str, Any]) -> dict[str, Any]:
    from quantlab.search.measure import _scheme_args

    weights, acts = _scheme_args(QuantizationSpec(**spec))
    return {"weights": weights.model_dump(mode="json"), "acts": acts.model_dump(mode="json") if acts else None}


def test_every_reader_makes_of_every_scheme_what_it_made_before_the_table():
    pinned = json.loads(PINNED.read_text())
    for made in pinned.values():  # held by the next test, where compressed-tensors is installed
        made.pop("sensitivity_proxy", None)
    now = json.loads(json.dumps(outputs()))  # tuples as lists, as the file holds them
    assert now.keys() == pinned.keys()
    # compared as text: the keys' order too, as a record written from these dicts shows it
    differ = [key for key in pinned if json.dumps(now[key]) != json.dumps(pinned[key])]
    assert not differ, f"{len(differ)} differ, the first: {differ[0]}\nnow {now[differ[0]]}\npinned {pinned[differ[0]]}"


def test_the_pins_cover_every_scheme_and_method_the_schema_accepts():
    pinned = json.loads(PINNED.read_text())
    accepted = {(json.loads(k)["method"], json.loads(k).get("scheme")) for k, v in pinned.items() if "refused" not in v}
    assert {s for _, s in accepted} == set(SCHEMES) | {None}
    assert {m for m, _ in accepted} == set(METHODS) | {"raw"}


def test_the_sensitivity_proxy_quantizes_each_scheme_as_before():
    """search/measure._scheme_args: the compressed-tensors arguments the round-to-nearest proxy uses."""
    pytest.importorskip("compressed_tensors")
    pinned = json.loads(PINNED.read_text())
    held = {key: made["sensitivity_proxy"] for key, made in pinned.items() if "sensitivity_proxy" in made}
    assert len(held) == sum("plan_modifiers" in made for made in pinned.values())
    assert {key: sensitivity_proxy(json.loads(key)) for key in held} == held
