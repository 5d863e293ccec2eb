"""The same assertions against the SDK test server directly and through the gateway, for every
front-end/back-end pairing (`target` in conftest). Spec sections are named per test."""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from mcp import Client, MCPError
from mcp.client.context import ClientRequestContext
from mcp.client.session import IncomingMessage
from mcp.client.subscriptions import ResourceUpdated, ServerEvent, Subscription, ToolsListChanged
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY
from mcp_types import (
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    ElicitRequestFormParams,
    ElicitRequestParams,
    ElicitResult,
    ErrorData,
    PromptReference,
    ResourceTemplateReference,
    TextContent,
    TextResourceContents,
)

from tests.conftest import Target
from tests.servers.sdk_server import INSTRUCTIONS
from tests.support import BOUND

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

TOOL_NAMES = {"echo", "add", "slow", "boom", "log", "whoami", "label", "getenv", "regional"}
TOOL_NAMES |= {
    "ask",
    "sample",
    "confirm",
    "change_tools",
    "touch",
    "close_listens",
    "hold",
    "was_cancelled",
}
TOOL_NAMES |= {f"t{i:02d}" for i in range(30)}


@asynccontextmanager
async def connect(target: Target, **options: Any) -> AsyncIterator[Client]:
    with anyio.fail_after(3 * BOUND):
        async with Client(target.server, **options) as client:
            yield client


def text_of(result: Any) -> str:
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


async def test_discover_reports_version_and_capabilities(target: Target) -> None:
    """server/discover (server/discover, DiscoverResult)."""
    async with connect(target) as client:
        assert client.protocol_version == "2026-07-28"
        caps = client.server_capabilities
        assert caps is not None
        assert caps.tools is not None and caps.resources is not None and caps.prompts is not None
        assert caps.completions is not None
        # Through the gateway too: one backend is shown as itself (single-backend transparency).
        info = client.server_info
        assert info is not None and (info.name, info.version) == ("sdk-test-server", "1.0.0")
        assert client.instructions == INSTRUCTIONS


async def test_tools_list_paginates_to_the_full_catalog(target: Target) -> None:
    """tools/list with cursors (server/utilities/pagination)."""
    async with connect(target) as client:
        names: list[str] = []
        cursor: str | None = None
        pages = 0
        while True:
            page = await client.list_tools(cursor=cursor)
            names += [t.name for t in page.tools]
            pages += 1
            if (cursor := page.next_cursor) is None:
                break
        assert pages == 5  # 43 tools in pages of 10
        assert set(names) == TOOL_NAMES and len(names) == len(TOOL_NAMES)


async def test_forged_cursor_is_invalid_params(target: Target) -> None:
    async with connect(target) as client:
        with pytest.raises(MCPError) as caught:
            await client.list_tools(cursor="not-a-cursor")
        assert caught.value.code == -32602


async def test_call_tool_returns_content_and_structured_content(target: Target) -> None:
    """tools/call (server/tools, Calling Tools)."""
    async with connect(target) as client:
        echoed = await client.call_tool("echo", {"text": "héllo wörld"})
        assert text_of(echoed) == "héllo wörld" and not echoed.is_error
        added = await client.call_tool("add", {"a": 2, "b": 40})
        assert added.structured_content == {"result": 42}


async def test_tool_failure_is_a_result_not_an_error(target: Target) -> None:
    async with connect(target) as client:
        result = await client.call_tool("boom")
        assert result.is_error


async def test_x_mcp_header_tool_is_callable(target: Target) -> None:
    """Custom headers from tool parameters (transports/streamable-http)."""
    async with connect(target) as client:
        await client.list_tools()
        result = await client.call_tool("regional", {"region": "eu-west", "query": "q"})
        assert text_of(result) == "eu-west:q"


