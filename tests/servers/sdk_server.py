"""Test backend built on the official `mcp` SDK (v2, MCPServer) speaking MCP 2026-07-28.

Usage:
    python tests/servers/sdk_server.py stdio [--page-size N] [--label TEXT] [--legacy-only]
    python tests/servers/sdk_server.py http --port N [--json] [--page-size N] [--label TEXT]
    python tests/servers/sdk_server.py sse --port N [--page-size N] [--label TEXT]

`--legacy-only` makes the (dual-era) SDK server a legacy one: `server/discover` and requests
carrying modern `_meta` get -32601 as from a 2025-era server (`--silent-discover`: the probe
is never answered). `sse` serves only the 2024-11-05 HTTP+SSE transport (GET /sse, POST
/messages/), which is legacy by nature.

HTTP mode serves Streamable HTTP at http://127.0.0.1:N/mcp and prints `READY <port>`
once the socket accepts connections (`--port 0` binds an ephemeral port).
tools/list, prompts/list, resources/list and resources/templates/list are paginated with
`--page-size` items a page (default 10; `0` disables pagination). `--label` (default "sdk")
is returned by the `label` tool and the `mem://shared` resource, to tell copies apart.
completion/complete completes `greet`'s `name` and `mem://items/{id}`'s `id` by prefix.

`ask` elicits a form (one string field `answer`); at 2026-07-28 the SDK turns that into an
`input_required` tools/call result carrying an `elicitation/create` input request. `sample`
(`ctx.session.create_message`) and `confirm` (`ctx.elicit`) ask the client with a request of
the server's own during the call, which only a legacy connection carries.
`subscriptions/listen` is served (SDK default bus): `change_tools` publishes
`notifications/tools/list_changed` (with `toggle=true` it also adds/removes the tool
`dummy`), `touch` publishes `notifications/resources/updated` for a URI, and
`close_listens` ends every open listen stream gracefully (each gets its completion result
`{"resultType": "complete", "_meta": {subscriptionId}}`), as SIGTERM does before exiting.
`--request-state-key` seals `requestState` with a key of the caller's instead of one made per
process, so copies of the server (one per gateway replica) accept each other's.
`--record-listens` adds the tool `await_listen_uri`: it waits (at most `seconds`) until
some open listen stream asks for a resource URI (or, with `present` false, none does) and says
which holds, so a test sees what the gateway's listens ask of this server.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Annotated, Any

import anyio
import orjson
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.elicitation import AcceptedElicitation, DeclinedElicitation, ElicitationResult
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.mcpserver import Context, Elicit, MCPServer, Resolve
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.request_state import RequestStateSecurity
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp_types import (
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    Completion,
    CompletionArgument,
    CompletionContext,
    EmptyResult,
    PromptReference,
    ResourceTemplateReference,
    SamplingMessage,
    SubscribeRequestParams,
    SubscriptionsListenRequestParams,
    TextContent,
    UnsubscribeRequestParams,
)
from pydantic import BaseModel, Field

warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

EXTRA_TOOLS = 30
# What a client sees through a gateway that serves this server alone (single-backend
# transparency), as it would directly.
INSTRUCTIONS = "The SDK test server: echo, add and friends, for the gateway's tests."


# Paginated list methods and the key holding each one's items.
PAGED_LISTS = {
    "tools/list": "tools",
    "prompts/list": "prompts",
    "resources/list": "resources",
    "resources/templates/list": "resourceTemplates",
}

GREET_NAMES = ["Ann", "Anna", "Bob"]
ITEM_IDS = ["1", "2", "3"]


class ListPager:
    """Middleware slicing MCPServer's unpaginated list results (tools, prompts, resources,
    resource templates) into pages of `page_size`; the cursor is the decimal start offset."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        key = PAGED_LISTS.get(ctx.method)
        if key is None or self.page_size <= 0:
            return await call_next(ctx)
        cursor = (ctx.params or {}).get("cursor")
        start = 0
        if cursor is not None:
            if not isinstance(cursor, str) or not cursor.isdigit():
                raise MCPError(code=INVALID_PARAMS, message="Invalid cursor")
            start = int(cursor)
        result = await call_next(ctx)
        assert isinstance(result, dict)
        items: list[Any] = result[key]
        end = start + self.page_size
        page = dict(result)
        page[key] = items[start:end]
        if end < len(items):
            page["nextCursor"] = str(end)
        return page


