"""quantlab: recipe-driven quantization and pre-release validation for LLMs."""

from quantlab.core.version import __version__

__all__ = ["__version__"]
