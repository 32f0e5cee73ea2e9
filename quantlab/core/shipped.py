"""The data quantlab ships inside its package (quantlab/shipped/): the recipes, the
calibration sets and the eval suites, found through importlib.resources so that a
wheel installed anywhere finds them as an editable checkout does (the repository's
top-level recipes/, calib_data/ and eval_suites/ are links to these folders)."""

from __future__ import annotations

import os
from importlib.resources import files
from pathlib import Path

from quantlab.core.layout import cache_dir

SHIPPED = Path(str(files("quantlab").joinpath("shipped")))
RECIPES = SHIPPED / "recipes"
CALIB_DATA = SHIPPED / "calib_data"
EVAL_SUITES = SHIPPED / "eval_suites"
SCHEMAS = SHIPPED / "schemas"  # JSON Schemas of what others read without quantlab (the attestation's predicate)


def built_suites_dir() -> Path:
    """Where suites whose data is built on this machine (the standard suite, from wheels on
    the package index) keep it: the user cache, never the package. QUANTLAB_SUITES_DIR
    overrides it."""
    env = os.environ.get("QUANTLAB_SUITES_DIR")
    return Path(env).expanduser() if env else cache_dir() / "suites"
