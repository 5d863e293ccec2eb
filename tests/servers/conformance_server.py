"""A dual-era server for the official conformance suite (`@modelcontextprotocol/conformance`).

Usage:
    python tests/servers/conformance_server.py stdio
    python tests/servers/conformance_server.py http --port N

Built on the `mcp` SDK's MCPServer, which speaks both eras on one endpoint: the stateful
2025-11-25 lifecycle (initialize, sessions, server-to-client requests mid-call) and the
stateless 2026-07-28 one (per-request `_meta`, `server/discover`, `input_required`).
It offers the fixtures the suite's server scenarios name (tools `test_*`, resources
`test://...`, prompts `test_*_prompt`), so the suite can measure it directly and through
the gateway. HTTP mode serves http://127.0.0.1:N/mcp and prints `READY <port>`.

HTTP mode keeps every SSE event in memory and hints `retry:` 500 ms, so `test_reconnection`
can close its stream mid-call and the client resumes it with Last-Event-ID (SEP-1699).

The `test_input_required_result_*` tools answer the 2026-07-28 multi-round flow by hand
(they read the raw `inputResponses` and return an `InputRequiredResult`); their
`requestState` is sealed by the SDK's request-state boundary, so a tampered one is
refused before the tool runs.
"""

from __future__ import annotations

import argparse
import base64
import signal
import socket
import sys
import warnings
from pathlib import Path
from typing import Annotated, Any, TypeGuard

import anyio
import orjson
import uvicorn
from mcp.server.caching import CacheHint
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.prompts.base import Message, UserMessage
from mcp.server.request_state import RequestStateSecurity
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp_types import (
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    AudioContent,
    CallToolResult,
    Completion,
    CompletionArgument,
    CompletionContext,
    EmbeddedResource,
    EmptyResult,
    ImageContent,
    InputRequiredResult,
    JSONRPCMessage,
    PromptReference,
    ResourceTemplateReference,
    SamplingMessage,
    SetLevelRequestParams,
    SubscribeRequestParams,
    TextContent,
    TextResourceContents,
    UnsubscribeRequestParams,
)
from pydantic import Field

if not __package__:
    # Run as a script (the suite's fixture): import the tasks fixtures as a package module.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.servers.conformance_tasks import TasksExtension

warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

# A 1x1 red PNG and a tiny silent WAV (44-byte header, two samples).
PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de"
        "0000000c4944415408d763f8cfc000000301010018dd8db40000000049454e44ae426082"
    )
).decode()
WAV = base64.b64encode(
    b"RIFF"
    + (40).to_bytes(4, "little")
    + b"WAVEfmt "
    + (16).to_bytes(4, "little")
    + (1).to_bytes(2, "little")
    + (1).to_bytes(2, "little")
    + (8000).to_bytes(4, "little")
    + (16000).to_bytes(4, "little")
    + (2).to_bytes(2, "little")
    + (16).to_bytes(2, "little")
    + b"data"
    + (4).to_bytes(4, "little")
    + b"\x00\x00\x00\x00"
).decode()

# The SSE `retry:` hint, in milliseconds.
RETRY_MS = 500
LEGACY_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")

SEP1034_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "default": "John Doe"},
        "age": {"type": "integer", "default": 30},
        "score": {"type": "number", "default": 95.5},
        "status": {
            "type": "string",
            "enum": ["active", "inactive", "pending"],
            "default": "active",
        },
        "verified": {"type": "boolean", "default": True},
    },
}

SEP1330_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
        "titledSingle": {
            "type": "string",
            "oneOf": [
                {"const": "value1", "title": "First Option"},
                {"const": "value2", "title": "Second Option"},
                {"const": "value3", "title": "Third Option"},
            ],
        },
        "legacyEnum": {
            "type": "string",
            "enum": ["opt1", "opt2", "opt3"],
            "enumNames": ["Option One", "Option Two", "Option Three"],
        },
        "untitledMulti": {
            "type": "array",
            "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
        },
        "titledMulti": {
            "type": "array",
            "items": {
                "anyOf": [
                    {"const": "value1", "title": "First Choice"},
                    {"const": "value2", "title": "Second Choice"},
                    {"const": "value3", "title": "Third Choice"},
                ]
            },
        },
    },
}


SCHEMA_2020_12: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "$anchor": "addressDef",
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {
        "name": {"type": "string"},
        "address": {"$ref": "#/$defs/address"},
        "contactMethod": {"type": "string", "enum": ["phone", "email"]},
        "phone": {"type": "string"},
        "email": {"type": "string"},
    },
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
    "additionalProperties": False,
}


