"""Running the stability probes against a served engine, shared by the stability stage
and the serve targets' stage: the prompts they send, the tokenizer that cuts them, and
one probe run with its server's death check."""

from __future__ import annotations

import json
from pathlib import Path

from quantlab.core.errors import CheckError, EngineError
from quantlab.core.stage_context import StageContext
from quantlab.core.shipped import EVAL_SUITES as SHIPPED

PROMPT_TEXTS = SHIPPED / "default" / "data" / "kl_text.jsonl"  # held-out prose, cut to short prompts
PROMPT_TOKENS = 48


def tokenizer_dir(ctx: StageContext) -> Path:
    return ctx.checkpoint_dir if (ctx.checkpoint_dir / "tokenizer_config.json").is_file() \
        else ctx.baseline_model().path


def probe_prompts(tokenizer, n: int) -> tuple[list[list[int]], list[int]]:
    rows = [json.loads(x)["text"] for x in PROMPT_TEXTS.read_text().splitlines() if x.strip()]
    ids = [tokenizer(t).input_ids for t in rows]
    prompts = [x[:PROMPT_TOKENS] for x in ids]
    pool = [t for x in ids for t in x]
    return (prompts * (n // len(prompts) + 1))[:n], pool


def run_probe(ctx: StageContext, role: str, server, name: str, fn, *args, bar=None, **kwargs):
    """Run one probe; a server that died meanwhile fails the stage naming the probe. `bar`:
    the step it belongs to (advanced when the probe is done)."""
    if bar is not None:
        bar.detail(f"stability {role}: {name}")
    else:
        ctx.progress(f"stability {role}: {name}")
    try:
        result = fn(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - re-raised with what was running
        server.ensure_alive(f"during the stability probe '{name}'")
        raise CheckError(f"stability probe '{name}' on the {role} failed: {type(err).__name__}: {err}") from err
    try:
        server.ensure_alive(f"during the stability probe '{name}'")
    except EngineError as err:
        raise EngineError(f"stability probe '{name}' on the {role}: {err}") from None
    if bar is not None:
        bar.advance()
    return result
