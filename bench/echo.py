"""A fast echo MCP backend for benchmarks, speaking both protocol eras.

`python -m bench.echo --stdio` serves newline-delimited JSON-RPC on stdin/stdout until EOF;
`python -m bench.echo --http [--port 0]` serves POST /mcp on 127.0.0.1 and prints
`READY http://127.0.0.1:<port>/mcp` once listening. `--tools N` adds a generated catalog of N
tools (bench/search.py, named `{service}_{tool}`, each answering with empty content) and the
tool `relist`, which changes one tool's description and, on stdio, sends
`notifications/tools/list_changed` after its reply (bench/search_e2e.py: a forced reindex).
It must cost as little as possible per request, so the HTTP side is a bare asyncio Protocol over
httptools rather than a framework.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import signal
import sys
from typing import Any, cast

import httptools
import orjson

from bench import run

MODERN = "2026-07-28"
LEGACY = ("2025-11-25", "2025-06-18", "2025-03-26")
META_VERSION = "io.modelcontextprotocol/protocolVersion"
SERVER_INFO = {"name": "bench-echo", "version": "1.0.0"}
# A long cache lifetime keeps a caching gateway from re-listing mid-run.
CACHE = {"ttlMs": 3_600_000, "cacheScope": "public"}

TOOLS: list[dict[str, Any]] = [
    {
        "name": "echo",
        "description": "Return the given text.",
        "inputSchema": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
    },
    {
        "name": "add",
        "description": "Return a + b as text.",
        "inputSchema": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
    },
    {
        "name": "noop",
        "description": "Do nothing.",
        "inputSchema": {"type": "object", "properties": {}},
    },
]

Message = dict[str, Any]
# What tools/list shows and the names a call may use beyond the three above (--tools N).
LISTED: list[dict[str, Any]] = TOOLS
EXTRA: set[str] = set()
RELIST = "relist"
# Notifications to write after the replies of the current read (stdio only).
OUTBOX: list[bytes] = []
_generation = itertools.count(1)


class RpcError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _is_modern(params: Any) -> bool:
    if not isinstance(params, dict):
        return False
    meta = params.get("_meta")
    return isinstance(meta, dict) and meta.get(META_VERSION) == MODERN


def _call_tool(params: Any) -> dict[str, Any]:
    if not isinstance(params, dict):
        raise RpcError(-32602, "params must be an object")
    name = params.get("name")
    args = params.get("arguments") or {}
    if not isinstance(args, dict):
        raise RpcError(-32602, "arguments must be an object")
    if name == "echo":
        text = args.get("text")
        if not isinstance(text, str):
            raise RpcError(-32602, "echo needs a string 'text'")
        return {"content": [{"type": "text", "text": text}]}
    if name == "add":
        a, b = args.get("a"), args.get("b")
        if not isinstance(a, int | float) or not isinstance(b, int | float):
            raise RpcError(-32602, "add needs numbers 'a' and 'b'")
        return {"content": [{"type": "text", "text": str(a + b)}]}
    if name == "noop" or name in EXTRA:
        return {"content": []}
    if name == RELIST and EXTRA:
        _relist()
        return {"content": []}
    raise RpcError(-32602, f"Unknown tool: {name}")


def with_catalog(size: int) -> None:
    """List `size` generated tools (and `relist`) besides the three fixed ones."""
    from bench.search import generated  # (only here: the plain echo imports nothing more)

    global LISTED
    extra = [
        {**t, "name": f"{service}_{t['name']}"}
        for service, own in generated(size).items()
        for t in own
    ]
    relist = {"name": RELIST, "description": "Bench control.", "inputSchema": {"type": "object"}}
    LISTED = [*TOOLS, *extra, relist]
    EXTRA.update(t["name"] for t in extra)


def _relist() -> None:
    # A new list object each time: the last tool's description says which generation it is.
    global LISTED
    last = LISTED[-2]
    LISTED = [*LISTED[:-2], {**last, "description": f"generation {next(_generation)}"}, LISTED[-1]]
    note = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
    OUTBOX.append(orjson.dumps(note) + b"\n")


def _result(method: str, params: Any, modern: bool) -> dict[str, Any]:
    if method == "tools/call":
        return _call_tool(params)
    if method == "tools/list":
        return {"tools": LISTED, **CACHE} if modern else {"tools": LISTED}
    if method == "ping":
        return {}
    if method == "server/discover":
        return {
            "supportedVersions": [MODERN, *LEGACY],
            "capabilities": {"tools": {}},
            "_meta": {"io.modelcontextprotocol/serverInfo": SERVER_INFO},
            **CACHE,
        }
    if method == "initialize":
        asked = params.get("protocolVersion") if isinstance(params, dict) else None
        return {
            "protocolVersion": asked if asked in LEGACY else LEGACY[0],
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": SERVER_INFO,
        }
    raise RpcError(-32601, f"Method not found: {method}")


def answer(msg: Any) -> tuple[Message | None, int]:
    """The reply to one decoded message (None for notifications and client replies) and the
    HTTP status it deserves."""
    if not isinstance(msg, dict):
        return _error(None, -32600, "Invalid Request"), 400
    method = msg.get("method")
    if not isinstance(method, str):
        # A client's reply to a server request, which this server never sends: accept it.
        return (None, 202) if "id" in msg else (_error(None, -32600, "Invalid Request"), 400)
    if "id" not in msg:
        return None, 202
    rid = msg["id"]
    params = msg.get("params")
    modern = _is_modern(params)
    try:
        result = _result(method, params, modern)
    except RpcError as exc:
        # A modern server answers an unknown method with 404 (streamable-http).
        status = 404 if modern and exc.code == -32601 else 200
        return _error(rid, exc.code, exc.message), status
    if modern:
        result["resultType"] = "complete"
    return {"jsonrpc": "2.0", "id": rid, "result": result}, 200


def _error(rid: Any, code: int, message: str) -> Message:
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}


# --- stdio -----------------------------------------------------------------------------------


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def serve_stdio() -> None:
    """Blocking reads suit stdio: there is nothing else to do while waiting, and one read
    returns every line already queued, so replies to a burst go out in one write."""
    fd_in, fd_out = sys.stdin.fileno(), sys.stdout.fileno()
    pending = b""
    while chunk := os.read(fd_in, 1 << 16):
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        out: list[bytes] = []
        for line in lines:
            if reply := _stdio_reply(line):
                out.append(reply)
        if OUTBOX:
            out += OUTBOX
            OUTBOX.clear()
        if out:
            _write_all(fd_out, b"".join(out))
    if reply := _stdio_reply(pending):
        _write_all(fd_out, reply)


def _stdio_reply(line: bytes) -> bytes | None:
    if not line.strip():
        return None
    try:
        msg = orjson.loads(line)
    except orjson.JSONDecodeError:
        return orjson.dumps(_error(None, -32700, "Parse error")) + b"\n"
    if isinstance(msg, list):
        replies = [r for r in (answer(m)[0] for m in msg) if r is not None]
        return orjson.dumps(replies) + b"\n" if replies else None
    reply = answer(msg)[0]
    return None if reply is None else orjson.dumps(reply) + b"\n"


# --- HTTP ------------------------------------------------------------------------------------

REASONS = {
    200: b"OK",
    202: b"Accepted",
    400: b"Bad Request",
    404: b"Not Found",
    405: b"Method Not Allowed",
}
# Any session id is accepted later, so ids only need to be unique, not secret.
SESSIONS = itertools.count(1)
JSON_HEAD = b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"


class EchoHttp(asyncio.Protocol):
    """One keep-alive connection. Requests are answered synchronously in arrival order, so
    pipelined requests need no queue."""

    __slots__ = ("_body", "_parser", "_transport", "_url")

    def __init__(self) -> None:
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport, so no isinstance check.
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            self._send(400, b"", close=True)

    def on_message_begin(self) -> None:
        self._url = b""
        self._body = []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        close = not self._parser.should_keep_alive()
        method = self._parser.get_method()
        path = self._url.split(b"?", 1)[0]
        if path != b"/mcp":
            self._send(404, b"", close=close)
        elif method == b"POST":
            self._post(b"".join(self._body), close)
        elif method == b"DELETE":
            self._send(200, b"", close=close)
        else:
            self._send(405, b"", close=close, extra=b"Allow: POST, DELETE\r\n")

    def _post(self, body: bytes, close: bool) -> None:
        try:
            msg = orjson.loads(body)
        except orjson.JSONDecodeError:
            self._send(400, orjson.dumps(_error(None, -32700, "Parse error")), close=close)
            return
        extra = b""
        if isinstance(msg, list):
            replies = [r for r in (answer(m)[0] for m in msg) if r is not None]
            status = 200 if replies else 202
            payload = orjson.dumps(replies) if replies else b""
        else:
            reply, status = answer(msg)
            payload = b"" if reply is None else orjson.dumps(reply)
            if reply is not None and msg.get("method") == "initialize" and "result" in reply:
                extra = b"Mcp-Session-Id: echo-%d-%d\r\n" % (os.getpid(), next(SESSIONS))
        self._send(status, payload, close=close, extra=extra)

    def _send(self, status: int, payload: bytes, *, close: bool, extra: bytes = b"") -> None:
        transport = self._transport
        if transport is None:
            return
        head = JSON_HEAD % (status, REASONS[status], len(payload))
        if close:
            extra += b"Connection: close\r\n"
        transport.write(head + extra + b"\r\n" + payload)
        if close:
            transport.close()


async def serve_http(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(EchoHttp, "127.0.0.1", port, backlog=1024)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    bound = server.sockets[0].getsockname()[1]
    sys.stdout.write(f"READY http://127.0.0.1:{bound}/mcp\n")
    sys.stdout.flush()
    await stop.wait()
    server.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.echo", description=__doc__)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--stdio", action="store_true", help="serve JSON-RPC lines on stdin/stdout")
    mode.add_argument("--http", action="store_true", help="serve HTTP on 127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--tools", type=int, default=0, help="a generated catalog of N tools")
    args = parser.parse_args(argv)
    if args.tools:
        with_catalog(args.tools)
    if args.stdio:
        serve_stdio()
    else:
        run(serve_http(args.port))


if __name__ == "__main__":
    main()
