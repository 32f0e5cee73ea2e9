"""Which parts of a model a recipe's quantization moves most: per-layer sensitivity,
measured in-process on the unquantized model (no server)."""
