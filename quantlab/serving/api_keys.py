"""The API key of each server quantlab talks to, by its base URL, for the clients to send.

Every server quantlab starts gets a random key for the run (`new_key`, passed to vLLM in
the child's VLLM_API_KEY, never in argv, so `ps` does not show it); a server the user
names (serve.mode endpoint, or a command) may have one the user gives through
serve.api_key_env. The server object registers its key while it runs (serving/vllm_server);
every client (the load generator, lm-eval's child, the KL and stability probes, the
serve-target sweeps) asks `headers(base_url)` rather than carrying the key through every
call. A key lives in this process's memory only: never logged, never recorded."""

from __future__ import annotations

import os
import secrets
import threading

from quantlab.core.errors import RecipeError
from quantlab.recipe.serve import ServeSpec

_keys: dict[str, list[str]] = {}  # base URL -> keys, the newest last (an endpoint attached to our own server)
_lock = threading.Lock()


def _normal(base_url: str) -> str:
    return base_url.rstrip("/")


def new_key() -> str:
    """A random key for one server of one run (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def register(base_url: str, key: str | None) -> None:
    if key:
        with _lock:
            _keys.setdefault(_normal(base_url), []).append(key)


def forget(base_url: str, key: str | None) -> None:
    """Drop one registration of this key (a later or an outer server on the same URL keeps its own)."""
    with _lock:
        held = _keys.get(_normal(base_url), [])
        if key in held:
            held.reverse()
            held.remove(key)
            held.reverse()
        if not held:
            _keys.pop(_normal(base_url), None)


def key_for(base_url: str) -> str | None:
    with _lock:
        held = _keys.get(_normal(base_url))
        return held[-1] if held else None


def headers(base_url: str) -> dict[str, str]:
    """The Authorization header for requests to this server (none where it has no key)."""
    key = key_for(base_url)
    return {"Authorization": f"Bearer {key}"} if key else {}


def user_key(spec: ServeSpec, role: str = "baseline") -> str | None:
    """The key of a server the user names (serve.api_key_env; the candidate endpoint's
    serve.candidate_api_key_env where set), read now, never recorded."""
    own = getattr(spec, "candidate_api_key_env", None) if role == "candidate" else None
    field = "serve.candidate_api_key_env" if own else "serve.api_key_env"
    name = own or spec.api_key_env
    if name is None:
        return None
    key = os.environ.get(name)
    if not key:
        raise RecipeError(f"{field} names {name}, which is not set in this environment: "
                          f"export it with the server's API key, or remove {field}", field=field)
    return key
