"""quantlab: recipe-driven quantization and pre-release validation for LLMs."""

__version__ = "0.1.0"
