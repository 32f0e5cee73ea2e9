"""Which parts of a model a recipe's quantization moves most, and what to try next:
per-layer sensitivity measured in-process on the unquantized model (no server), its
ranking, the prompts it is measured on, and the search's state (knobs, trials)."""
