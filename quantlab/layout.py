"""Names of the files and folders quantlab writes, in one place (no imports)."""

CHECKPOINT_DIR = "checkpoint"  # in a run folder
SERVE_LOG_DIR = "serve"  # in a run folder: <role>-server.log
ERROR_DIR = "errors"  # in a run folder: tracebacks of unexpected errors
LOG_DIR = "logs"  # in a run folder: what the engines print (llmcompressor.log)
QUANTIZE_RESULT_FILE = "quantize.json"  # in a checkpoint
RECIPE_COPY_FILE = "quantlab-recipe.yaml"  # in a checkpoint
