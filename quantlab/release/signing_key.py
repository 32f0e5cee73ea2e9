"""Which key signs a run's statements (its registration, its release manifest), and the
arguments model-signing takes for the recipe's signing method.

A private key is used only when this user owns it and nobody else can read or write it:
a key in a shared folder may have been planted by another user, who would then know every
signature quantlab makes with it. The local development key lives in quantlab's per-user
config folder (core/layout.config_dir, never the cache folder, which several users may
share), is created once, mode 0600, in a folder only its owner can enter, and appears
whole or not at all (written beside, then linked into place)."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from quantlab.core.errors import RecipeError
from quantlab.core.fsutil import private_flaw
from quantlab.core.layout import config_dir
from quantlab.core.stage_context import StageContext

LOCAL_KEY = "keys/quantlab-local-signing.pem"  # in config_dir()


def local_key_path() -> Path:
    """The local development key's private half (its public half: with .pub.pem)."""
    return config_dir() / LOCAL_KEY


def local_public_key() -> Path:
    return local_key_path().with_suffix(".pub.pem")


def signing_key(ctx: StageContext) -> tuple[Path, bool]:
    """The private key path and whether it is the local development key (created once),
    after checking that only this user can read it."""
    s = ctx.recipe.signing
    if s.private_key:
        key = ctx.loaded.resolve(s.private_key)
        check_private_key_file(key, file=str(ctx.loaded.path), field="signing.private_key")
        return key, False
    key = local_key_path()
    if not (key.exists() or key.is_symlink()):
        try:
            created = _create_local_key(key)
        except OSError as err:  # a keys folder another user made, a read-only config folder
            raise RecipeError(f"cannot create the local development key in {key.parent}: {err.strerror or err}. Make "
                              f"that a folder yours alone (mode 0700), set XDG_CONFIG_HOME to a folder of your own, or "
                              f"set signing.private_key to a key of your own (`quantlab keygen`)",
                              file=str(ctx.loaded.path), field="signing.private_key") from None
        if created:
            ctx.progress(f"created a local development signing key (public half: {key.with_suffix('.pub.pem')}); "
                         "set signing.private_key to sign with a key of your own")
    check_private_key_file(key, file=str(ctx.loaded.path), field="signing.private_key", local=True)
    return key, True


def check_private_key_file(key: Path, *, file: str | None = None, field: str | None = None,
                           local: bool = False) -> None:
    """Refuse (RecipeError, exit 2) a private key this user does not own, that others may
    read or write, or (the local key) that is a link or not a plain file."""
    where = "the local development key" if local else "the signing key"
    try:
        st = os.lstat(key) if local else os.stat(key)
    except FileNotFoundError:
        raise RecipeError(f"{where} {key} does not exist; create one with `quantlab keygen {key}`", file=file,
                          field=field) from None
    except OSError as err:
        raise RecipeError(f"cannot read {where} {key}: {err.strerror}", file=file, field=field) from None
    flaw = private_flaw(st)
    if flaw in ("link", "special"):
        kind = "a symbolic link" if flaw == "link" else "not a plain file"
        raise RecipeError(f"{where} {key} is {kind}; quantlab signs only with a plain key file it can vouch for: "
                          f"remove it (quantlab creates a new local key) or set signing.private_key to your own key",
                          file=file, field=field)
    if flaw == "owner":
        fix = ("remove it, or set XDG_CONFIG_HOME to a folder of your own" if local else
               "make one with `quantlab keygen`")
        raise RecipeError(f"{where} {key} belongs to user id {st.st_uid}, not to you ({os.getuid()}): a key someone "
                          f"else made (in a shared cache folder, for one) may be known to them. Use a key of your own: "
                          f"{fix}", file=file, field=field)
    if flaw == "mode":
        raise RecipeError(f"{where} {key} has mode {stat.S_IMODE(st.st_mode):04o}: others can read or write it, so "
                          f"it may be known or replaced. Make it yours alone: chmod 600 {key}", file=file,
                          field=field)


def _create_local_key(key: Path) -> bool:
    """The local development key written beside its place and linked in: a concurrent run
    that made one first keeps its own (False: this one was not needed)."""
    from quantlab.release.manifest import generate_keypair

    key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = Path(tempfile.mkdtemp(prefix=".new-key-", dir=key.parent))
    try:
        generate_keypair(tmp / key.name, tmp / key.with_suffix(".pub.pem").name)  # private half 0600 (O_EXCL)
        try:
            os.link(tmp / key.name, key)  # never replaces: whoever links first made the key
        except FileExistsError:
            return False
        os.replace(tmp / key.with_suffix(".pub.pem").name, key.with_suffix(".pub.pem"))
        return True
    finally:
        for p in tmp.iterdir():
            p.unlink()
        tmp.rmdir()


def signing_args(ctx: StageContext) -> dict[str, Any]:
    """release.manifest.sign_folder's arguments but the method (never printed: a password may be in them)."""
    s = ctx.recipe.signing
    key = signing_key(ctx)[0] if s.method in ("key", "certificate") else None
    return {"private_key": key, "password": os.environ.get(s.password_env) if s.password_env else None,
            "signing_certificate": ctx.loaded.resolve(s.signing_certificate) if s.signing_certificate else None,
            "certificate_chain": [ctx.loaded.resolve(c) for c in s.certificate_chain],
            "use_staging": s.sigstore_staging,
            "identity_token": os.environ.get(s.identity_token_env) if s.identity_token_env else None}