async def complete(
    ref: PromptReference | ResourceTemplateReference,
    argument: CompletionArgument,
    context: CompletionContext | None,
) -> Completion | None:
    """completion/complete: `greet`'s `name` and `mem://items/{id}`'s `id`, by prefix."""
    if isinstance(ref, PromptReference) and ref.name == "greet" and argument.name == "name":
        choices = GREET_NAMES
    elif (
        isinstance(ref, ResourceTemplateReference)
        and ref.uri == "mem://items/{id}"
        and argument.name == "id"
    ):
        choices = ITEM_IDS
    else:
        return None
    values = [c for c in choices if c.startswith(argument.value)]
    return Completion(values=values, total=len(values), has_more=False)


class AskForm(BaseModel):
    """The form `ask` elicits: one string field."""

    answer: str


def ask_question(question: str) -> Elicit[AskForm]:
    """Resolver for `ask`: elicit the answer to the tool's `question` argument."""
    return Elicit(question, AskForm)


def _dummy() -> str:
    return "dummy"


def _constant(value: str) -> Callable[[], str]:
    def tool() -> str:
        return value

    return tool


# Each built server's subscriptions/listen handler, so shutdown can end listen streams
# gracefully (MCPServer keeps the one it creates private and never closes it).
LISTEN_HANDLERS: weakref.WeakKeyDictionary[MCPServer, ListenHandler] = weakref.WeakKeyDictionary()


