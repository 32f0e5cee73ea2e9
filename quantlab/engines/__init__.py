"""Adapters to the engines quantlab drives: llm-compressor in-process, vLLM as a
subprocess over HTTP. Stages call these; nothing outside `stages/` and the pipeline
helpers imports them, and each imports its heavy libraries lazily."""
