"""Pipeline stages. Only this package touches torch, llm-compressor, lm-eval or a
server, and it imports them inside functions so the CLI starts instantly."""
