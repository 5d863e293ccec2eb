"""Legacy clients (`initialize`, 2025-11-25) through the gateway, with the official SDK client in
legacy mode, on every front-end/back-end pairing of the parity matrix (the direct pairings show
what the SDK's own dual-era server does). basic/versioning, Backward Compatibility: a legacy
client of a dual-era server is served under the negotiated legacy revision, and sees the same
merged server a modern client does."""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import anyio
import pytest
from mcp import Client, MCPError
from mcp.client.context import ClientRequestContext
from mcp.client.session import IncomingMessage
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp_types import (
    CreateMessageRequestParams,
    CreateMessageResult,
    ElicitRequestParams,
    ElicitResult,
    ErrorData,
    TextContent,
    TextResourceContents,
)

from tests.conftest import Target
from tests.servers.sdk_server import INSTRUCTIONS
from tests.support import BOUND
from tests.system.test_parity import (
    TOOL_NAMES,
    Answers,
    ask_twice,
    cancel_a_held_call,
    connect,
    text_of,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

LEGACY_VERSIONS = {"2025-11-25", "2025-06-18", "2025-03-26"}


@asynccontextmanager
async def legacy(target: Target, **options: Any) -> AsyncIterator[Client]:
    with anyio.fail_after(3 * BOUND):
        async with Client(target.server, mode="legacy", **options) as client:
            yield client


@contextmanager
def legacy_only_method() -> Iterator[None]:
    """The SDK warns that ping, logging/setLevel and resources/subscribe left the protocol in
    2026-07-28; they are exactly what a legacy session uses."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        yield


async def test_initialize_negotiates_a_legacy_version(target: Target) -> None:
    """basic/lifecycle, Initialization: the answer names a legacy version, the server and what
    it offers."""
    async with legacy(target) as client:
        assert client.protocol_version in LEGACY_VERSIONS
        caps = client.server_capabilities
        assert caps is not None
        assert caps.tools is not None and caps.resources is not None and caps.prompts is not None
        # Through the gateway too: one backend is shown as itself (single-backend transparency).
        info = client.server_info
        assert info is not None and (info.name, info.version) == ("sdk-test-server", "1.0.0")
        assert client.instructions == INSTRUCTIONS


async def test_tools_list_paginates_to_the_same_catalog(target: Target) -> None:
    """server/utilities/pagination under a legacy session: the same tools as a modern client."""
    async with legacy(target) as client:
        names: list[str] = []
        cursor: str | None = None
        while True:
            page = await client.list_tools(cursor=cursor)
            names += [t.name for t in page.tools]
            if (cursor := page.next_cursor) is None:
                break
        assert set(names) == TOOL_NAMES and len(names) == len(TOOL_NAMES)


async def test_call_read_and_prompts(target: Target) -> None:
    """server/tools, server/resources, server/prompts under a legacy session."""
    async with legacy(target) as client:
        echoed = await client.call_tool("echo", {"text": "legacy héllo"})
        assert text_of(echoed) == "legacy héllo"
        assert (await client.call_tool("add", {"a": 1, "b": 2})).structured_content == {"result": 3}
        assert (await client.call_tool("boom")).is_error
        read = (await client.read_resource("mem://greeting")).contents[0]
        assert isinstance(read, TextResourceContents) and read.text == "hello"
        item = (await client.read_resource("mem://items/4")).contents[0]
        assert isinstance(item, TextResourceContents) and item.text == "item 4"
        got = await client.get_prompt("greet", {"name": "Ann"})
        content = got.messages[0].content
        assert isinstance(content, TextContent) and content.text == "Hello, Ann!"


async def test_unknown_resource_is_invalid_params(target: Target) -> None:
    async with legacy(target) as client:
        with pytest.raises(MCPError) as caught:
            await client.read_resource("mem://missing")
        assert caught.value.code == -32602


async def test_ping_answers_empty(target: Target) -> None:
    """basic/utilities/ping: a legacy session can ping."""
    async with legacy(target) as client:
        with legacy_only_method():
            assert (await client.send_ping()) is not None


async def test_cancelling_a_call_cancels_it_on_the_server(target: Target) -> None:
    """basic/utilities/cancellation under a legacy session: `notifications/cancelled`."""
    async with legacy(target) as client:
        assert await cancel_a_held_call(client) == "cancelled"


async def test_progress_arrives_before_the_result(target: Target) -> None:
    """basic/utilities/progress under a legacy session."""
    seen: list[tuple[float, float | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total))

    async with legacy(target) as client:
        result = await client.call_tool(
            "slow", {"seconds": 0.1, "steps": 3}, progress_callback=on_progress
        )
        assert text_of(result) == "done"
    assert seen == [(1.0, 3.0), (2.0, 3.0), (3.0, 3.0)]


async def test_logging_set_level_opts_the_session_in(target: Target) -> None:
    """server/utilities/logging (legacy): after logging/setLevel the session gets log messages
    at or above that level; the gateway turns the session's level into each forwarded
    request's per-request level."""
    if not target.through_gateway:
        pytest.skip("the SDK test server does not implement logging/setLevel")
    logs: list[Any] = []
    arrived = anyio.Event()

    async def on_log(params: Any) -> None:
        logs.append(params.data)
        arrived.set()

    async with legacy(target, logging_callback=on_log) as client:
        with legacy_only_method():
            await client.set_logging_level("info")
        result = await client.call_tool("log", {"text": "hello log"})
        assert text_of(result) == "logged"
        with anyio.fail_after(BOUND):
            await arrived.wait()
    assert logs == ["hello log"]


async def test_elicitation_round_trip(target: Target) -> None:
    """Era bridge (basic/patterns/mrtr to client/elicitation, 2025-11-25): the modern backend's
    input_required result reaches the legacy client as an `elicitation/create` request on its
    session; the answer goes back to the backend in the retry, and the call completes."""
    answers = Answers()
    async with legacy(target, elicitation_callback=answers) as client:
        await ask_twice(client, answers)


async def test_elicitation_error_from_the_client_fails_the_call(target: Target) -> None:
    """A legacy client that answers the input request with an error fails the call with it."""

    async def refuse(context: ClientRequestContext, params: ElicitRequestParams) -> ErrorData:
        return ErrorData(code=-32600, message="no elicitation here")

    async with legacy(target, elicitation_callback=refuse) as client:
        with anyio.fail_after(BOUND), pytest.raises(MCPError) as caught:
            await client.call_tool("ask", {"question": "yes?"})
    assert caught.value.code == -32600


async def model(
    context: ClientRequestContext, params: CreateMessageRequestParams
) -> CreateMessageResult:
    message = params.messages[0].content
    prompt = message.text if isinstance(message, TextContent) else "?"
    reply = TextContent(type="text", text=f"model says {prompt}")
    return CreateMessageResult(role="assistant", content=reply, model="test-model")


async def user(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
    return ElicitResult(action="accept", content={"answer": "yes"})


async def test_the_servers_own_requests_mid_call_reach_the_client(target: Target) -> None:
    """client/sampling and client/elicitation, 2025-11-25: a tool asking the client with a
    request of the server's own during the call (`create_message` with `related_request_id`,
    `ctx.elicit`), which only a legacy connection carries. The era follows the client: the
    gateway serves a legacy client of a dual-era backend in the legacy era (a backend session
    per client session over HTTP, a second child in the legacy era over stdio), so the request
    reaches the client, its answer the server, and the call completes. A modern client of the
    same gateway is still served in the modern era."""
    async with legacy(target, sampling_callback=model, elicitation_callback=user) as client:
        with anyio.fail_after(BOUND):
            sampled = await client.call_tool("sample", {"prompt": "hi"})
            assert text_of(sampled) == "sampled: model says hi"
            assert text_of(await client.call_tool("confirm", {"question": "ok?"})) == (
                "confirmed: yes"
            )
            # The other clients of the session's backend, of either era, are unaffected.
            assert text_of(await client.call_tool("echo", {"text": "legacy"})) == "legacy"
    async with connect(target) as modern:
        with anyio.fail_after(BOUND):
            assert text_of(await modern.call_tool("echo", {"text": "modern"})) == "modern"


class Changes:
    """A message handler keeping the change notifications a session receives."""

    WATCHED = ("notifications/tools/list_changed", "notifications/resources/updated")

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None]] = []
        self._arrived = anyio.Event()

    async def __call__(self, message: IncomingMessage) -> None:
        method = getattr(message, "method", None)
        if isinstance(message, Exception) or method not in self.WATCHED:
            return
        uri = getattr(message.params, "uri", None) if message.params is not None else None
        self.seen.append((str(method), None if uri is None else str(uri)))
        self._arrived.set()
        self._arrived = anyio.Event()

    async def arrival(self) -> None:
        await self._arrived.wait()


async def test_list_changes_and_resource_updates_reach_the_session(target: Target) -> None:
    """server/tools List Changed and server/resources Subscriptions, legacy era: the gateway
    relays a modern backend's changes to the session (stdout, or the session's GET stream)."""
    if not target.through_gateway:
        pytest.skip("the SDK test server does not implement resources/subscribe")
    changes = Changes()
    updated = ("notifications/resources/updated", "mem://greeting")
    async with legacy(target, message_handler=changes) as client:
        with legacy_only_method():
            await client.subscribe_resource("mem://greeting")
        with anyio.fail_after(BOUND):
            # The subscription takes effect when the gateway's watch is renewed: touch until
            # the update shows.
            while updated not in changes.seen:
                await client.call_tool("touch", {"uri": "mem://greeting"})
                with anyio.move_on_after(0.2):
                    await changes.arrival()
            await client.call_tool("change_tools", {})
            while ("notifications/tools/list_changed", None) not in changes.seen:
                await changes.arrival()
