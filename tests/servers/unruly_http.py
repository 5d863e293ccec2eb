"""A badly behaved Streamable HTTP MCP server on aiohttp, run in the test's process on
127.0.0.1 (a real server over real sockets), for the HTTP backend's id and resumption tests.

What a `tools/call` does depends on the tool's name:

- `echo`: one JSON reply with the arguments as the result (a well-behaved call).
- `twice`: an SSE stream with the reply, then a second reply with the same id, in one write.
- `stray`: an SSE stream with a reply under an id nobody sent, then the proper reply.
- `stray_json`: one JSON reply under an id nobody sent.
- `client_id`: a reply under the id given in the arguments (`as_id`, the client's own id)
  instead of the id the request came with; SSE or JSON (`json: true`).
- `routed`: the reply goes on the stream registered under the request's id, as servers that
  keep their streams by request id do; the replies are held until `expect` calls are in, so
  that calls with equal ids would overwrite each other's stream.
- `progress`: progress for the request's own token and for another token, then the reply.
- `hang`: an SSE stream that stays open; the call is never answered.
- `drop`: an SSE stream with event ids and `retry` (ms, the `retry` argument) that closes
  before the reply; a GET with `Last-Event-ID` gets the rest (a progress notification and the
  reply). With `fail: true` every such GET gets a fresh priming event and is closed empty.
  With `ids: false` the stream has no event ids; with `forget: true` a GET resuming it gets 404.

- `orphan`: like `drop`, but the reply it owes goes out on the next GET *without*
  `Last-Event-ID` (a session's standing stream), as some 2025-11-25 servers do; a GET resuming
  it gets a fresh priming event and is held open, empty.

With `watch=True`, a GET without `Last-Event-ID` is a listen stream that sends a change
notification under event id `w-1` with `retry: 50` and closes; a GET resuming `w-1` gets a
second one (`w-2`) and is closed; resuming `w-2` is refused (204).

Every request and notification is recorded (`received`), every GET with its `Last-Event-ID`
(`resumes`), and when each `drop` stream closed (`closed_at`, the loop's clock).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import orjson
from aiohttp import web

from tests.support import until

Message = dict[str, Any]
LEGACY = "2025-11-25"
TOOLS = [
    {"name": name, "inputSchema": {"type": "object"}}
    for name in ("echo", "twice", "stray", "stray_json", "client_id", "routed", "progress")
    + ("hang", "drop", "orphan")
]


def event(msg: Message | None, event_id: str | None = None, retry: int | None = None) -> bytes:
    lines = []
    if event_id is not None:
        lines.append(b"id: " + event_id.encode())
    if retry is not None:
        lines.append(b"retry: %d" % retry)
    lines.append(b"data: " + (orjson.dumps(msg) if msg is not None else b""))
    return b"\n".join(lines) + b"\n\n"


def result(id_: object, value: dict[str, Any]) -> Message:
    return {"jsonrpc": "2.0", "id": id_, "result": {"resultType": "complete", **value}}


class Unruly:
    def __init__(self, *, legacy: bool = False, watch: bool = False) -> None:
        self.legacy = legacy
        self.watch = watch
        self.received: list[Message] = []
        self.order: list[str] = []  # "POST <method>" and "GET" as they arrived
        self.resumes: list[str | None] = []
        self.closed_at: list[float] = []
        self.resumed_at: list[float] = []
        self.changed = asyncio.Event()
        self._streams: dict[object, web.StreamResponse] = {}
        self._routed_calls: list[Message] = []
        self._routed_in = asyncio.Event()
        self._written: dict[object, asyncio.Event] = {}
        self._held: dict[str, Message] = {}  # the reply each dropped stream still owes
        self._orphaned: list[Message] = []  # replies owed on the next standing GET
        self._events = itertools.count(1)

    async def until(self, predicate: Any) -> None:
        await until(predicate, wake=self._next_change)

    async def _next_change(self) -> None:
        self.changed.clear()
        await self.changed.wait()

    def _note(self) -> None:
        self.changed.set()

    # --- the endpoint ------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "GET":
            return await self._get(request)
        if request.method != "POST":
            return web.Response(status=405)
        msg: Message = orjson.loads(await request.read())
        self.received.append(msg)
        self.order.append(f"POST {msg.get('method')}")
        self._note()
        if "method" not in msg or "id" not in msg:
            return web.Response(status=202)
        method = msg["method"]
        if method == "initialize":
            info = {"name": "unruly", "version": "1"}
            value = {"protocolVersion": LEGACY, "capabilities": {"tools": {}}, "serverInfo": info}
            return self._json({"jsonrpc": "2.0", "id": msg["id"], "result": value})
        if method == "server/discover":
            if self.legacy:
                error = {"code": -32601, "message": "Method not found"}
                return self._json({"jsonrpc": "2.0", "id": msg["id"], "error": error})
            value = {
                "supportedVersions": ["2026-07-28"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "unruly", "version": "1"},
            }
            return self._json(result(msg["id"], value))
        if method == "tools/list":
            return self._json(result(msg["id"], {"tools": TOOLS}))
        if method != "tools/call":
            return self._json(result(msg["id"], {}))
        params = msg["params"]
        args: dict[str, Any] = params.get("arguments") or {}
        tool = getattr(self, "_" + params["name"])
        response: web.StreamResponse = await tool(request, msg, args)
        return response

    def _json(self, msg: Message) -> web.Response:
        return web.Response(body=orjson.dumps(msg), content_type="application/json")

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        return resp

    # --- the tools ---------------------------------------------------------------------------

    async def _echo(self, request: web.Request, msg: Message, args: Message) -> web.Response:
        return self._json(result(msg["id"], {"echo": args}))

    async def _twice(self, request: web.Request, msg: Message, args: Message) -> web.StreamResponse:
        resp = await self._stream(request)
        first = event(result(msg["id"], {"n": 1}))
        await resp.write(first + event(result(msg["id"], {"n": 2})))
        return resp

    async def _stray(self, request: web.Request, msg: Message, args: Message) -> web.StreamResponse:
        resp = await self._stream(request)
        await resp.write(event(result("someone-else", {"stray": True})))
        await resp.write(event(result(msg["id"], {"stray": False})))
        return resp

    async def _stray_json(self, request: web.Request, msg: Message, args: Message) -> web.Response:
        return self._json(result("someone-else", {"stray": True}))

    async def _client_id(
        self, request: web.Request, msg: Message, args: Message
    ) -> web.StreamResponse:
        reply = result(args["as_id"], {"wrong": True})
        if args.get("json"):
            return self._json(reply)
        resp = await self._stream(request)
        await resp.write(event(reply))
        return resp

    async def _routed(
        self, request: web.Request, msg: Message, args: Message
    ) -> web.StreamResponse:
        resp = await self._stream(request)
        self._streams[msg["id"]] = resp  # (a second call with this id takes the entry over)
        self._routed_calls.append(msg)
        written = self._written.setdefault(msg["id"], asyncio.Event())
        if len(self._routed_calls) >= args["expect"]:
            self._routed_in.set()
        await self._routed_in.wait()
        if msg is self._routed_calls[0]:
            for call in self._routed_calls:
                target = self._streams[call["id"]]
                who = call["params"]["arguments"]["who"]
                await target.write(event(result(call["id"], {"who": who})))
                self._written[call["id"]].set()
        with anyio.move_on_after(2):  # a stream nobody wrote to (the bug) ends here
            await written.wait()
        return resp

    async def _progress(
        self, request: web.Request, msg: Message, args: Message
    ) -> web.StreamResponse:
        resp = await self._stream(request)
        token = msg["params"].get("_meta", {}).get("progressToken")
        for target in (token, "not-yours"):
            note = {
                "jsonrpc": "2.0",
                "method": "notifications/progress",
                "params": {"progressToken": target, "progress": 1},
            }
            await resp.write(event(note))
        await resp.write(event(result(msg["id"], {"token_seen": token})))
        return resp

    async def _hang(self, request: web.Request, msg: Message, args: Message) -> web.StreamResponse:
        resp = await self._stream(request)
        await resp.write(b": open\n\n")
        await asyncio.sleep(30)  # cut short when the gateway closes the stream
        return resp

    async def _drop(self, request: web.Request, msg: Message, args: Message) -> web.StreamResponse:
        resp = await self._stream(request)
        stream = f"s{next(self._events)}"
        with_ids = args.get("ids", True)
        retry = args.get("retry", 100)
        self._held[stream] = msg
        if args.get("fail"):
            self._held[stream] = {**msg, "fail": True}
        if args.get("forget"):
            del self._held[stream]  # a GET resuming it gets 404
        await resp.write(event(None, f"{stream}-0" if with_ids else None, retry))
        await resp.write(event(self._progress_note(msg, 1), f"{stream}-1" if with_ids else None))
        self.closed_at.append(anyio.current_time())
        self._note()
        return resp  # closed before the reply

    async def _orphan(
        self, request: web.Request, msg: Message, args: Message
    ) -> web.StreamResponse:
        resp = await self._stream(request)
        self._orphaned.append(msg)
        await resp.write(event(None, f"o{next(self._events)}-0", args.get("retry", 50)))
        self.closed_at.append(anyio.current_time())
        self._note()
        return resp  # closed before the reply

    async def _standing(self, request: web.Request, last: str | None) -> web.StreamResponse:
        """A GET while a reply is orphaned: without `Last-Event-ID` it carries the reply; a
        resuming one gets only a priming event, held open (closed when the client goes)."""
        resp = await self._stream(request)
        if last is None:
            held = self._orphaned.pop(0)
            await resp.write(event(result(held["id"], {"on": "the standing stream"}), "g-1"))
            return resp
        await resp.write(event(None, f"{last}-again", 50))
        await asyncio.sleep(30)  # cut short when the gateway closes the stream
        return resp

    def _progress_note(self, msg: Message, n: int) -> Message:
        token = msg["params"].get("_meta", {}).get("progressToken", "none")
        params = {"progressToken": token, "progress": n}
        return {"jsonrpc": "2.0", "method": "notifications/progress", "params": params}

    async def _get(self, request: web.Request) -> web.StreamResponse:
        last = request.headers.get("Last-Event-ID")
        self.resumes.append(last)
        self.order.append("GET")
        self.resumed_at.append(anyio.current_time())
        self._note()
        if self._orphaned:
            return await self._standing(request, last)
        if self.watch:
            return await self._listen(request, last)
        if last is None:
            return web.Response(status=405)  # no stream outside requests
        stream, _, _ = last.partition("-")
        held = self._held.get(stream)
        if held is None:
            return web.Response(status=404)
        resp = await self._stream(request)
        if held.get("fail"):
            await resp.write(event(None, f"{stream}-p{len(self.resumes)}", 50))
            return resp  # closed again, with nothing
        await resp.write(event(self._progress_note(held, 2), f"{stream}-2"))
        await resp.write(event(result(held["id"], {"resumed": last}), f"{stream}-3"))
        del self._held[stream]
        return resp

    async def _listen(self, request: web.Request, last: str | None) -> web.StreamResponse:
        if last not in (None, "w-1"):
            return web.Response(status=204)
        resp = await self._stream(request)
        n = 1 if last is None else 2
        note = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed", "params": {"n": n}}
        await resp.write(event(note, f"w-{n}", 50 if n == 1 else None))
        return resp


@asynccontextmanager
async def serving(
    *, legacy: bool = False, watch: bool = False
) -> AsyncIterator[tuple[Unruly, str]]:
    """The server on 127.0.0.1: (its state, the URL of its MCP endpoint)."""
    server = Unruly(legacy=legacy, watch=watch)
    app = web.Application()
    app.router.add_route("*", "/mcp", server.handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0, handler_cancellation=True)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield server, f"http://127.0.0.1:{runner.addresses[0][1]}/mcp"
    finally:
        with anyio.CancelScope(shield=True):
            await runner.cleanup()
