"""Small, documented work-arounds for known issues in pinned engine versions.

Each shim names the upstream issue, checks the version it applies to, and is a
no-op elsewhere, so upgrading the library retires it rather than hiding changes.
"""

from __future__ import annotations

from importlib.metadata import version

_applied: set[str] = set()


def awq_pin_memory_without_accelerator() -> bool:
    """llm-compressor 0.14 pins AWQ's cached activations before its grid search
    (vllm-project/llm-compressor PR #2813). Pinning needs an accelerator, so on a
    CPU-only machine AWQ dies with "Cannot access accelerator device when none is
    available". Pinned memory only speeds host-to-device copies, which do not happen
    without an accelerator, so skipping it there changes no result.

    Returns True when the shim is active."""
    import torch
    from llmcompressor.pipelines.cache import IntermediatesCache

    if torch.accelerator.is_available() or not version("llmcompressor").startswith("0.14."):
        return False
    if "awq_pin_memory" in _applied:
        return True
    original = IntermediatesCache.pin_memory

    def pin_memory(self, batch_index, input_names=None):
        if torch.accelerator.is_available():
            return original(self, batch_index, input_names)
        return None

    pin_memory.__wrapped__ = original  # type: ignore[attr-defined]
    IntermediatesCache.pin_memory = pin_memory
    _applied.add("awq_pin_memory")
    return True
