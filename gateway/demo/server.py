"""A small MCP server (protocol 2026-07-28) over stdio, for trying the gateway with only Python.

Run as `python -m gateway.demo.server`. Handlers are pure (request dict in, reply out); the
async loop around them only does I/O, waiting, progress and cancellation.
"""

from __future__ import annotations

import base64
import binascii
import math
import os
import sys
from collections.abc import AsyncIterable, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

import anyio
import anyio.lowlevel
import orjson

JSON = dict[str, Any]
RequestId = str | int
Send = Callable[[JSON], Awaitable[None]]

VERSION = "2026-07-28"
SERVER_INFO = {"name": "mcp-gateway-demo", "version": "0.1.0"}
# Everything here is static and identical for every caller, so any cache may keep it an hour.
CACHE = {"ttlMs": 3_600_000, "cacheScope": "public"}
PAGE_SIZE = 50
# Keeps `add` results inside the integers every JSON peer can represent exactly.
SAFE_INT = 2**53 - 1
META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPS = "io.modelcontextprotocol/clientCapabilities"


class RpcError(Exception):
    def __init__(self, code: int, message: str, data: object = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


def _version_error(requested: object) -> RpcError:
    return RpcError(
        -32022, "Unsupported protocol version", {"supported": [VERSION], "requested": requested}
    )


def _obj(props: JSON, required: list[str]) -> JSON:
    return {
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": False,
    }


TOOLS: list[JSON] = [
    {
        "name": "echo",
        "title": "Echo",
        "description": "Return the given text unchanged.",
        "inputSchema": _obj({"text": {"type": "string", "description": "Text to echo"}}, ["text"]),
    },
    {
        "name": "add",
        "title": "Add integers",
        "description": "Add two integers.",
        "inputSchema": _obj(
            {
                k: {"type": "integer", "minimum": -SAFE_INT // 2, "maximum": SAFE_INT // 2}
                for k in ("a", "b")
            },
            ["a", "b"],
        ),
        "outputSchema": _obj({"sum": {"type": "integer"}}, ["sum"]),
    },
    {
        "name": "sleep",
        "title": "Sleep",
        "description": "Wait the given seconds (max 30), reporting progress each second.",
        "inputSchema": _obj(
            {"seconds": {"type": "number", "minimum": 0, "maximum": 30}}, ["seconds"]
        ),
    },
    {
        "name": "utc_now",
        "title": "Current UTC time",
        "description": "Return the current UTC time in ISO 8601 format.",
        "inputSchema": _obj({}, []),
    },
]
RESOURCES: list[JSON] = [
    {
        "uri": "demo://readme",
        "name": "readme",
        "title": "About this demo",
        "description": "What the demo server offers",
        "mimeType": "text/markdown",
    },
]
TEMPLATES: list[JSON] = [
    {
        "uriTemplate": "demo://echo/{text}",
        "name": "echo",
        "title": "Echo resource",
        "description": "Reading demo://echo/<text> returns <text>",
        "mimeType": "text/plain",
    },
]
PROMPTS: list[JSON] = [
    {
        "name": "summarize",
        "title": "Summarize text",
        "description": "Ask for a short summary.",
        "arguments": [{"name": "text", "description": "Text to summarize", "required": True}],
    },
]
README = """# mcp-gateway demo server

A tiny MCP server bundled with mcp-gateway so you can try the gateway with nothing but Python.

- Tools: `echo`, `add`, `sleep` (reports progress, can be cancelled), `utc_now`
- Resources: `demo://readme` and the template `demo://echo/{text}`
- Prompts: `summarize`
"""


def _text(text: str, is_error: bool = False) -> JSON:
    return {"content": [{"type": "text", "text": text}], "isError": is_error}


def _structured(value: JSON) -> JSON:
    # Older clients only read `content`, so the structured value is mirrored there as JSON text.
    return {**_text(orjson.dumps(value).decode()), "structuredContent": value}


def _type_ok(value: object, kind: str) -> bool:
    # bool is an int subclass in Python but never a JSON integer or number (and no demo
    # argument is a boolean).
    if isinstance(value, bool):
        return False
    if kind == "number":
        return isinstance(value, int | float) and math.isfinite(value)
    return isinstance(value, {"string": str, "integer": int}[kind])


def schema_problem(schema: JSON, args: JSON) -> str | None:
    """Check args against the small JSON-Schema subset our own inputSchemas use."""
    props: JSON = schema["properties"]
    missing = [name for name in schema["required"] if name not in args]
    if missing:
        return f"missing argument '{missing[0]}'"
    for name, value in args.items():
        prop = props.get(name)
        if prop is None:
            return f"unexpected argument '{name}'"
        if not _type_ok(value, prop["type"]):
            return f"argument '{name}' must be of type {prop['type']}"
        if not prop.get("minimum", value) <= value <= prop.get("maximum", value):
            return f"argument '{name}' must be between {prop['minimum']} and {prop['maximum']}"
    return None


TOOL_RUNNERS: dict[str, Callable[[JSON], JSON]] = {
    "echo": lambda args: _text(args["text"]),
    "add": lambda args: _structured({"sum": args["a"] + args["b"]}),
    "sleep": lambda args: _text(f"Slept for {args['seconds']} seconds."),
    "utc_now": lambda args: _text(datetime.now(UTC).isoformat(timespec="seconds")),
}


def call_tool(params: JSON) -> tuple[JSON, float]:
    """Return the tool result and how long the I/O loop must wait before sending it."""
    tool = next((t for t in TOOLS if t["name"] == params.get("name")), None)
    if tool is None:
        raise RpcError(-32602, f"Unknown tool: {params.get('name')}")
    args = params.get("arguments", {})
    if not isinstance(args, dict):
        raise RpcError(-32602, "arguments must be an object")
    problem = schema_problem(tool["inputSchema"], args)
    if problem:
        return _text(f"Invalid arguments for {tool['name']}: {problem}", is_error=True), 0.0
    # The wait happens in the I/O loop, so handlers stay pure and cancellation stays there.
    delay = float(args["seconds"]) if tool["name"] == "sleep" else 0.0
    return TOOL_RUNNERS[tool["name"]](args), delay


def _cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(f"offset:{offset}".encode()).decode()


def paginate(key: str, items: list[JSON], params: JSON) -> JSON:
    cursor = params.get("cursor")
    offset = 0
    if cursor is not None:
        try:
            raw = base64.b64decode(cursor, altchars=b"-_", validate=True).decode()
            tag, _, num = raw.partition(":")
            offset = int(num) if tag == "offset" else -1
        except (TypeError, ValueError, binascii.Error):
            offset = -1
        if not 0 <= offset <= len(items):
            raise RpcError(-32602, "Invalid cursor", {"cursor": cursor})
    page: JSON = {key: items[offset : offset + PAGE_SIZE], **CACHE}
    if offset + PAGE_SIZE < len(items):
        page["nextCursor"] = _cursor(offset + PAGE_SIZE)
    return page


def read_resource(params: JSON) -> JSON:
    uri = params.get("uri")
    if uri == "demo://readme":
        content = {"uri": uri, "mimeType": "text/markdown", "text": README}
    elif isinstance(uri, str) and uri.startswith("demo://echo/"):
        # RFC 6570 simple expansion percent-encodes the value, so decode it back.
        content = {
            "uri": uri,
            "mimeType": "text/plain",
            "text": unquote(uri[len("demo://echo/") :]),
        }
    else:
        raise RpcError(-32602, "Resource not found", {"uri": uri})
    return {"contents": [content], **CACHE}


def get_prompt(params: JSON) -> JSON:
    if params.get("name") != "summarize":
        raise RpcError(-32602, f"Unknown prompt: {params.get('name')}")
    args = params.get("arguments") or {}
    text = args.get("text") if isinstance(args, dict) else None
    if not isinstance(text, str):
        raise RpcError(-32602, "Missing required argument: text")
    prompt = f"Please summarize the following text in a few sentences:\n\n{text}"
    return {
        "description": "Summarize text",
        "messages": [{"role": "user", "content": {"type": "text", "text": prompt}}],
    }


def discover(params: JSON) -> JSON:
    return {
        "supportedVersions": [VERSION],
        "capabilities": {"tools": {}, "resources": {}, "prompts": {}},
        "instructions": "Demo server: echo/add/sleep/utc_now tools, demo:// resources, "
        "and a summarize prompt.",
        **CACHE,
    }


METHODS: dict[str, Callable[[JSON], JSON]] = {
    "server/discover": discover,
    "tools/list": lambda p: paginate("tools", TOOLS, p),
    "resources/list": lambda p: paginate("resources", RESOURCES, p),
    "resources/templates/list": lambda p: paginate("resourceTemplates", TEMPLATES, p),
    "resources/read": read_resource,
    "prompts/list": lambda p: paginate("prompts", PROMPTS, p),
    "prompts/get": get_prompt,
}


def checked_params(msg: JSON) -> JSON:
    """Validate the per-request `_meta` every 2026-07-28 request must carry."""
    params = msg.get("params", {})
    if not isinstance(params, dict):
        raise RpcError(-32602, "params must be an object")
    if msg["method"] == "initialize":
        # A legacy client: tell it which version we speak instead of pretending to handshake.
        raise _version_error(params.get("protocolVersion"))
    meta = params.get("_meta")
    if not isinstance(meta, dict) or META_VERSION not in meta:
        raise RpcError(-32602, f"params._meta must include {META_VERSION}")
    if meta[META_VERSION] != VERSION:
        raise _version_error(meta[META_VERSION])
    if not isinstance(meta.get(META_CAPS), dict):
        raise RpcError(-32602, f"params._meta must include {META_CAPS} (an object)")
    return params


def error_reply(rid: RequestId | None, exc: RpcError) -> JSON:
    data = {} if exc.data is None else {"data": exc.data}
    error = {"code": exc.code, "message": exc.message, **data}
    # A line we could not read has no id to echo, so the reply carries none.
    return {"jsonrpc": "2.0", **({} if rid is None else {"id": rid}), "error": error}


def handle_request(msg: JSON) -> tuple[JSON, float]:
    """Return the reply to one request and how long to wait (with progress) before sending it."""
    rid: RequestId = msg["id"]
    try:
        params = checked_params(msg)
        if msg["method"] == "tools/call":
            result, delay = call_tool(params)
        elif msg["method"] in METHODS:
            result, delay = METHODS[msg["method"]](params), 0.0
        else:
            raise RpcError(-32601, f"Method not found: {msg['method']}")
    except RpcError as exc:
        return error_reply(rid, exc), 0.0
    except Exception as exc:  # a bug in a handler must cost one request, not the whole server
        return error_reply(rid, RpcError(-32603, f"Internal error: {exc}")), 0.0
    meta = {"_meta": {"io.modelcontextprotocol/serverInfo": SERVER_INFO}}
    return {
        "jsonrpc": "2.0",
        "id": rid,
        "result": {"resultType": "complete", **result, **meta},
    }, delay


def classify(line: bytes) -> tuple[str, JSON]:
    """Sort an input line into ("request" | "notification" | "reply" | "skip", payload)."""
    if not line.strip():
        return "skip", {}
    try:
        msg = orjson.loads(line)
    except orjson.JSONDecodeError:
        return "reply", error_reply(None, RpcError(-32700, "Parse error: Invalid JSON"))
    if not isinstance(msg, dict) or not isinstance(msg.get("method"), str):
        return "reply", error_reply(None, RpcError(-32600, "Invalid Request"))
    if "id" not in msg:
        return "notification", msg
    if isinstance(msg["id"], bool) or not isinstance(msg["id"], str | int):
        return "reply", error_reply(None, RpcError(-32600, "Invalid Request: bad id"))
    return "request", msg


def progress_token(msg: JSON) -> RequestId | None:
    params = msg.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    token = meta.get("progressToken") if isinstance(meta, dict) else None
    return token if isinstance(token, str | int) and not isinstance(token, bool) else None


def progress(token: RequestId, done: float, total: float) -> JSON:
    return {
        "jsonrpc": "2.0",
        "method": "notifications/progress",
        "params": {
            "progressToken": token,
            "progress": done,
            "total": total,
            "message": f"{done:g} of {total:g} seconds",
        },
    }


async def wait_with_progress(seconds: float, token: RequestId | None, send: Send) -> None:
    # Whole-second steps, each measured from the start, so progress strictly rises without drift.
    start = anyio.current_time()
    for step in range(1, math.ceil(seconds) + 1):
        done = min(float(step), seconds)
        await anyio.sleep(start + done - anyio.current_time())
        if token is not None:
            await send(progress(token, done, seconds))


async def serve(lines: AsyncIterable[bytes], send: Send) -> None:
    """Answer requests concurrently until input ends, then let in-flight ones finish."""
    inflight: dict[RequestId, anyio.CancelScope] = {}

    async def run(msg: JSON, scope: anyio.CancelScope) -> None:
        try:
            with scope:  # once cancelled, nothing more is sent for this id
                # A cancellation that arrived before this task started takes effect here.
                await anyio.lowlevel.checkpoint()
                reply, delay = handle_request(msg)
                if delay > 0:
                    await wait_with_progress(delay, progress_token(msg), send)
                await send(reply)
        finally:
            if inflight.get(msg["id"]) is scope:
                del inflight[msg["id"]]

    async with anyio.create_task_group() as tg:
        async for line in lines:
            kind, msg = classify(line)
            if kind == "reply":
                await send(msg)
            elif kind == "request":
                inflight[msg["id"]] = scope = anyio.CancelScope()
                tg.start_soon(run, msg, scope)
            elif kind == "notification" and msg["method"] == "notifications/cancelled":
                params = msg.get("params")
                rid = params.get("requestId") if isinstance(params, dict) else None
                if type(rid) in (str, int) and rid in inflight:
                    inflight[rid].cancel()


async def serve_stdio() -> None:
    # Take over the real stdout and point fd 1 at stderr, so a stray print() cannot corrupt
    # the protocol channel.
    channel = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    lock = anyio.Lock()

    def write(data: bytes) -> None:
        channel.write(data)
        channel.flush()

    async def send(message: JSON) -> None:
        data = orjson.dumps(message) + b"\n"
        async with lock:  # one whole line at a time, in order
            await anyio.to_thread.run_sync(write, data)

    async with anyio.wrap_file(sys.stdin.buffer) as stdin:
        await serve(stdin, send)
    channel.close()


def main() -> None:
    try:
        anyio.run(serve_stdio)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