class MemoryEventStore(EventStore):
    """Every SSE event kept in memory, so a client resumes a closed stream (SEP-1699)."""

    def __init__(self) -> None:
        self.events: list[tuple[StreamId, EventId, JSONRPCMessage | None]] = []

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        event_id = str(len(self.events) + 1)
        self.events.append((stream_id, event_id, message))
        return event_id

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        index = next((i for i, e in enumerate(self.events) if e[1] == last_event_id), None)
        if index is None:
            return None
        stream_id = self.events[index][0]
        for sid, event_id, message in self.events[index + 1 :]:
            if sid == stream_id and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream_id


def elicit_request(message: str, properties: dict[str, Any]) -> dict[str, Any]:
    schema = {"type": "object", "properties": properties, "required": sorted(properties)}
    return {
        "method": "elicitation/create",
        "params": {"message": message, "requestedSchema": schema},
    }


def sample_request(text: str, max_tokens: int) -> dict[str, Any]:
    message = {"role": "user", "content": {"type": "text", "text": text}}
    return {
        "method": "sampling/createMessage",
        "params": {"messages": [message], "maxTokens": max_tokens},
    }


ROOTS_REQUEST: dict[str, Any] = {"method": "roots/list", "params": {}}


def input_required(requests: dict[str, Any], state: str | None = None) -> InputRequiredResult:
    raw: dict[str, Any] = {"resultType": "input_required", "inputRequests": requests}
    if state is not None:
        raw["requestState"] = state
    return InputRequiredResult.model_validate(raw)


def responses(ctx: Context) -> dict[str, Any]:
    """The client's `inputResponses` as plain JSON (empty on a first round)."""
    given = ctx.input_responses or {}
    return {
        key: value.model_dump(by_alias=True, mode="json", exclude_none=True)
        if hasattr(value, "model_dump")
        else value
        for key, value in given.items()
    }


def accepted(answer: Any) -> TypeGuard[dict[str, Any]]:
    return isinstance(answer, dict) and answer.get("action") == "accept"


def text(value: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=value)])


def require_legacy(ctx: Context) -> None:
    """Server-to-client requests mid-call exist in the legacy era only."""
    if ctx.protocol_version not in LEGACY_VERSIONS:
        raise ToolError("this tool sends a server-to-client request: 2025-11-25 only")


async def complete(
    ref: PromptReference | ResourceTemplateReference,
    argument: CompletionArgument,
    context: CompletionContext | None,
) -> Completion | None:
    choices = ["paris", "park", "party"]
    values = [c for c in choices if c.startswith(argument.value)]
    return Completion(values=values, total=len(values), has_more=False)


def add_content_tools(mcp: MCPServer) -> None:
    @mcp.tool()
    def test_simple_text() -> CallToolResult:
        """Return one text block."""
        return text("This is a simple text response for testing.")

    @mcp.tool()
    def test_image_content() -> CallToolResult:
        """Return one image block (a 1x1 PNG)."""
        return CallToolResult(content=[ImageContent(type="image", data=PNG, mime_type="image/png")])

    @mcp.tool()
    def test_audio_content() -> CallToolResult:
        """Return one audio block (a tiny WAV)."""
        return CallToolResult(content=[AudioContent(type="audio", data=WAV, mime_type="audio/wav")])

    @mcp.tool()
    def test_embedded_resource() -> CallToolResult:
        """Return one embedded text resource."""
        resource = TextResourceContents(
            uri="test://embedded-resource",
            mime_type="text/plain",
            text="This is an embedded resource content.",
        )
        return CallToolResult(content=[EmbeddedResource(type="resource", resource=resource)])

    @mcp.tool()
    def test_multiple_content_types() -> CallToolResult:
        """Return text, image and embedded resource blocks."""
        resource = TextResourceContents(
            uri="test://mixed-content-resource",
            mime_type="application/json",
            text='{"test":"data","value":123}',
        )
        return CallToolResult(
            content=[
                TextContent(type="text", text="Multiple content types test:"),
                ImageContent(type="image", data=PNG, mime_type="image/png"),
                EmbeddedResource(type="resource", resource=resource),
            ]
        )

    @mcp.tool()
    def json_schema_2020_12_tool(name: str = "") -> str:
        """Tool with JSON Schema 2020-12 features"""
        return name

    # The listing shows a hand-written 2020-12 schema ($defs, $anchor, allOf/anyOf,
    # if/then/else), which no Python signature produces.
    mcp._tool_manager.get_tool("json_schema_2020_12_tool").parameters = SCHEMA_2020_12  # type: ignore[union-attr]

    @mcp.tool()
    def test_header_param(
        region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})],
    ) -> str:
        """Echo a region mirrored into the Mcp-Param-Region header (SEP-2243)."""
        return f"region: {region}"

    @mcp.tool()
    def test_error_handling() -> str:
        """Always fail with a tool error."""
        raise ToolError("This tool intentionally returns an error for testing")


