"""A raw modern MCP backend (2026-07-28) that writes its JSON by hand, for exactness tests.

Usage:
    python tests/servers/exact_server.py stdio [--legacy]
    python tests/servers/exact_server.py http --port N [--legacy]   (prints `READY <port>`)
    python tests/servers/exact_server.py sse --port N     (the 2024-11-05 HTTP+SSE transport)

`--legacy` makes it a server of the 2025-11-25 era: `initialize` instead of `server/discover`.

Tools:
- `raw`: answers with the very text of the request it received (a text block), the numbers of
  NUMBERS verbatim in `structuredContent`, and first a progress notification whose `progress`
  is NUMBERS' first number (when the request carries a progress token).
- `deep`: answers with a result holding a list nested `arguments.depth` levels.
- `lone`: answers with the text of the `arguments` it received (a text block; not the whole
  request, whose id would then appear twice and the reply could not be kept as its bytes), and
  LONE (strings with lone surrogate escapes, which JSON allows and orjson refuses) as its
  `structuredContent`; its description in `tools/list` holds one too, and its argument `s` is
  mirrored into `Mcp-Param-S`.
No SDK and no JSON library writes these replies: a parser would round the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from typing import Any

import orjson
from aiohttp import web

# Numbers a double or a 64-bit integer cannot hold, and zeros and exponents orjson changes.
NUMBERS = (
    b'{"big":123456789012345678901234567890,"neg":-123456789012345678901234567890,'
    b'"list":[98765432109876543210987654321,[-0,-0.0,1e400,1E-400]],'
    b'"decimals":{"a":0.1000000000000000055511151231257827,"pi":3.141592653589793238462643383279}}'
)
FIRST = b"123456789012345678901234567890"
# Lone surrogates (high, low, one in a member name) beside a proper pair and plain text.
LONE = (
    b'{"high":"\\ud800","low":"a\\udfffb","pair":"\\ud83d\\ude00",'
    b'"\\udc00key":[1,"\\udbff"],"plain":"caf\xc3\xa9"}'
)
LONE_DESCRIPTION = b'"odd \\udc80 text"'
_EXPONENT = re.compile(rb"(?<=[0-9])[eE][+-]?[0-9]+")
# A surrogate's escape: orjson refuses a lone one (only routing fields are read here).
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
DISCOVER = {
    "resultType": "complete",
    "supportedVersions": ["2026-07-28"],
    "capabilities": {"tools": {}},
    "serverInfo": {"name": "exact", "version": "1"},
}
TOOLS = {
    "tools": [
        {"name": "raw", "inputSchema": {"type": "object"}},
        {"name": "deep", "inputSchema": {"type": "object"}},
        {
            "name": "lone",
            "description": "LONE",
            "inputSchema": {
                "type": "object",
                "properties": {"s": {"type": "string", "x-mcp-header": "S"}},
            },
        },
    ]
}


# Set once from the command line: which era this server speaks.
ERA = {"legacy": False}
INITIALIZE = {
    "protocolVersion": "2025-11-25",
    "capabilities": {"tools": {}},
    "serverInfo": {"name": "exact", "version": "1"},
}


def replies(line: bytes) -> list[bytes]:
    """The lines answering one received message (none for a notification)."""
    # Only routing fields are read here; orjson refuses a number past a double's range, so
    # exponents are cut first (the reply quotes `line` itself).
    msg: dict[str, Any] = orjson.loads(_SURROGATE.sub(b"?", _EXPONENT.sub(b"", line)))
    if "id" not in msg or "method" not in msg:
        return []
    rid = orjson.dumps(msg["id"])
    head = b'{"jsonrpc":"2.0","id":' + rid + b',"result":'
    method = msg["method"]
    params = msg.get("params") or {}
    if method == "initialize" and ERA["legacy"]:
        return [head + orjson.dumps(INITIALIZE) + b"}"]
    if method == "server/discover" and not ERA["legacy"]:
        return [head + orjson.dumps(DISCOVER) + b"}"]
    if method == "tools/list":
        listed = orjson.dumps({"resultType": "complete", **TOOLS})
        return [head + listed.replace(b'"LONE"', LONE_DESCRIPTION) + b"}"]
    if method == "ping":
        return [head + b"{}}"]
    if method != "tools/call":
        error = b'{"code":-32601,"message":"Method not found"}'
        return [b'{"jsonrpc":"2.0","id":' + rid + b',"error":' + error + b"}"]
    if params.get("name") == "deep":
        depth = int(params["arguments"]["depth"])
        value = b"[" * depth + b"1" + b"]" * depth
        return [head + b'{"resultType":"complete","content":[],"deep":' + value + b"}}"]
    out = []
    token = (params.get("_meta") or {}).get("progressToken")
    if token is not None:
        out.append(
            b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":'
            + orjson.dumps(token)
            + b',"progress":'
            + FIRST
            + b"}}"
        )
    quoted, structured = line, NUMBERS
    if params.get("name") == "lone":
        quoted, structured = object_at(line, line.index(b'"arguments":') + 12), LONE
    text = orjson.dumps(quoted.decode())
    result = b'{"resultType":"complete","content":[{"type":"text","text":' + text + b"}],"
    out.append(head + result + b'"structuredContent":' + structured + b"}}")
    return out


_STRING_OR_BRACE = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}]')


def object_at(line: bytes, start: int) -> bytes:
    """The text of the JSON object that begins at `start` (read by its braces, strings
    skipped), as the line holds it."""
    depth = 0
    for token in _STRING_OR_BRACE.finditer(line, start):
        if token.group() == b"{":
            depth += 1
        elif token.group() == b"}":
            depth -= 1
            if depth == 0:
                return line[start : token.end()]
    raise ValueError("no object there")


def serve_stdio() -> None:
    for line in sys.stdin.buffer:
        if line.strip():
            for out in replies(line.rstrip(b"\r\n")):
                sys.stdout.buffer.write(out + b"\n")
                sys.stdout.buffer.flush()


async def handle(request: web.Request) -> web.StreamResponse:
    lines = replies(await request.read())
    if not lines:
        return web.Response(status=202)
    if len(lines) == 1:
        return web.Response(body=lines[0], content_type="application/json")
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for line in lines:
        await resp.write(b"data: " + line + b"\n\n")
    await resp.write_eof()
    return resp


# The 2024-11-05 HTTP+SSE transport: each GET /sse stream and the queue of what it sends.
STREAMS: dict[str, asyncio.Queue[bytes]] = {}


async def sse_stream(request: web.Request) -> web.StreamResponse:
    key = str(len(STREAMS))
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    STREAMS[key] = queue
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(b"event: endpoint\ndata: /messages/?session_id=" + key.encode() + b"\n\n")
    while True:
        line = await queue.get()
        await resp.write(b"event: message\ndata: " + line + b"\n\n")


async def sse_message(request: web.Request) -> web.Response:
    queue = STREAMS[request.query["session_id"]]
    for line in replies(await request.read()):
        queue.put_nowait(line)
    return web.Response(status=202)


async def serve_http(port: int, sse: bool) -> None:
    app = web.Application()
    if sse:
        app.router.add_get("/sse", sse_stream)
        app.router.add_post("/messages/", sse_message)
    else:
        app.router.add_post("/mcp", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    print(f"READY {runner.addresses[0][1]}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=["stdio", "http", "sse"])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--legacy", action="store_true")
    args = parser.parse_args()
    ERA["legacy"] = args.legacy or args.transport == "sse"
    if args.transport == "stdio":
        serve_stdio()
    else:
        asyncio.run(serve_http(args.port, args.transport == "sse"))


if __name__ == "__main__":
    main()