async def test_resources_read_and_templates(target: Target) -> None:
    """resources/read (server/resources)."""
    async with connect(target) as client:
        listed = await client.list_resources()
        assert [str(r.uri) for r in listed.resources] == [
            "mem://greeting",
            "mem://motd",
            "mem://shared",
        ]
        assert listed.next_cursor is None
        templates = await client.list_resource_templates()
        assert [t.uri_template for t in templates.resource_templates] == [
            "mem://items/{id}",
            "mem://users/{user}/profile",
        ]
        assert templates.next_cursor is None
        read = await client.read_resource("mem://greeting")
        contents = read.contents[0]
        assert isinstance(contents, TextResourceContents) and contents.text == "hello"
        item = (await client.read_resource("mem://items/7")).contents[0]
        assert isinstance(item, TextResourceContents) and item.text == "item 7"
        motd = (await client.read_resource("mem://motd")).contents[0]
        assert isinstance(motd, TextResourceContents) and motd.text == "message of the day"
        shared = (await client.read_resource("mem://shared")).contents[0]
        assert isinstance(shared, TextResourceContents) and shared.text == "sdk"
        profile = (await client.read_resource("mem://users/ann/profile")).contents[0]
        assert isinstance(profile, TextResourceContents) and profile.text == "profile of ann"


async def test_label_tool_returns_the_server_label(target: Target) -> None:
    async with connect(target) as client:
        assert text_of(await client.call_tool("label")) == "sdk"
        assert text_of(await client.call_tool("whoami")).isdigit()


async def test_forged_cursor_on_other_lists_is_invalid_params(target: Target) -> None:
    """server/utilities/pagination: an invalid cursor is -32602 on every paginated list."""
    async with connect(target) as client:
        for list_page in (client.list_prompts, client.list_resources):
            with pytest.raises(MCPError) as caught:
                await list_page(cursor="not-a-cursor")
            assert caught.value.code == -32602
        with pytest.raises(MCPError) as caught:
            await client.list_resource_templates(cursor="not-a-cursor")
        assert caught.value.code == -32602


async def test_completion_of_prompt_and_template_arguments(target: Target) -> None:
    """completion/complete (server/utilities/completion)."""
    async with connect(target) as client:
        greet = PromptReference(name="greet")
        names = await client.complete(greet, {"name": "name", "value": "An"})
        assert names.completion.values == ["Ann", "Anna"]
        none = await client.complete(greet, {"name": "name", "value": "Z"})
        assert none.completion.values == []
        items = ResourceTemplateReference(uri="mem://items/{id}")
        ids = await client.complete(items, {"name": "id", "value": ""})
        assert ids.completion.values == ["1", "2", "3"]
        two = await client.complete(items, {"name": "id", "value": "2"})
        assert two.completion.values == ["2"]


async def test_unknown_resource_is_invalid_params(target: Target) -> None:
    """resources, Error Handling: unknown resource is -32602."""
    async with connect(target) as client:
        with pytest.raises(MCPError) as caught:
            await client.read_resource("mem://missing")
        assert caught.value.code == -32602


async def test_prompts_list_and_get(target: Target) -> None:
    """prompts/get (server/prompts)."""
    async with connect(target) as client:
        prompts = await client.list_prompts()
        assert [p.name for p in prompts.prompts] == ["greet", "farewell"]
        assert prompts.next_cursor is None
        got = await client.get_prompt("greet", {"name": "Ann"})
        content = got.messages[0].content
        assert isinstance(content, TextContent) and content.text == "Hello, Ann!"
        bye = (await client.get_prompt("farewell", {"name": "Bob"})).messages[0].content
        assert isinstance(bye, TextContent) and bye.text == "Goodbye, Bob!"


async def cancel_a_held_call(client: Client) -> str:
    """Start `hold`, cancel it once it runs, and ask the server whether it saw the cancellation:
    what a cancelled call must become on every hop (basic/utilities/cancellation; on modern
    HTTP, closing the reply stream)."""
    key = uuid.uuid4().hex
    running = anyio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        running.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(
            functools.partial(client.call_tool, "hold", {"key": key}, progress_callback=on_progress)
        )
        with anyio.fail_after(BOUND):
            await running.wait()
        tg.cancel_scope.cancel()
    with anyio.fail_after(2 * BOUND):
        return text_of(await client.call_tool("was_cancelled", {"key": key}))


async def test_cancelling_a_call_cancels_it_on_the_server(target: Target) -> None:
    async with connect(target) as client:
        assert await cancel_a_held_call(client) == "cancelled"


