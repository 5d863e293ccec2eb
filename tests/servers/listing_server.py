"""A modern Streamable HTTP MCP server (aiohttp) that counts the lists it is asked for, and
whose lists carry the cache hints it is made with (server/utilities/caching).

Served in-process by a test: `serve_http(Listing(hints).handle)` (tests/support/__init__.py).
It offers one tool, `echo` (its `text` back); `lists` counts the tools/list requests that
reached it.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

VERSION = "2026-07-28"
TOOLS = [
    {
        "name": "echo",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
    }
]


class Listing:
    def __init__(self, hints: dict[str, Any]) -> None:
        self.hints = hints
        self.lists = 0

    async def handle(self, request: web.Request) -> web.Response:
        if request.method != "POST":
            return web.Response(status=405)
        msg = orjson.loads(await request.read())
        if "id" not in msg:
            return web.Response(status=202)
        method = msg.get("method")
        result: dict[str, Any]
        if method == "server/discover":
            result = {
                "supportedVersions": [VERSION],
                "capabilities": {"tools": {}},
                "_meta": {
                    "io.modelcontextprotocol/serverInfo": {"name": "listing", "version": "1"}
                },
                **self.hints,
            }
        elif method == "tools/list":
            self.lists += 1
            result = {"tools": TOOLS, **self.hints}
        elif method == "tools/call":
            text = msg["params"].get("arguments", {}).get("text", "")
            result = {"content": [{"type": "text", "text": text}]}
        else:
            error = {"code": -32601, "message": f"Method not found: {method}"}
            return _reply(404, {"jsonrpc": "2.0", "id": msg["id"], "error": error})
        reply = {"jsonrpc": "2.0", "id": msg["id"], "result": {"resultType": "complete", **result}}
        return _reply(200, reply)


def _reply(status: int, body: dict[str, Any]) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")