def add_notifying_tools(mcp: MCPServer) -> None:
    async def three_logs(ctx: Context) -> CallToolResult:
        await ctx.info("Tool execution started")
        await anyio.sleep(0.05)
        await ctx.info("Tool processing data")
        await anyio.sleep(0.05)
        await ctx.info("Tool execution completed")
        return text("Logging tool completed")

    @mcp.tool()
    async def test_tool_with_logging(ctx: Context) -> CallToolResult:
        """Log three info messages while running."""
        return await three_logs(ctx)

    @mcp.tool()
    async def test_logging_tool(ctx: Context) -> CallToolResult:
        """Log three info messages while running (sent only at a requested log level)."""
        return await three_logs(ctx)

    @mcp.tool()
    async def test_tool_with_progress(ctx: Context) -> CallToolResult:
        """Report progress 0, 50 and 100 of 100."""
        for step in (0, 50, 100):
            await ctx.report_progress(step, 100)
            if step < 100:
                await anyio.sleep(0.05)
        return text("Progress tool completed")

    @mcp.tool()
    async def test_reconnection(ctx: Context) -> CallToolResult:
        """Close this call's SSE stream mid-call; the answer comes on the resumed one."""
        await anyio.sleep(0.05)
        await ctx.close_sse_stream()
        await anyio.sleep(0.2)
        return text("Reconnection test completed")

    @mcp.tool()
    async def test_trigger_tool_change(ctx: Context) -> CallToolResult:
        """Announce a change of the tool list."""
        await ctx.notify_tools_changed()
        return text("tools changed")

    @mcp.tool()
    async def test_trigger_prompt_change(ctx: Context) -> CallToolResult:
        """Announce a change of the prompt list."""
        await ctx.notify_prompts_changed()
        return text("prompts changed")


def add_legacy_request_tools(mcp: MCPServer) -> None:
    @mcp.tool()
    async def test_sampling(prompt: str, ctx: Context) -> CallToolResult:
        """Ask the client's LLM (sampling/createMessage) and return its answer."""
        require_legacy(ctx)
        reply = await ctx.session.create_message(
            [SamplingMessage(role="user", content=TextContent(type="text", text=prompt))],
            max_tokens=100,
            related_request_id=ctx.request_id,
        )
        content = reply.content
        answer = content.text if isinstance(content, TextContent) else str(content)
        return text(f"LLM response: {answer}")

    async def elicit(ctx: Context, message: str, schema: dict[str, Any]) -> CallToolResult:
        require_legacy(ctx)
        reply = await ctx.session.elicit_form(message, schema, related_request_id=ctx.request_id)
        content = orjson.dumps(reply.content).decode()
        return text(f"Elicitation completed: action={reply.action}, content={content}")

    @mcp.tool()
    async def test_elicitation(message: str, ctx: Context) -> CallToolResult:
        """Ask the user (elicitation/create) for a username and an email."""
        schema = {
            "type": "object",
            "properties": {
                "username": {"type": "string", "description": "User's response"},
                "email": {"type": "string", "description": "User's email address"},
            },
            "required": ["username", "email"],
        }
        return await elicit(ctx, message, schema)

    @mcp.tool()
    async def test_elicitation_sep1034_defaults(ctx: Context) -> CallToolResult:
        """Elicit a form whose fields all carry defaults (SEP-1034)."""
        return await elicit(ctx, "Please review and update the form fields", SEP1034_SCHEMA)

    @mcp.tool()
    async def test_elicitation_sep1330_enums(ctx: Context) -> CallToolResult:
        """Elicit a form with every enum variant (SEP-1330)."""
        return await elicit(ctx, "Please select your preferences", SEP1330_SCHEMA)


