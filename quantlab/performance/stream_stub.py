"""A trivial OpenAI-style streaming server, only for measuring the load generator's own
limits (its ceiling in requests per second and the latency it adds) and its handling of
a server that dies mid-run. It answers instantly, one chunk per requested token.

    python -m quantlab.performance.stream_stub --port 8123 [--die-after N]
"""

from __future__ import annotations

import argparse
import json
import os

STUB_MODEL = "stub"


def make_app(die_after: int | None = None):
    from aiohttp import web

    served = 0

    async def health(request):
        return web.Response(text="ok")

    async def models(request):
        return web.json_response({"data": [{"id": STUB_MODEL, "max_model_len": 1 << 20}]})

    async def complete(request):
        nonlocal served
        body = await request.json()
        served += 1
        if die_after is not None and served > die_after:
            os._exit(1)  # a crash: the connection drops without an answer
        n = int(body.get("max_tokens") or 16)
        chat = request.path.endswith("/chat/completions")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(n):
            choice = {"index": 0, "delta": {"content": "x"}} if chat else {"index": 0, "text": "x"}
            await resp.write(b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n")
        prompt = body.get("prompt")
        usage = {"prompt_tokens": len(prompt) if isinstance(prompt, list) else 1, "completion_tokens": n}
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.add_routes([web.get("/health", health), web.get("/v1/models", models),
                    web.post("/v1/completions", complete), web.post("/v1/chat/completions", complete)])
    return app


def main() -> None:
    from aiohttp import web

    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--die-after", type=int, default=None)
    args = ap.parse_args()
    web.run_app(make_app(args.die_after), host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