async def test_progress_arrives_in_order_before_the_result(target: Target) -> None:
    """basic/patterns/progress: request-scoped notifications precede the response."""
    seen: list[tuple[float, float | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total))

    async with connect(target) as client:
        result = await client.call_tool(
            "slow", {"seconds": 0.1, "steps": 3}, progress_callback=on_progress
        )
        assert text_of(result) == "done"
    assert seen == [(1.0, 3.0), (2.0, 3.0), (3.0, 3.0)]


async def test_log_messages_reach_the_request_that_asked(target: Target) -> None:
    """server/utilities/logging: per-request log level."""
    logs: list[Any] = []

    async def on_log(params: Any) -> None:
        logs.append(params.data)

    async with connect(target, log_level="info", logging_callback=on_log) as client:
        result = await client.call_tool("log", {"text": "ping"})
        assert text_of(result) == "logged"
    assert logs == ["ping"]


async def test_concurrent_clients_get_their_own_replies(target: Target) -> None:
    """Many clients, many calls in flight at once, every reply to its own caller."""
    failures: list[str] = []

    async def one_client(n: int) -> None:
        async with connect(target) as client:

            async def call(k: int) -> None:
                text = f"client{n}-call{k}"
                result = await client.call_tool("echo", {"text": text})
                if text_of(result) != text:
                    failures.append(f"{text} got {text_of(result)}")

            async with anyio.create_task_group() as tg:
                for k in range(8):
                    tg.start_soon(call, k)

    with anyio.fail_after(6 * BOUND):
        async with anyio.create_task_group() as tg:
            for n in range(4):
                tg.start_soon(one_client, n)
    assert failures == []


class Answers:
    """An elicitation callback that accepts with 42, declines "no?", and records the questions."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def __call__(
        self, context: ClientRequestContext, params: ElicitRequestParams
    ) -> ElicitResult | ErrorData:
        assert isinstance(params, ElicitRequestFormParams)
        self.asked.append(params.message)
        if params.message == "no?":
            return ElicitResult(action="decline")
        return ElicitResult(action="accept", content={"answer": "42"})


async def ask_twice(client: Client, answers: Answers) -> None:
    """The `ask` tool, answered and declined: the two results the client must see."""
    with anyio.fail_after(BOUND):
        assert text_of(await client.call_tool("ask", {"question": "yes?"})) == "answer: 42"
        assert text_of(await client.call_tool("ask", {"question": "no?"})) == "declined"
    assert answers.asked == ["yes?", "no?"]


async def test_elicitation_round_trip(target: Target) -> None:
    """basic/patterns/mrtr and client/elicitation: the input_required result reaches the client
    untouched, its retry (inputResponses + requestState) reaches the same backend, and the
    client's declared capabilities reach the backend."""
    answers = Answers()
    async with connect(target, elicitation_callback=answers) as client:
        await ask_twice(client, answers)


async def test_elicitation_without_the_capability_is_refused(target: Target) -> None:
    """basic/patterns/mrtr: a client that does not declare elicitation gets -32021."""
    async with connect(target) as client:
        with anyio.fail_after(BOUND), pytest.raises(MCPError) as caught:
            await client.call_tool("ask", {"question": "yes?"})
    assert caught.value.code == MISSING_REQUIRED_CLIENT_CAPABILITY == -32021
    assert caught.value.data["requiredCapabilities"] == {"elicitation": {"form": {}}}


Frame = tuple[object, str, str | None]
"""A stamped notification as received: (subscriptionId, method, uri)."""


class StampedFrames:
    """A message_handler recording every notification stamped with a subscriptionId, so the
    tests see what arrived on the wire, before the SDK's per-listen filter drops anything."""

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self._arrived = anyio.Event()

    async def __call__(self, message: IncomingMessage) -> None:
        if isinstance(message, Exception) or message.params is None:
            return
        meta = message.params.meta or {}
        if SUBSCRIPTION_ID_META_KEY in meta:
            uri = getattr(message.params, "uri", None)
            self.frames.append((meta[SUBSCRIPTION_ID_META_KEY], message.method, uri))
            self._arrived.set()
            self._arrived = anyio.Event()

    async def wait_for(self, frame: Frame, count: int = 1) -> None:
        with anyio.fail_after(BOUND):
            while self.frames.count(frame) < count:
                await self._arrived.wait()


