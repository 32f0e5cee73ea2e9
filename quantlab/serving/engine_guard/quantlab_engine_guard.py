"""ASGI middleware that vLLM's api_server loads for every server quantlab launches
(`--middleware quantlab_engine_guard.Guard`, this folder on the child's PYTHONPATH): every
request but /health needs `Authorization: Bearer <VLLM_API_KEY>`.

vLLM's own --api-key / VLLM_API_KEY guards only the /v1, /v2, /inference and /cohere
paths; /invocations (SageMaker's route to the same completions), /tokenize, /pooling and
the rest answer anyone (vLLM 0.32's cli_args says so). This closes them all. Standard
library only: it runs in the serving environment, which has no quantlab installed. No key
in the environment: every guarded request is refused (closed, not open)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os

KEY_VARIABLE = "VLLM_API_KEY"
OPEN_PATHS = frozenset({"/health"})


class Guard:
    def __init__(self, app):
        self.app = app
        key = os.environ.get(KEY_VARIABLE, "")
        self._digest = hashlib.sha256(key.encode()).digest() if key else None

    def authorized(self, headers) -> bool:
        if self._digest is None:
            return False
        for name, value in headers or []:
            if name.lower() == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                given = hashlib.sha256(token.strip().encode()).digest()
                return scheme.lower() == "bearer" and hmac.compare_digest(given, self._digest)
        return False

    async def __call__(self, scope, receive, send):
        kind = scope.get("type")
        if kind not in ("http", "websocket"):
            return await self.app(scope, receive, send)  # lifespan: start-up and shut-down
        path = scope.get("path", "").removeprefix(scope.get("root_path", "")) or "/"
        if path in OPEN_PATHS or self.authorized(scope.get("headers")):
            return await self.app(scope, receive, send)
        if kind == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        body = json.dumps({"error": "Unauthorized"}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})