def add_input_required_tools(mcp: MCPServer) -> None:
    user_name = elicit_request("What is your name?", {"name": {"type": "string"}})

    @mcp.tool()
    def test_input_required_result_elicitation(ctx: Context) -> str | InputRequiredResult:
        """Ask for the user's name through an input_required result."""
        answer = responses(ctx).get("user_name")
        if not accepted(answer) or not isinstance(answer.get("content"), dict):
            return input_required({"user_name": user_name})
        return f"Hello, {answer['content'].get('name')}!"

    @mcp.tool()
    def test_input_required_result_sampling(ctx: Context) -> str | InputRequiredResult:
        """Ask the client's LLM through an input_required result."""
        answer = responses(ctx).get("capital_question")
        if not isinstance(answer, dict) or "content" not in answer:
            question = sample_request("What is the capital of France?", 100)
            return input_required({"capital_question": question})
        content = answer["content"]
        said = content.get("text", "") if isinstance(content, dict) else ""
        return f"LLM response: {said}"

    @mcp.tool()
    def test_input_required_result_list_roots(ctx: Context) -> str | InputRequiredResult:
        """Ask for the client's roots through an input_required result."""
        answer = responses(ctx).get("client_roots")
        if not isinstance(answer, dict) or not isinstance(answer.get("roots"), list):
            return input_required({"client_roots": ROOTS_REQUEST})
        uris = [r.get("uri") for r in answer["roots"] if isinstance(r, dict)]
        return f"Roots: {', '.join(str(u) for u in uris)}"

    confirm = elicit_request("Please confirm", {"ok": {"type": "boolean"}})

    @mcp.tool()
    def test_input_required_result_request_state(ctx: Context) -> str | InputRequiredResult:
        """Round 1 asks with a requestState; round 2 checks it came back."""
        if ctx.request_state == "confirm-round-1" and "confirm" in responses(ctx):
            return "state-ok: confirmed"
        return input_required({"confirm": confirm}, "confirm-round-1")

    @mcp.tool()
    def test_input_required_result_tampered_state(ctx: Context) -> str | InputRequiredResult:
        """Like request_state; the sealed state makes tampering an error."""
        if ctx.request_state == "tamper-round-1" and "confirm" in responses(ctx):
            return "state-ok"
        return input_required({"confirm": confirm}, "tamper-round-1")

    @mcp.tool()
    def test_input_required_result_multiple_inputs(ctx: Context) -> str | InputRequiredResult:
        """Ask for elicitation, sampling and roots at once."""
        wanted = {
            "user_name": user_name,
            "greeting": sample_request("Generate a greeting", 50),
            "client_roots": ROOTS_REQUEST,
        }
        given = responses(ctx)
        if ctx.request_state == "multi-1" and all(key in given for key in wanted):
            return "all inputs received"
        return input_required(wanted, "multi-1")

    @mcp.tool()
    def test_input_required_result_multi_round(ctx: Context) -> str | InputRequiredResult:
        """Two rounds of elicitation, each with its own requestState."""
        given = responses(ctx)
        if ctx.request_state == "round-2" and "step2" in given:
            return "multi-round complete"
        if ctx.request_state == "round-1" and "step1" in given:
            color = elicit_request(
                "Step 2: What is your favorite color?", {"color": {"type": "string"}}
            )
            return input_required({"step2": color}, "round-2")
        step1 = elicit_request("Step 1: What is your name?", {"name": {"type": "string"}})
        return input_required({"step1": step1}, "round-1")

    @mcp.tool()
    def test_input_required_result_capabilities(ctx: Context) -> str | InputRequiredResult:
        """Ask only for what the client declared it can answer."""
        caps = ctx.client_capabilities
        wanted: dict[str, Any] = {}
        if caps is not None and caps.sampling is not None:
            wanted["greeting"] = sample_request("Generate a greeting", 50)
        if caps is not None and caps.elicitation is not None:
            wanted["user_name"] = user_name
        given = responses(ctx)
        if not wanted or all(key in given for key in wanted):
            return "capabilities respected"
        return input_required(wanted)

    @mcp.tool()
    def test_streaming_elicitation(ctx: Context) -> str | InputRequiredResult:
        """Elicit through an input_required result (never a request on the stream)."""
        if "user_name" in responses(ctx):
            return "streamed"
        return input_required({"user_name": user_name})

    @mcp.tool()
    def test_missing_capability(ctx: Context) -> str:
        """Needs the client's sampling capability; -32021 without it."""
        caps = ctx.client_capabilities
        if caps is None or caps.sampling is None:
            raise MCPError(
                code=MISSING_REQUIRED_CLIENT_CAPABILITY,
                message="Missing required client capability: sampling",
                data={"requiredCapabilities": {"sampling": {}}},
            )
        return "sampling declared"

    @mcp.prompt()
    def test_input_required_result_prompt(ctx: Context) -> list[Message] | InputRequiredResult:
        """A prompt that needs the user's context first."""
        answer = responses(ctx).get("user_context")
        if not accepted(answer):
            question = elicit_request(
                "What context should the prompt use?", {"context": {"type": "string"}}
            )
            return input_required({"user_context": question})
        context = answer.get("content", {}).get("context", "")
        return [UserMessage(f"Prompt with context: {context}")]


