"""Secrets kept out of every record: the serve section's environment values, secret-looking
engine arguments (by name or by value), credentials in URLs and launch commands.

A value is replaced by `sha256:<hex>` of itself, so two records can still be compared
(the same token gives the same digest) without revealing it; a URL keeps its host and
loses its user and password. Names are kept: a record says *that* HF_TOKEN was set, not
to what. The recipe hash and cache keys may digest the real values (a digest reveals
nothing); what is written (run.json's recipe copy, the manifest, the released recipe
copy, cache entries' parts, reports) goes through here first.

A short password's digest can be guessed by trying candidates: give the engine a secret
through serve.env's variables or a file it reads, not as an engine argument.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

REDACTED = "<redacted>"
PREFIX = "sha256:"

# name words that mark a secret (the words of a name split at _ - . and spaces)
SECRET_WORDS = {"key", "apikey", "token", "secret", "secrets", "password", "passwd", "pwd", "passphrase",
                "credential", "credentials", "auth", "authorization", "bearer", "cookie"}
# a word ending so is one too (hftoken, privatekey); "tokens", "tokenizer" and "keys" are not
SECRET_SUFFIXES = ("token", "key", "secret", "password", "passwd", "credential", "credentials")
SECRET_INFIXES = ("secret", "passw", "credential", "apikey", "api_key")

# values that are credentials whatever they are called
SECRET_VALUE = re.compile(
    r"(?i:\bbearer\s+[A-Za-z0-9._~+/=-]{8,})"  # an Authorization header's value
    r"|[A-Za-z][A-Za-z0-9+.-]*://[^/@\s:]*:[^/@\s]+@"  # a URL with user:password@
    r"|\bhf_[A-Za-z0-9]{20,}"  # Hugging Face
    r"|\bsk-[A-Za-z0-9_-]{20,}"  # OpenAI-style
    r"|\b(?:gh[pousr]_|github_pat_)[A-Za-z0-9_]{20,}"  # GitHub
    r"|\bglpat-[A-Za-z0-9_-]{20,}"  # GitLab
    r"|\bxox[abprs]-[A-Za-z0-9-]{10,}"  # Slack
    r"|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"  # AWS access key id
    r"|\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]+"  # a JWT
)
_WORDS = re.compile(r"[^A-Za-z0-9]+")
_URL_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]*@")


def digest(value: Any) -> str:
    """`sha256:<hex>` of the value's text."""
    return PREFIX + hashlib.sha256(str(value).encode()).hexdigest()


def is_redacted(value: Any) -> bool:
    return isinstance(value, str) and (value == REDACTED or value.startswith(PREFIX) and len(value) == 71)


def secret_name(name: str) -> bool:
    """A name that says it holds a secret: api_key, hf_token, AWS_SECRET_ACCESS_KEY,
    db_password (not max_num_batched_tokens, tokenizer, kv_cache_dtype)."""
    lowered = str(name).lower()
    if any(part in lowered for part in SECRET_INFIXES):
        return True
    words = [w for w in _WORDS.split(lowered) if w]
    return any(w in SECRET_WORDS or w.endswith(SECRET_SUFFIXES) for w in words)


def secret_value(value: Any) -> bool:
    """A value that is a credential whatever its name: a bearer token, a URL with a
    password, a well-known token format, or a JSON object with a secret-named key."""
    if not isinstance(value, str) or is_redacted(value):
        return False
    if SECRET_VALUE.search(value):
        return True
    text = value.strip()
    if text.startswith("{"):
        try:
            return _json_has_secret(json.loads(text))
        except ValueError:
            return False
    return False


def _json_has_secret(data: Any) -> bool:
    if isinstance(data, dict):
        return any((secret_name(k) and v not in (None, "", False)) or _json_has_secret(v) for k, v in data.items())
    if isinstance(data, list):
        return any(_json_has_secret(v) for v in data)
    return secret_value(data)


def value(v: Any) -> Any:
    """The value as a record keeps it: its digest, unless it is none, a flag or already redacted."""
    if v is None or isinstance(v, bool) or is_redacted(v):
        return v
    return digest(v)


def engine_args(args: dict[str, Any] | None) -> dict[str, Any] | None:
    """Engine arguments with secret-named or secret-looking values replaced (the rest kept:
    max_model_len, dtype, ... are what a record is for)."""
    if args is None:
        return None
    return {k: value(v) if secret_name(k) or secret_value(v) else v for k, v in args.items()}


def env(variables: dict[str, Any] | None) -> dict[str, Any] | None:
    """An environment for a server: every value replaced (names kept)."""
    if variables is None:
        return None
    return {k: value(v) for k, v in variables.items()}


def url(text: str | None) -> str | None:
    """A URL without its user and password (the host and path kept)."""
    if not isinstance(text, str) or not _URL_USERINFO.match(text):
        return text
    return _URL_USERINFO.sub(lambda m: f"{m.group(1)}{REDACTED}@", text)


def command(argv: list[str] | None) -> list[str] | None:
    """A launch command (serve.command): NAME=value items with a secret name, the item after
    a secret-named flag (--api-key X, --hf-token X) and secret-looking items redacted."""
    if argv is None:
        return None
    out: list[str] = []
    after_secret_flag = False
    for item in argv:
        text = str(item)
        name, sep, rest = text.partition("=")
        if after_secret_flag and not text.startswith("-"):
            out.append(value(text))
        elif sep and secret_name(name.lstrip("-")) and rest:
            out.append(f"{name}={value(rest)}")
        elif secret_value(text):
            out.append(_cleaned(text))
        else:
            out.append(text)
        after_secret_flag = text.startswith("-") and not sep and secret_name(text.lstrip("-"))
    return out


def serve_section(data: dict[str, Any] | None) -> dict[str, Any] | None:
    """A serve section (or one of serve.targets) as a record keeps it."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    if isinstance(out.get("env"), dict):
        out["env"] = env(out["env"])
    if isinstance(out.get("engine_args"), dict):
        out["engine_args"] = engine_args(out["engine_args"])
    if isinstance(out.get("command"), list):
        out["command"] = command(out["command"])
    for key in ("endpoint", "candidate_endpoint"):
        if isinstance(out.get(key), str):
            out[key] = url(out[key])
    if isinstance(out.get("targets"), list):
        out["targets"] = [serve_section(t) for t in out["targets"]]
    return out


def strings(data: Any) -> Any:
    """Every string in nested data that is a credential by its look (tokens, URLs with a
    password) replaced; a URL keeps its host."""
    if isinstance(data, dict):
        return {k: strings(v) for k, v in data.items()}
    if isinstance(data, list):
        return [strings(v) for v in data]
    if isinstance(data, str) and secret_value(data):
        return _cleaned(data)
    return data


def _cleaned(text: str) -> str:
    """A secret-looking string: a URL whose only secret was its password keeps the rest, else its digest."""
    cleaned = url(text)
    return cleaned if cleaned != text and not secret_value(cleaned) else value(text)


def recipe(data: dict[str, Any]) -> dict[str, Any]:
    """A recipe (its model_dump) as a record keeps it: the serve section's secrets, and any
    credential-looking string anywhere."""
    out = dict(data)
    if isinstance(out.get("serve"), dict):
        out["serve"] = serve_section(out["serve"])
    return strings(out)


def scrub_text(text: str, secrets: list[str]) -> str:
    """A text (a log) with each of these secret values replaced by its digest."""
    for secret in sorted({s for s in secrets if isinstance(s, str) and len(s) >= 4}, key=len, reverse=True):
        text = text.replace(secret, digest(secret))
    return text
