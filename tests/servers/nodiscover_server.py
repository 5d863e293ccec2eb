"""A modern Streamable HTTP MCP server (aiohttp) that does not implement `server/discover`.

Served in-process by a test: `serve_http(handler(seen))` (tests/support/__init__.py).

It validates as a modern server does (streamable-http, Server Validation): a request without
MCP-Protocol-Version, a legacy `initialize` included, gets 400 with HeaderMismatch (-32020).
`server/discover` is "method not found" (404, -32601); `tools/list` offers one tool `t`, and
`tools/call` answers "modern". Every request's method and MCP-Protocol-Version header go into
the `seen` list the handler was made with.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

VERSION = "2026-07-28"


def _reply(status: int, body: dict[str, Any]) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def handler(seen: list[tuple[str, str | None]]) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
        if request.method != "POST":
            return web.Response(status=405)
        msg = orjson.loads(await request.read())
        version = request.headers.get("MCP-Protocol-Version")
        seen.append((str(msg.get("method")), version))
        if "id" not in msg:
            return web.Response(status=202)
        if version is None:
            error = {"code": -32020, "message": "Missing MCP-Protocol-Version header"}
            return _reply(400, {"jsonrpc": "2.0", "id": msg["id"], "error": error})
        method = msg.get("method")
        if method == "tools/list":
            tools = [{"name": "t", "inputSchema": {"type": "object"}}]
            result: dict[str, Any] = {"resultType": "complete", "tools": tools}
        elif method == "tools/call":
            result = {"resultType": "complete", "content": [{"type": "text", "text": "modern"}]}
        else:
            error = {"code": -32601, "message": f"Method not found: {method}"}
            return _reply(404, {"jsonrpc": "2.0", "id": msg["id"], "error": error})
        return _reply(200, {"jsonrpc": "2.0", "id": msg["id"], "result": result})

    return handle