class RecordingListen(ListenHandler):
    """The SDK's listen handler, remembering the resource URIs each open stream asked for."""

    def __init__(self, bus: InMemorySubscriptionBus) -> None:
        super().__init__(bus)
        self.asked: dict[object, frozenset[str]] = {}
        self._changed: anyio.Event | None = None  # (made in the loop, when first awaited)

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], params: SubscriptionsListenRequestParams
    ) -> Any:
        key = object()
        self.asked[key] = frozenset(params.notifications.resource_subscriptions or ())
        self._signal()
        try:
            return await super().__call__(ctx, params)
        finally:
            del self.asked[key]
            self._signal()

    def asks_for(self, uri: str) -> bool:
        return any(uri in uris for uris in self.asked.values())

    async def changed(self) -> None:
        if self._changed is None:
            self._changed = anyio.Event()
        await self._changed.wait()

    def _signal(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None


def close_listens(mcp: MCPServer) -> None:
    """End `mcp`'s open listen streams with their graceful completion result."""
    handler = LISTEN_HANDLERS.get(mcp)
    if handler is not None:
        handler.close()


LEGACY_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")


class LegacyOnly:
    """Middleware refusing what a server of the legacy era does not know."""

    def __init__(self, silent_discover: bool) -> None:
        self.silent_discover = silent_discover

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if ctx.method == "server/discover" and self.silent_discover:
            await anyio.sleep_forever()
        if ctx.method == "server/discover" or (
            ctx.method != "initialize" and ctx.protocol_version not in LEGACY_VERSIONS
        ):
            raise MCPError(code=METHOD_NOT_FOUND, message=f"Method not found: {ctx.method}")
        return await call_next(ctx)


def build_server(
    page_size: int,
    label: str = "sdk",
    *,
    legacy_only: bool = False,
    silent_discover: bool = False,
    request_state_key: str | None = None,
    record_listens: bool = False,
) -> MCPServer:
    bus = InMemorySubscriptionBus()
    middleware: list[Any] = [ListPager(page_size)]
    if legacy_only:
        middleware.insert(0, LegacyOnly(silent_discover))
    mcp = MCPServer(
        "sdk-test-server",
        version="1.0.0",
        instructions=INSTRUCTIONS,
        log_level="WARNING",
        middleware=middleware,
        subscriptions=bus,
        request_state_security=(
            RequestStateSecurity(keys=[request_state_key]) if request_state_key else None
        ),
    )
    # A legacy session hears of changes as notifications of its own (2025-11-25), after
    # `resources/subscribe` for resource updates; this server announces and sends both (in
    # either mode: the dual-era server has legacy sessions too).
    subscribed: set[str] = set()
    lowlevel = mcp._lowlevel_server
    make_options = lowlevel.create_initialization_options
    changes = NotificationOptions(prompts_changed=True, resources_changed=True, tools_changed=True)
    lowlevel.create_initialization_options = (  # type: ignore[method-assign]
        lambda *args, **kwargs: make_options(changes, *args[1:], **kwargs)
    )

    async def subscribe(ctx: Any, params: SubscribeRequestParams) -> EmptyResult:
        subscribed.add(str(params.uri))
        return EmptyResult()

    async def unsubscribe(ctx: Any, params: UnsubscribeRequestParams) -> EmptyResult:
        subscribed.discard(str(params.uri))
        return EmptyResult()

    lowlevel.add_request_handler("resources/subscribe", SubscribeRequestParams, subscribe)
    lowlevel.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, unsubscribe)
    # Serve subscriptions/listen with a handler we hold (same bus `ctx.notify_*` publishes on).
    listen_handler = RecordingListen(bus)
    mcp._lowlevel_server.add_request_handler(
        "subscriptions/listen", SubscriptionsListenRequestParams, listen_handler
    )
    LISTEN_HANDLERS[mcp] = listen_handler

    @mcp.tool()
    def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    @mcp.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @mcp.tool()
    async def slow(seconds: float, ctx: Context, steps: int = 3) -> str:
        """Sleep `seconds` in total, reporting progress `steps` times."""
        steps = max(steps, 1)
        for i in range(1, steps + 1):
            await anyio.sleep(seconds / steps)
            await ctx.report_progress(i, steps, f"step {i}/{steps}")
        return "done"

    cancelled: dict[str, anyio.Event] = {}

    @mcp.tool()
    async def hold(key: str, ctx: Context) -> str:
        """Report progress once, then wait to be cancelled (noted under `key`)."""
        await ctx.report_progress(0, 1, "holding")
        try:
            await anyio.sleep(60)
        except anyio.get_cancelled_exc_class():
            cancelled.setdefault(key, anyio.Event()).set()
            raise
        return "not cancelled"

    @mcp.tool()
    async def was_cancelled(key: str) -> str:
        """Whether the `hold` call under `key` was cancelled (waiting up to 5 s for it)."""
        with anyio.move_on_after(5):
            await cancelled.setdefault(key, anyio.Event()).wait()
            return "cancelled"
        return "not cancelled"

    @mcp.tool()
    def boom() -> str:
        """Always fail with a tool error."""
        raise ToolError("boom")

    @mcp.tool()
    async def log(text: str, ctx: Context) -> str:
        """Emit a notifications/message log entry for this request."""
        await ctx.info(text, logger_name="sdk_server")
        return "logged"

    @mcp.tool()
    def whoami() -> str:
        """Return the server process id."""
        return str(os.getpid())

    @mcp.tool(name="label")
    def label_tool() -> str:
        """Return this server's --label (tells copies of this server apart)."""
        return label

    @mcp.tool()
    def getenv(name: str) -> str:
        """Return an environment variable of the server process ('' when unset)."""
        return os.environ.get(name, "")

    @mcp.tool()
    def regional(
        region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})],
        query: str,
    ) -> str:
        """Answer a query for a region (region is mirrored into Mcp-Param-Region)."""
        return f"{region}:{query}"

    @mcp.tool()
    def ask(
        question: str,
        reply: Annotated[ElicitationResult[AskForm], Resolve(ask_question)],
    ) -> str:
        """Ask the user `question` (form elicitation); return their answer."""
        if isinstance(reply, AcceptedElicitation):
            return f"answer: {reply.data.answer}"
        if isinstance(reply, DeclinedElicitation):
            return "declined"
        return "cancelled"

    @mcp.tool()
    async def sample(prompt: str, ctx: Context) -> str:
        """Ask the client's model about `prompt` (sampling, a request of the server's own
        during the call: only the legacy era has a channel for it)."""
        message = SamplingMessage(role="user", content=TextContent(type="text", text=prompt))
        result = await ctx.session.create_message(
            [message], max_tokens=16, related_request_id=ctx.request_id
        )
        content = result.content
        return f"sampled: {content.text if isinstance(content, TextContent) else '?'}"

    @mcp.tool()
    async def confirm(question: str, ctx: Context) -> str:
        """Elicit an answer with `ctx.elicit` (a request of the server's own, legacy era)."""
        reply = await ctx.elicit(question, AskForm)
        if isinstance(reply, AcceptedElicitation):
            return f"confirmed: {reply.data.answer}"
        return reply.action

    dummy_present = False

    @mcp.tool()
    async def change_tools(ctx: Context, toggle: bool = False) -> str:
        """Emit notifications/tools/list_changed to listen streams.

        With `toggle`, first add (or remove again) the tool `dummy`."""
        nonlocal dummy_present
        if toggle:
            if dummy_present:
                mcp.remove_tool("dummy")
            else:
                mcp.add_tool(_dummy, name="dummy", description="Toggled by change_tools.")
            dummy_present = not dummy_present
        await ctx.notify_tools_changed()
        if ctx.protocol_version in LEGACY_VERSIONS:
            await ctx.session.send_tool_list_changed()
        return "dummy present" if dummy_present else "dummy absent"

    @mcp.tool()
    async def touch(uri: str, ctx: Context) -> str:
        """Emit notifications/resources/updated for `uri` to listen streams subscribed to it."""
        await ctx.notify_resource_updated(uri)
        if ctx.protocol_version in LEGACY_VERSIONS and uri in subscribed:
            await ctx.session.send_resource_updated(uri)
        return f"touched {uri}"

    @mcp.tool(name="close_listens")
    def close_listens_tool() -> str:
        """End every open subscriptions/listen stream with its graceful completion result."""
        listen_handler.close()
        return "closed"

    if record_listens:

        @mcp.tool(name="await_listen_uri")
        async def await_listen_uri(uri: str, present: bool = True, seconds: float = 5.0) -> str:
            """Wait until some open listen stream asks for `uri` (or none does); say which."""
            with anyio.move_on_after(seconds):
                while listen_handler.asks_for(uri) != present:
                    await listen_handler.changed()
            return "present" if listen_handler.asks_for(uri) else "absent"

    for i in range(EXTRA_TOOLS):
        name = f"t{i:02d}"
        mcp.add_tool(_constant(name), name=name, description=f"Trivial tool {name}.")

    @mcp.resource("mem://greeting", mime_type="text/plain")
    def greeting() -> str:
        return "hello"

    @mcp.resource("mem://motd", mime_type="text/plain")
    def motd() -> str:
        return "message of the day"

    @mcp.resource("mem://shared", mime_type="text/plain")
    def shared() -> str:
        return label

    @mcp.resource("mem://items/{id}", mime_type="text/plain")
    def item(id: str) -> str:
        return f"item {id}"

    @mcp.resource("mem://users/{user}/profile", mime_type="text/plain")
    def profile(user: str) -> str:
        return f"profile of {user}"

    @mcp.prompt()
    def greet(name: str) -> str:
        """Greet someone."""
        return f"Hello, {name}!"

    @mcp.prompt()
    def farewell(name: str) -> str:
        """Say goodbye to someone."""
        return f"Goodbye, {name}!"

    # MCPServer.completion() carries no annotations in SDK 2.3.0.
    mcp.completion()(complete)  # type: ignore[no-untyped-call]

    return mcp