async def next_events(sub: Subscription, until: ServerEvent) -> list[ServerEvent]:
    """Every event up to and including `until`, bounded by BOUND."""
    seen: list[ServerEvent] = []
    with anyio.fail_after(BOUND):
        async for event in sub:
            seen.append(event)
            if event == until:
                return seen
    raise AssertionError(f"the stream ended before {until!r}; got {seen!r}")


TOOLS_CHANGED = "notifications/tools/list_changed"
UPDATED = "notifications/resources/updated"


async def test_listen_delivers_list_changes_and_resource_updates(target: Target) -> None:
    """basic/patterns/subscriptions: the acknowledged filter, then exactly the events it covers."""
    motd = ResourceUpdated(uri="mem://motd")
    wire = StampedFrames()
    async with connect(target, message_handler=wire) as client:
        with anyio.fail_after(BOUND):
            listening = client.listen(
                tools_list_changed=True, resource_subscriptions=["mem://motd"]
            )
            async with listening as sub:
                assert sub.honored.tools_list_changed is True
                assert sub.honored.resource_subscriptions == ["mem://motd"]
                await client.call_tool("change_tools", {})
                # The unsubscribed URI first: had it been delivered, it would precede motd.
                await client.call_tool("touch", {"uri": "mem://greeting"})
                await client.call_tool("touch", {"uri": "mem://motd"})
                seen = await next_events(sub, motd)
                if ToolsListChanged() not in seen:
                    seen += await next_events(sub, ToolsListChanged())
                assert sorted(map(repr, seen)) == sorted(map(repr, [ToolsListChanged(), motd]))
                # A sentinel: nothing else (no duplicate, no greeting) was queued before it.
                await client.call_tool("touch", {"uri": "mem://motd"})
                assert await next_events(sub, motd) == [motd]
                sid = sub.subscription_id
                await wire.wait_for((sid, UPDATED, "mem://motd"), count=2)
    assert sorted(wire.frames, key=repr) == [
        (sid, UPDATED, "mem://motd"),
        (sid, UPDATED, "mem://motd"),
        (sid, TOOLS_CHANGED, None),
    ]


async def test_two_listens_on_one_client_are_kept_apart(target: Target) -> None:
    """basic/patterns/subscriptions: each stream gets only what its own filter asked for,
    stamped with its own subscriptionId."""
    motd = ResourceUpdated(uri="mem://motd")
    wire = StampedFrames()
    async with connect(target, message_handler=wire) as client:
        with anyio.fail_after(BOUND):
            async with (
                client.listen(tools_list_changed=True) as tools,
                client.listen(resource_subscriptions=["mem://motd"]) as resources,
            ):
                assert tools.honored.tools_list_changed is True
                assert not tools.honored.resource_subscriptions
                assert resources.honored.resource_subscriptions == ["mem://motd"]
                assert not resources.honored.tools_list_changed
                await client.call_tool("touch", {"uri": "mem://motd"})
                assert await next_events(resources, motd) == [motd]
                await client.call_tool("change_tools", {})
                assert await next_events(tools, ToolsListChanged()) == [ToolsListChanged()]
                # Sentinels: had the other stream been sent either event, it would come first.
                await client.call_tool("touch", {"uri": "mem://motd"})
                assert await next_events(resources, motd) == [motd]
                await client.call_tool("change_tools", {})
                assert await next_events(tools, ToolsListChanged()) == [ToolsListChanged()]
                await wire.wait_for((resources.subscription_id, UPDATED, "mem://motd"), count=2)
                await wire.wait_for((tools.subscription_id, TOOLS_CHANGED, None), count=2)
    assert sorted(wire.frames, key=repr) == sorted(
        [(resources.subscription_id, UPDATED, "mem://motd")] * 2
        + [(tools.subscription_id, TOOLS_CHANGED, None)] * 2,
        key=repr,
    )
