"""Pipeline stages, one module each, all following one contract:

    NAME: str
    inputs(ctx) -> dict          what the stage depends on; hashed, so a resumed run
                                 redoes a stage exactly when its inputs changed
    preflight(ctx) -> None       cheap checks before any stage of the run starts
                                 (raises RecipeError); no weights loaded, no server
    run(ctx) -> <Stage>Result    the work; returns a typed result (quantlab.results)

`ctx` is a quantlab.context.RunContext. A stage records artifacts with
ctx.add_artifact; the pipeline writes the run record. Engines (llm-compressor, vLLM,
lm-eval) are reached only through quantlab.engines, imported inside functions so the
CLI starts instantly.
"""
