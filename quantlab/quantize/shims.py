"""Small, documented work-arounds for known issues in pinned engine versions.

Each shim names the upstream issue, checks the version it applies to, and is a
no-op elsewhere, so upgrading the library retires it rather than hiding changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
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


# llm-compressor versions whose CompressionLogger.set_results(self, name, loss) we wrap.
_GPTQ_LOSS_HOOK_VERSIONS = ("0.14.",)


@contextlib.contextmanager
def gptq_layer_losses(model) -> Iterator[dict[str, float] | None]:
    """Record each layer's GPTQ loss while oneshot runs.

    llm-compressor reports the loss through `CompressionLogger.set_results` and keeps
    no table of it, so we wrap that method for the duration. The wrapper is installed
    only on versions whose signature was checked (0.14); elsewhere it yields None and
    the losses are simply not recorded, rather than guessed."""
    if not version("llmcompressor").startswith(_GPTQ_LOSS_HOOK_VERSIONS):
        yield None
        return
    from llmcompressor.utils.metric_logging import CompressionLogger

    names = {id(m): n for n, m in model.named_modules()}
    losses: dict[str, float] = {}
    original = CompressionLogger.set_results

    def set_results(self, name=None, loss=None):
        if loss is not None:
            losses[names.get(id(self.module), "?")] = float(loss)
        return original(self, name=name, loss=loss)

    CompressionLogger.set_results = set_results
    try:
        yield losses
    finally:
        CompressionLogger.set_results = original
