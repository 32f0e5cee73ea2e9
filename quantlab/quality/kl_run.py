"""Next-token KL between the served baseline and candidate: the texts, each role's top-k
distributions (saved beside its samples), and their summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from quantlab.core.layout import KL_FILE  # noqa: F401 (also read from here)
from quantlab.core.stage_context import StageContext
from quantlab.core.errors import CheckError
from quantlab.quality.suites import Suite
from quantlab.core.fsutil import write_json_atomic
from quantlab.recipe.quality import QualitySpec
from quantlab.quality.stats import kl_summary, top_token, topk_kl




def _kl_texts(ctx: StageContext, suites: list[Suite]) -> Path | None:
    spec: QualitySpec = ctx.recipe.quality
    if not spec.kl.enabled:
        return None
    if spec.kl.texts:
        return ctx.loaded.resolve(spec.kl.texts)
    return next((s.kl_texts for s in suites if s.kl_texts), None)


def kl_dists(ctx: StageContext, role: str, texts: list[list[int]], out: Path) -> list:
    from quantlab.quality import kl

    spec: QualitySpec = ctx.recipe.quality
    server = ctx.engine(role)
    ctx.progress(f"quality {role}: next-token distributions on {len(texts)} texts (top {spec.kl.top_k})")
    dists = kl.distributions(server.base_url, server.served_name, texts, top_k=spec.kl.top_k,
                             timeout_s=spec.request_timeout_s)
    write_json_atomic(out / KL_FILE, kl.to_json(dists))
    return dists


def _kl(base: list, cand: list) -> dict[str, Any]:
    per_token, same = [], []
    if len(base) != len(cand) or any(len(b) != len(c) for b, c in zip(base, cand, strict=False)):
        raise CheckError("KL: the baseline and candidate distributions cover different positions (were the "
                         "cached baseline's texts cut at another length?)")
    for bt, ct in zip(base, cand, strict=True):
        for bp, cp in zip(bt, ct, strict=True):
            per_token.append(topk_kl(bp, cp))
            same.append(top_token(bp) == top_token(cp))
    return kl_summary(per_token, same)


def kl_prompt_ids(ctx: StageContext, suites: list[Suite], cand_tok: Path) -> list[list[int]] | None:
    """The KL texts as token ids (the candidate's tokenizer), or None when KL is off."""
    kl_path = _kl_texts(ctx, suites)
    if kl_path is None:
        return None
    from quantlab.models.tokenizer import load_tokenizer
    from quantlab.quality.kl import texts_as_token_ids

    spec: QualitySpec = ctx.recipe.quality
    tok = load_tokenizer(cand_tok, trust_remote_code=ctx.recipe.model.trust_remote_code)
    return texts_as_token_ids(kl_path, tok, max_texts=spec.kl.max_texts, max_tokens=spec.kl.max_tokens)


def kl_of_candidate(ctx: StageContext, kl_token_ids, base_dir: Path, cand_dir: Path) -> dict[str, Any] | None:
    if kl_token_ids is None:
        return None
    from quantlab.quality.kl import from_json

    cand_dists = kl_dists(ctx, "candidate", kl_token_ids, cand_dir)
    base_dists = from_json(json.loads((base_dir / KL_FILE).read_text()))
    result = _kl(base_dists, cand_dists)
    result["texts"] = len(kl_token_ids)
    return result
