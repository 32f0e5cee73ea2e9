"""Which key signs a run's statements (its registration, its release manifest), and the
arguments model-signing takes for the recipe's signing method."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from quantlab.core.layout import cache_dir
from quantlab.core.stage_context import StageContext

LOCAL_KEY = "keys/quantlab-local-signing.pem"


def signing_key(ctx: StageContext) -> tuple[Path, bool]:
    """The private key path and whether it is the local development key (created once)."""
    from quantlab.release.manifest import generate_keypair

    s = ctx.recipe.signing
    if s.private_key:
        return ctx.loaded.resolve(s.private_key), False
    key = cache_dir() / LOCAL_KEY
    if not key.is_file():
        generate_keypair(key, key.with_suffix(".pub.pem"))
        ctx.progress(f"created a local development signing key (public half: {key.with_suffix('.pub.pem')}); "
                     "set signing.private_key to sign with a key of your own")
    return key, True


def signing_args(ctx: StageContext) -> dict[str, Any]:
    """release.manifest.sign_folder's arguments but the method (never printed: a password may be in them)."""
    s = ctx.recipe.signing
    key = signing_key(ctx)[0] if s.method in ("key", "certificate") else None
    return {"private_key": key, "password": os.environ.get(s.password_env) if s.password_env else None,
            "signing_certificate": ctx.loaded.resolve(s.signing_certificate) if s.signing_certificate else None,
            "certificate_chain": [ctx.loaded.resolve(c) for c in s.certificate_chain],
            "use_staging": s.sigstore_staging,
            "identity_token": os.environ.get(s.identity_token_env) if s.identity_token_env else None}
