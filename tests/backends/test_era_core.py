"""The era layer against an in-memory `Link` (no sockets): the probe's verdicts, the
translation to a legacy session, and a call held for client input (basic/versioning, Backward
Compatibility with Initialization-Based Versions; basic/patterns/mrtr)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gateway.backends.base import GATEWAY_CALL, Call, NotificationSink
from gateway.backends.era import held, probe
from gateway.backends.era.layer import EraBackend
from gateway.backends.era.link import SessionLink
from gateway.config.model import BackendConfig, HttpTarget
from gateway.errors import BackendTimeout, Refused
from gateway.origin import LegacyClient, Origin
from gateway.protocol import codes, meta
from gateway.protocol.jsonrpc import Message

pytestmark = pytest.mark.anyio
BOUND = 5.0

Handler = Callable[["FakeLink", Message, NotificationSink], Awaitable[Message]]


def initialize_result(version: str = "2025-11-25") -> dict[str, Any]:
    return {
        "protocolVersion": version,
        "capabilities": {"tools": {}},
        "serverInfo": {"name": "fake", "version": "1"},
    }


class FakeLink(SessionLink):
    """A transport in memory: each request goes to `handler`; what the era layer sends outside
    requests (answers to the server's questions, notifications) is kept in `sent`. Like HTTP,
    it keeps a legacy session of its own, with no GET stream (so none to wait for)."""

    def __init__(self, handler: Handler) -> None:
        self.name = "fake"
        self.transport = "http"
        self.on_notification: Callable[[str, Message], None] | None = None
        self.takes_requests = False
        self.handler = handler
        self.received: list[Message] = []
        self.sent: list[Message] = []
        self.answers: dict[object, asyncio.Future[Message]] = {}
        self.ended = asyncio.Event()
        self.stream_ready = asyncio.Event()
        self.stream_ready.set()

    @property
    def up(self) -> bool:
        return True

    async def run(self) -> None:
        await asyncio.Event().wait()

    async def request(
        self,
        msg: Message,
        sink: NotificationSink,
        call: Call,
        *,
        long_lived: bool = False,
        wants_logs: bool | None = None,
    ) -> Message:
        return await self.exchange(msg, sink, None, wants_logs=wants_logs)

    async def exchange(
        self,
        msg: Message,
        sink: NotificationSink,
        within: float | None,
        *,
        wants_logs: bool | None = None,
    ) -> Message:
        self.received.append(msg)
        reply = await self.handler(self, msg, sink)
        return {"jsonrpc": "2.0", "id": msg["id"], **reply}

    async def notify(self, msg: Message) -> None:
        self.sent.append(msg)

    def begin_session(self) -> None:
        return None

    def agreed(self, version: str) -> None:
        return None

    def forget_session(self) -> None:
        return None

    async def end_session(self) -> None:
        self.ended.set()

    async def watch(self, deliver: Callable[[str, Message], None]) -> bool:
        return False

    async def send(self, msg: Message, call: Call) -> None:
        self.sent.append(msg)
        future = self.answers.get(msg.get("id"))
        if future is not None and "method" not in msg:
            future.set_result(msg)

    async def ask(self, sink: NotificationSink, question: Message) -> Message:
        """The server's own request during a call, and the client's answer to it."""
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self.answers[question["id"]] = future
        await sink(question)
        return await asyncio.wait_for(future, BOUND)


def era_over(
    link: FakeLink, era: str = "auto", lane: Callable[[], FakeLink] | None = None
) -> EraBackend:
    config = BackendConfig("fake", HttpTarget("http://127.0.0.1:1/mcp"), era=era)
    return EraBackend(link, config, lane)


def modern_request(id_: int, method: str, params: dict[str, Any] | None = None) -> Message:
    fields = {
        meta.PROTOCOL_VERSION: meta.MODERN_VERSION,
        meta.CLIENT_INFO: {"name": "t", "version": "1"},
        meta.CLIENT_CAPABILITIES: {"elicitation": {}},
    }
    return {
        "jsonrpc": "2.0",
        "id": id_,
        "method": method,
        "params": {**(params or {}), "_meta": fields},
    }


async def ignore(_: Message) -> None:
    return None


# --- the probe ------------------------------------------------------------------------------


async def answer_discover_with(reply: Message) -> str:
    async def handler(_: FakeLink, msg: Message, sink: NotificationSink) -> Message:
        assert msg["method"] == "server/discover"
        return reply

    era, _ = await probe.probe(FakeLink(handler), channel=False, within=1.0)
    return era


async def test_a_discover_result_is_modern() -> None:
    assert await answer_discover_with({"result": {"supportedVersions": ["2026-07-28"]}}) == "modern"


async def test_an_unsupported_version_error_naming_versions_is_modern() -> None:
    error = {
        "code": codes.UNSUPPORTED_PROTOCOL_VERSION,
        "message": "no",
        "data": {"supported": ["2026-07-28"], "requested": "x"},
    }
    assert await answer_discover_with({"error": error}) == "modern"


async def test_any_other_error_is_legacy() -> None:
    error = {"code": codes.METHOD_NOT_FOUND, "message": "no"}
    assert await answer_discover_with({"error": error}) == "legacy"
    # The version error without the versions it supports proves nothing.
    bare = {"code": codes.UNSUPPORTED_PROTOCOL_VERSION, "message": "no"}
    assert await answer_discover_with({"error": bare}) == "legacy"


async def test_silence_is_legacy() -> None:
    async def handler(_: FakeLink, msg: Message, sink: NotificationSink) -> Message:
        raise BackendTimeout("fake", "no reply")

    assert await probe.probe(FakeLink(handler), channel=False, within=1.0) == ("legacy", None)


# --- a legacy session -----------------------------------------------------------------------


def legacy_server(tools: Handler | None = None) -> Handler:
    async def handler(link: FakeLink, msg: Message, sink: NotificationSink) -> Message:
        method = msg["method"]
        if method == "server/discover":
            return {"error": {"code": codes.METHOD_NOT_FOUND, "message": "unknown"}}
        if method == "initialize":
            return {"result": initialize_result()}
        if method == "tools/call" and tools is not None:
            return await tools(link, msg, sink)
        return {"result": {"tools": []}}

    return handler


async def test_a_legacy_backend_is_opened_and_spoken_to_in_its_era() -> None:
    link = FakeLink(legacy_server())
    backend = era_over(link)
    msg = modern_request(1, "tools/list")
    msg["params"]["_meta"]["traceparent"] = "00-abc"
    reply = await backend.request(msg, ignore, GATEWAY_CALL)
    assert backend.era == "legacy" and backend.session is not None
    assert [m["method"] for m in link.received] == ["server/discover", "initialize", "tools/list"]
    assert link.sent[0]["method"] == "notifications/initialized"
    sent = link.received[-1]
    # The modern per-request fields are gone (the session carries them); others stay.
    assert sent["params"] == {"_meta": {"traceparent": "00-abc"}}
    assert sent["id"] == 1  # ids on the backend's session are the transport's (ids.py)
    assert reply["id"] == 1 and reply["result"] == {"tools": [], "resultType": "complete"}


async def test_discover_is_answered_from_the_initialize_result() -> None:
    link = FakeLink(legacy_server())
    backend = era_over(link, "legacy")
    reply = await backend.request(modern_request(2, "server/discover"), ignore, GATEWAY_CALL)
    result = reply["result"]
    assert result["supportedVersions"] == [meta.MODERN_VERSION]
    assert result["_meta"][meta.SERVER_INFO]["name"] == "fake"
    assert "server/discover" not in [m["method"] for m in link.received]


# --- a held call ----------------------------------------------------------------------------

QUESTION: Message = {
    "jsonrpc": "2.0",
    "id": "q1",
    "method": "elicitation/create",
    "params": {"message": "name?", "requestedSchema": {"type": "object"}},
}


async def eliciting_tool(link: FakeLink, msg: Message, sink: NotificationSink) -> Message:
    answer = await link.ask(sink, QUESTION)
    return {"result": {"content": [{"type": "text", "text": str(answer["result"])}]}}


def as_caller(authorization: str) -> Call:
    return Call(Origin("http", headers={"Authorization": authorization}))


ALICE = as_caller("alice")


async def start_held_call() -> tuple[FakeLink, EraBackend, Message]:
    """A call held for alice's answer."""
    link = FakeLink(legacy_server(eliciting_tool))
    backend = era_over(link, "legacy")
    reply = await asyncio.wait_for(
        backend.request(modern_request(3, "tools/call"), ignore, ALICE), BOUND
    )
    return link, backend, reply


async def test_a_question_mid_call_becomes_input_required_and_the_retry_answers_it() -> None:
    link, backend, reply = await start_held_call()
    result = reply["result"]
    assert result["resultType"] == "input_required"
    [(key, ask)] = result["inputRequests"].items()
    assert ask == {"method": "elicitation/create", "params": QUESTION["params"]}
    retry = modern_request(
        4,
        "tools/call",
        {"inputResponses": {key: {"action": "accept"}}, "requestState": result["requestState"]},
    )
    final = await asyncio.wait_for(backend.request(retry, ignore, ALICE), BOUND)
    assert link.sent[-1] == {"jsonrpc": "2.0", "id": "q1", "result": {"action": "accept"}}
    assert final["id"] == 4
    assert final["result"]["resultType"] == "complete"
    assert final["result"]["content"][0]["text"] == "{'action': 'accept'}"


async def test_another_caller_cannot_resume_a_held_call() -> None:
    _, backend, reply = await start_held_call()
    state = reply["result"]["requestState"]
    mallory = as_caller("mallory")
    retry = modern_request(5, "tools/call", {"inputResponses": {}, "requestState": state})
    with pytest.raises(Refused) as refused:
        await backend.request(retry, ignore, mallory)
    assert refused.value.code == codes.INVALID_PARAMS


async def test_an_expired_state_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    _, backend, reply = await start_held_call()
    state = reply["result"]["requestState"]
    later = time.time() + held.HOLD_TTL + 1
    monkeypatch.setattr(time, "time", lambda: later)
    retry = modern_request(6, "tools/call", {"inputResponses": {}, "requestState": state})
    with pytest.raises(Refused) as refused:
        await backend.request(retry, ignore, ALICE)
    assert refused.value.code == codes.INVALID_PARAMS


async def test_a_client_without_the_capability_is_told_what_it_lacks() -> None:
    link = FakeLink(legacy_server(eliciting_tool))
    backend = era_over(link, "legacy")
    msg = modern_request(7, "tools/call")
    msg["params"]["_meta"][meta.CLIENT_CAPABILITIES] = {}
    reply = await asyncio.wait_for(backend.request(msg, ignore, GATEWAY_CALL), BOUND)
    assert reply["error"]["code"] == codes.MISSING_REQUIRED_CLIENT_CAPABILITY
    assert reply["error"]["data"]["requiredCapabilities"] == {"elicitation": {"form": {}}}
    refusals = [m for m in link.sent if m.get("id") == "q1"]
    assert refusals[0]["error"]["code"] == codes.METHOD_NOT_FOUND  # the backend is told too


# --- both eras on one backend (dual.py) -----------------------------------------------------


async def modern_server(link: FakeLink, msg: Message, sink: NotificationSink) -> Message:
    if msg["method"] == "server/discover":
        return {"result": {"resultType": "complete", "supportedVersions": [meta.MODERN_VERSION]}}
    return {"result": {"resultType": "complete", "content": [{"type": "text", "text": "modern"}]}}


def refusing_initialize(inner: Handler) -> Handler:
    async def handler(link: FakeLink, msg: Message, sink: NotificationSink) -> Message:
        if msg["method"] == "initialize":
            return {"error": {"code": codes.INVALID_REQUEST, "message": "modern only"}}
        return await inner(link, msg, sink)

    return handler


class Lanes:
    """The links a dual-era backend makes for legacy sessions, each a legacy server."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.made: list[FakeLink] = []

    def __call__(self) -> FakeLink:
        link = FakeLink(self.handler)
        self.made.append(link)
        return link


def from_legacy_client(client: LegacyClient | None, authorization: str = "alice") -> Call:
    return Call(Origin("http", headers={"Authorization": authorization}, legacy=client))


def methods(link: FakeLink) -> list[str]:
    return [m["method"] for m in link.received]


async def test_each_legacy_client_gets_a_legacy_session_and_modern_ones_stay_modern() -> None:
    lanes = Lanes(legacy_server())
    main = FakeLink(modern_server)
    backend = era_over(main, lane=lanes)
    first, second = LegacyClient(), LegacyClient()
    caller = from_legacy_client(first)
    await backend.request(modern_request(1, "tools/list"), ignore, caller)
    await backend.request(modern_request(2, "tools/list"), ignore, caller)
    caller = from_legacy_client(second)
    await backend.request(modern_request(3, "tools/list"), ignore, caller)
    caller = from_legacy_client(None)
    await backend.request(modern_request(4, "tools/list"), ignore, caller)
    assert len(lanes.made) == 2  # one per client session, reused by its next request
    assert methods(lanes.made[0]) == ["initialize", "tools/list", "tools/list"]
    assert methods(lanes.made[1]) == ["initialize", "tools/list"]
    assert methods(main) == ["server/discover", "tools/list"]
    # In the legacy era: the modern per-request fields do not travel.
    assert "_meta" not in lanes.made[0].received[1]["params"]


async def test_discovery_stays_modern_for_a_legacy_client() -> None:
    lanes = Lanes(legacy_server())
    main = FakeLink(modern_server)
    backend = era_over(main, lane=lanes)
    caller = from_legacy_client(LegacyClient())
    reply = await backend.request(modern_request(1, "server/discover"), ignore, caller)
    assert reply["result"]["supportedVersions"] == [meta.MODERN_VERSION]
    assert lanes.made == []


async def test_a_legacy_clients_watch_stays_modern_over_http() -> None:
    """One server process: its modern listen hears what the client's legacy session does."""
    lanes = Lanes(legacy_server())
    main = FakeLink(modern_server)
    backend = era_over(main, lane=lanes)
    caller = from_legacy_client(LegacyClient())
    await backend.request(
        modern_request(1, "subscriptions/listen"), ignore, caller, long_lived=True
    )
    assert lanes.made == [] and methods(main) == ["server/discover", "subscriptions/listen"]


async def test_the_legacy_session_ends_with_the_client_session() -> None:
    lanes = Lanes(legacy_server())
    backend = era_over(FakeLink(modern_server), lane=lanes)
    client = LegacyClient()
    caller = from_legacy_client(client)
    await backend.request(modern_request(1, "tools/list"), ignore, caller)
    client.close()
    await asyncio.wait_for(lanes.made[0].ended.wait(), BOUND)
    # The next session of that client (a new one) gets a new backend session.
    again = LegacyClient()
    caller = from_legacy_client(again)
    await backend.request(modern_request(2, "tools/list"), ignore, caller)
    assert len(lanes.made) == 2


async def test_a_backend_refusing_initialize_serves_legacy_clients_in_the_modern_era() -> None:
    lanes = Lanes(refusing_initialize(legacy_server()))
    main = FakeLink(modern_server)
    backend = era_over(main, lane=lanes)
    caller = from_legacy_client(LegacyClient())
    reply = await backend.request(modern_request(1, "tools/call"), ignore, caller)
    caller = from_legacy_client(LegacyClient())
    await backend.request(modern_request(2, "tools/call"), ignore, caller)
    assert reply["result"]["content"][0]["text"] == "modern"
    assert len(lanes.made) == 1  # learnt once, remembered
    assert methods(main) == ["server/discover", "tools/call", "tools/call"]


async def test_a_question_on_a_legacy_clients_session_is_held_for_that_client() -> None:
    """The server's request mid-call, on the client's own legacy session, becomes
    input_required; the retry from that client answers it on that session."""
    lanes = Lanes(legacy_server(eliciting_tool))
    backend = era_over(FakeLink(modern_server), lane=lanes)
    client = LegacyClient()
    caller = from_legacy_client(client)
    first = await asyncio.wait_for(
        backend.request(modern_request(1, "tools/call"), ignore, caller), BOUND
    )
    result = first["result"]
    assert result["resultType"] == "input_required"
    [key] = result["inputRequests"]
    retry = modern_request(
        2,
        "tools/call",
        {"inputResponses": {key: {"action": "accept"}}, "requestState": result["requestState"]},
    )
    final = await asyncio.wait_for(backend.request(retry, ignore, caller), BOUND)
    assert final["result"]["resultType"] == "complete"
    [lane] = lanes.made
    assert {"jsonrpc": "2.0", "id": "q1", "result": {"action": "accept"}} in lane.sent
