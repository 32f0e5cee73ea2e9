"""Names of the files and folders quantlab writes, in one place, and where its cache is."""

import os
from pathlib import Path

CHECKPOINT_DIR = "checkpoint"  # in a run folder
SERVE_LOG_DIR = "serve"  # in a run folder: <role>-server.log
ERROR_DIR = "errors"  # in a run folder: tracebacks of unexpected errors
LOG_DIR = "logs"  # in a run folder: what the engines print (llmcompressor.log)
QUANTIZE_RESULT_FILE = "quantize.json"  # in a checkpoint
RECIPE_COPY_FILE = "quantlab-recipe.yaml"  # in a checkpoint


def cache_dir() -> Path:
    """Where quantlab keeps built models, the probe and cached results. QUANTLAB_CACHE_DIR overrides it."""
    env = os.environ.get("QUANTLAB_CACHE_DIR")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "quantlab"
    return base.expanduser()