def refuse_discover_on_stdin(silent: bool) -> None:
    """A legacy server's stdin: `server/discover` is an unknown method (or, `silent`, never
    answered) before the SDK sees it. The SDK commits a stdio connection to the modern era on
    its first modern request, so the refusal must happen before the SDK reads it. The refusal
    goes to a copy of the real stdout taken now: once serving, the SDK diverts fd 1 to stderr
    (so stray prints cannot corrupt the wire), and a refusal written there would be lost."""
    wire_out = os.dup(1)
    read_end, write_end = os.pipe()
    real_stdin = os.dup(0)
    os.dup2(read_end, 0)
    os.close(read_end)

    def pump() -> None:
        with os.fdopen(real_stdin, "rb") as source, os.fdopen(write_end, "wb") as sink:
            for line in source:
                try:
                    msg = orjson.loads(line)
                except orjson.JSONDecodeError:
                    msg = None
                if isinstance(msg, dict) and msg.get("method") == "server/discover":
                    if not silent and "id" in msg:
                        error = {"code": METHOD_NOT_FOUND, "message": "Method not found"}
                        reply = {"jsonrpc": "2.0", "id": msg["id"], "error": error}
                        os.write(wire_out, orjson.dumps(reply) + b"\n")
                    continue
                sink.write(line)
                sink.flush()

    threading.Thread(target=pump, daemon=True).start()


