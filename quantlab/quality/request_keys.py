"""One key per lm-eval request, the same on both sides of the wire: the lm-eval child puts
the keys of each request it sends in the payload (PAYLOAD_FIELD) and writes the keys of
each sample's requests beside its answer, so a proxy that times the requests (the load
shaper) can join each timing to the scored document. Pure: no lm-eval import.

The key is the sha256 of a canonical JSON of lm-eval's own cache key of the request
(lm-eval 0.4's TemplateAPI): loglikelihood `(context, continuation)`, generate_until
`(context, gen_kwargs)`. A sample's `arguments` hold the same values (`req.args`), but a
chat context, lm-eval's `JsonChatStr` NamedTuple when sent, is a plain 1-tuple `(prompt,)`
in the logged sample: every tuple is canonically a list, so both key alike. Perplexity
windows (loglikelihood_rolling) have no cache key: no key.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

PAYLOAD_FIELD = "quantlab_request_keys"  # the body field the child adds and the shaper strips


def canonical(value: Any) -> Any:
    """Plain JSON values: any tuple (a NamedTuple too) as a list, mapping keys as strings."""
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if isinstance(value, dict):
        return {str(k): canonical(v) for k, v in value.items()}
    return value


def key_of(cache_key: Any) -> str:
    """sha256 hex of one request's lm-eval cache key, canonically serialised."""
    text = json.dumps(canonical(cache_key), sort_keys=True, default=str, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def keys_of_arguments(arguments: list[Any] | None) -> list[str]:
    """The keys of one logged sample's requests (its `arguments`, one tuple a request), in
    order: a two-part request (loglikelihood, generate_until) is its own cache key; a
    one-part one (loglikelihood_rolling's text) is sent as windows without a key, and a
    multimodal one's key is rebuilt by lm-eval with its images: neither has a key here."""
    return [key_of(tuple(args)) for args in arguments or [] if isinstance(args, (list, tuple)) and len(args) == 2]
