"""What a served engine says about itself: /version, /v1/models, one greedy smoke
completion, and the facts only its log tells (kernels, KV cache, fallbacks)."""

from __future__ import annotations

import time

from quantlab.serving.engine_log import expected_but_missing, parse_engine_log
from quantlab.serving.vllm_server import VLLMServer
from quantlab.core.errors import EngineError, RecipeError
from quantlab.core.results import EngineFacts, SmokeCompletion
from quantlab.serving.plan import EngineTarget

SMOKE_PROMPT = "The capital of France is"


def resolve_served_name(server: VLLMServer, target: EngineTarget, models: list[dict]) -> str:
    """The model name to put in requests. A name quantlab chose must be served (for a server
    it started, the name that server was given: listed by the authenticated /v1/models, it
    also says the server answering is ours); an external server's own name is taken when it
    serves exactly one model."""
    ids = [m.get("id") for m in models]
    wanted = server.plan.served_name if server.plan is not None else target.served_name
    if wanted in ids:
        return wanted
    field = "serve.candidate_served_model_name" if target.role == "candidate" else "serve.served_model_name"
    if server.plan is not None and target.name_is_explicit:
        raise EngineError(f"the {target.role} server quantlab started serves {ids}, not '{wanted}' "
                          "as it was told to")
    if not target.name_is_explicit and len(ids) == 1:
        return ids[0]
    if not ids:
        raise EngineError(f"the {target.role} server at {server.base_url} lists no model at /v1/models")
    if target.name_is_explicit:
        raise RecipeError(f"the {target.role} server at {server.base_url} serves {ids}, not "
                          f"'{target.served_name}': set {field} to one of those", field=field)
    raise RecipeError(f"the {target.role} server at {server.base_url} serves several models {ids}: "
                      f"set {field} to the one to test", field=field)


def collect_facts(server: VLLMServer, target: EngineTarget, *, device: str) -> EngineFacts:
    t0 = time.monotonic()
    version = server.get_json("/version").get("version")
    models = server.get_json("/v1/models").get("data") or []
    server.served_name = resolve_served_name(server, target, models)
    served = next(m for m in models if m.get("id") == server.served_name)
    smoke = server.complete(SMOKE_PROMPT, max_tokens=8)
    log = parse_engine_log(server.log_text()) if server.plan is not None else None
    phases = (log or {}).get("startup_phases_s")
    if phases and server.ready_after_s:
        # process start to the first log line, and the last line to the first healthy /health
        phases["rest (process start, imports, first health check)"] = round(
            max(0.0, server.ready_after_s - sum(phases.values())), 1)
    qc = target.quant_config
    missing = expected_but_missing(
        log, quantized=qc is not None, kv_cache_quantized=bool(qc and qc.get("kv_cache_scheme")),
        device=device) if log is not None else ["no server log (external endpoint)"]
    return EngineFacts(
        base_url=server.base_url,
        served_model_name=server.served_name,
        model_dir=str(target.model_dir) if server.plan is not None and target.model_dir else None,
        vllm_version=version,
        max_model_len=served.get("max_model_len"),
        smoke_completion=SmokeCompletion(prompt=SMOKE_PROMPT, text=smoke["choices"][0]["text"],
                                         finish_reason=smoke["choices"][0].get("finish_reason")),
        log=log,
        log_missing=missing,
        startup_s=server.ready_after_s,
        facts_s=round(time.monotonic() - t0, 3),
    )