async def serve_stdio(mcp: MCPServer) -> None:
    async with anyio.create_task_group() as tg:

        async def on_sigterm() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM) as signals:
                async for _ in signals:
                    # Graceful closure: listen streams get their completion result first.
                    close_listens(mcp)
                    await anyio.sleep(0.2)
                    os._exit(0)

        tg.start_soon(on_sigterm)
        await mcp.run_stdio_async()
        tg.cancel_scope.cancel()


async def serve_http(mcp: MCPServer, port: int, json_response: bool, sse: bool = False) -> None:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    if sse:
        app = mcp.sse_app(host="127.0.0.1")
    else:
        app = mcp.streamable_http_app(json_response=json_response, host="127.0.0.1")
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1, lifespan="on")
    server = uvicorn.Server(config)

    async def announce() -> None:
        while not server.started:  # noqa: ASYNC110 - uvicorn offers no event for "started"
            await anyio.sleep(0.01)
        print(f"READY {sock.getsockname()[1]}", flush=True)

    async def end_listens_on_exit() -> None:
        # Open listen streams would hold uvicorn's graceful shutdown for its full timeout;
        # end them with their completion result as soon as shutdown begins.
        while not server.should_exit:  # noqa: ASYNC110 - uvicorn offers no event for this
            await anyio.sleep(0.05)
        close_listens(mcp)

    async with anyio.create_task_group() as tg:
        tg.start_soon(announce)
        tg.start_soon(end_listens_on_exit)
        await server.serve(sockets=[sock])
        tg.cancel_scope.cancel()
    sock.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=["stdio", "http", "sse"])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="HTTP: always application/json, no SSE")
    parser.add_argument("--page-size", type=int, default=10, help="0 disables pagination")
    parser.add_argument("--label", default="sdk", help="returned by tool label and mem://shared")
    parser.add_argument("--legacy-only", action="store_true", help="refuse the modern era")
    parser.add_argument("--silent-discover", action="store_true", help="never answer discover")
    parser.add_argument(
        "--request-state-key", help="seal requestState with this key (copies that share it)"
    )
    parser.add_argument("--record-listens", action="store_true", help="add await_listen_uri")
    args = parser.parse_args(argv)
    mcp = build_server(
        args.page_size,
        args.label,
        legacy_only=args.legacy_only or args.transport == "sse",
        silent_discover=args.silent_discover,
        request_state_key=args.request_state_key,
        record_listens=args.record_listens,
    )
    if args.transport == "stdio":
        if args.legacy_only:
            refuse_discover_on_stdin(args.silent_discover)
        anyio.run(serve_stdio, mcp)
    else:
        # uvicorn re-raises a captured SIGTERM after its graceful shutdown; a no-op
        # handler makes that re-raise harmless so the process exits with status 0.
        signal.signal(signal.SIGTERM, lambda *_: None)
        anyio.run(serve_http, mcp, args.port, args.json, args.transport == "sse")
    sys.exit(0)


if __name__ == "__main__":
    main()