def add_resources_and_prompts(mcp: MCPServer) -> None:
    @mcp.resource("test://static-text", mime_type="text/plain", description="Static text.")
    def static_text() -> str:
        return "This is the content of the static text resource."

    @mcp.resource("test://static-binary", mime_type="image/png", description="Static PNG.")
    def static_binary() -> bytes:
        return base64.b64decode(PNG)

    @mcp.resource("test://watched-resource", mime_type="text/plain", description="Watched.")
    def watched() -> str:
        return "watched"

    @mcp.resource(
        "test://template/{id}/data", mime_type="application/json", description="Per-id data."
    )
    def template(id: str) -> str:
        return orjson.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"}).decode()

    @mcp.prompt()
    def test_simple_prompt() -> str:
        """A prompt without arguments."""
        return "This is a simple prompt for testing."

    @mcp.prompt()
    def test_prompt_with_arguments(arg1: str, arg2: str) -> str:
        """A prompt with two arguments."""
        return f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"

    @mcp.prompt()
    def test_prompt_with_embedded_resource(resourceUri: str) -> list[Message]:
        """A prompt embedding the resource it is given."""
        resource = TextResourceContents(
            uri=resourceUri, mime_type="text/plain", text="Embedded resource content for testing."
        )
        return [
            UserMessage(EmbeddedResource(type="resource", resource=resource)),
            UserMessage("Please process the embedded resource above."),
        ]

    @mcp.prompt()
    def test_prompt_with_image() -> list[Message]:
        """A prompt with an image."""
        return [
            UserMessage(ImageContent(type="image", data=PNG, mime_type="image/png")),
            UserMessage("Please analyze the image above."),
        ]


def build_server() -> MCPServer:
    hint = CacheHint(ttl_ms=0, scope="private")
    mcp = MCPServer(
        "conformance-test-server",
        version="1.0.0",
        log_level="WARNING",
        request_state_security=RequestStateSecurity.ephemeral(),
        cache_hints={
            "tools/list": hint,
            "prompts/list": hint,
            "resources/list": hint,
            "resources/templates/list": hint,
            "resources/read": hint,
        },
        extensions=[TasksExtension()],
    )
    add_content_tools(mcp)
    add_notifying_tools(mcp)
    add_legacy_request_tools(mcp)
    add_input_required_tools(mcp)
    add_resources_and_prompts(mcp)
    mcp.completion()(complete)  # type: ignore[no-untyped-call]

    # 2025-11-25 resource subscriptions: accepted and tracked (nothing here changes).
    subscribed: set[str] = set()

    async def subscribe(ctx: Any, params: SubscribeRequestParams) -> EmptyResult:
        subscribed.add(str(params.uri))
        return EmptyResult()

    async def unsubscribe(ctx: Any, params: UnsubscribeRequestParams) -> EmptyResult:
        subscribed.discard(str(params.uri))
        return EmptyResult()

    lowlevel = mcp._lowlevel_server
    lowlevel.add_request_handler("resources/subscribe", SubscribeRequestParams, subscribe)
    lowlevel.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, unsubscribe)

    async def set_level(ctx: Any, params: SetLevelRequestParams) -> EmptyResult:
        return EmptyResult()

    # 2025-11-25 logging/setLevel (the SDK serves it at that era only).
    lowlevel.add_request_handler("logging/setLevel", SetLevelRequestParams, set_level)
    return mcp


async def serve_http(mcp: MCPServer, port: int) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    # An event store and a `retry:` hint: a closed stream is resumed with Last-Event-ID.
    app = mcp.streamable_http_app(
        host="127.0.0.1", event_store=MemoryEventStore(), retry_interval=RETRY_MS
    )
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1, lifespan="on")
    server = uvicorn.Server(config)

    async def announce() -> None:
        while not server.started:  # noqa: ASYNC110 - uvicorn offers no event for "started"
            await anyio.sleep(0.01)
        print(f"READY {sock.getsockname()[1]}", flush=True)

    async with anyio.create_task_group() as tg:
        tg.start_soon(announce)
        await server.serve(sockets=[sock])
        tg.cancel_scope.cancel()
    sock.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=["stdio", "http"])
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    mcp = build_server()
    if args.transport == "stdio":
        anyio.run(mcp.run_stdio_async)
    else:
        # uvicorn re-raises a captured SIGTERM after its graceful shutdown; a no-op
        # handler makes that re-raise harmless so the process exits with status 0.
        signal.signal(signal.SIGTERM, lambda *_: None)
        anyio.run(serve_http, mcp, args.port)
    sys.exit(0)


if __name__ == "__main__":
    main()
