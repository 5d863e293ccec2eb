"""Long-lived streams through the gateway, in raw protocol: `subscriptions/listen` streams of many
clients next to long calls with progress (basic/patterns/subscriptions, basic/patterns/progress),
SSE keep-alive comments on quiet listen streams and graceful completion at shutdown
(basic/transports/streamable-http, Receiving Messages), and cancelling a listen on stdio
(basic/transports/streamable-http, Cancellation; basic/patterns/cancellation).
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import anyio.abc
import orjson
import pytest
import yaml
from anyio.streams.buffered import BufferedByteReceiveStream

from gateway.app import Gateway
from gateway.config import parse
from gateway.frontends import replies
from tests.support import (
    BOUND,
    ROOT,
    START_BOUND,
    call,
    gateway_command,
    messages,
    mirrored_headers,
    request,
    sdk_stdio_command,
    stdio_backend,
    write_config,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

Message = dict[str, Any]
RequestId = int | str

SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
ACKNOWLEDGED = "notifications/subscriptions/acknowledged"
TOOLS_CHANGED = "notifications/tools/list_changed"
PROGRESS = "notifications/progress"
TOOLS_ONLY = {"toolsListChanged": True}

CLIENTS = 50
SLOW_STEPS = 3
# The whole fifty-client test, gateway and backend start-up included.
FIFTY_BOUND = 30.0


# --- requests and HTTP -------------------------------------------------------------------------


def listen(rid: RequestId, notifications: dict[str, Any] | None = None) -> Message:
    return request(rid, "subscriptions/listen", {"notifications": notifications or TOOLS_ONLY})


def post(session: aiohttp.ClientSession, url: str, msg: Message) -> Any:
    """`session.post` of one JSON-RPC message, to be used as `async with`."""
    return session.post(url, data=orjson.dumps(msg), headers=mirrored_headers(msg))


async def ask(session: aiohttp.ClientSession, url: str, msg: Message) -> Message:
    """The final reply to `msg`; notifications on the way are skipped."""
    async with post(session, url, msg) as resp:
        async for item in messages(resp):
            if "method" not in item:
                assert item.get("id") == msg["id"], item
                return item
    raise AssertionError(f"no reply to {msg['id']!r}")


def http_config_text() -> str:
    backends = {"sdk": stdio_backend(sdk_stdio_command())}
    return yaml.safe_dump(
        {"listen": {"http": {"host": "127.0.0.1", "port": 0}}, "backends": backends}
    )


# --- checks on messages ------------------------------------------------------------------------


def subscription_of(msg: Message) -> object:
    part = msg.get("params") if "method" in msg else msg.get("result")
    if not isinstance(part, dict):
        return None
    part_meta = part.get("_meta")
    return part_meta.get(SUBSCRIPTION_ID) if isinstance(part_meta, dict) else None


def carried_ids(msg: Message) -> list[object]:
    """Every request id, progress token and subscription id `msg` carries."""
    params = msg.get("params")
    token = params.get("progressToken") if isinstance(params, dict) else None
    return [v for v in (msg.get("id"), token, subscription_of(msg)) if v is not None]


def assert_acknowledged(msg: Message, sub_id: RequestId) -> None:
    assert msg == {
        "jsonrpc": "2.0",
        "method": ACKNOWLEDGED,
        "params": {"_meta": {SUBSCRIPTION_ID: sub_id}, "notifications": TOOLS_ONLY},
    }, msg


def assert_tools_changed(msg: Message, sub_id: RequestId) -> None:
    assert msg.get("method") == TOOLS_CHANGED, msg
    assert subscription_of(msg) == sub_id, msg
    assert "id" not in msg, msg


def assert_completed(msg: Message, sub_id: RequestId) -> None:
    """The graceful end of a listen (subscriptions, Graceful Closure)."""
    assert msg.get("id") == sub_id, msg
    assert "error" not in msg, msg
    result = msg.get("result")
    assert isinstance(result, dict), msg
    assert result.get("resultType") == "complete", msg
    assert subscription_of(msg) == sub_id, msg
    assert set(result) <= {"resultType", "_meta"}, msg


# --- 1. fifty clients --------------------------------------------------------------------------


@dataclass
class Client:
    index: int
    listen_id: RequestId
    call_id: RequestId
    token: RequestId
    on_listen: list[Message] = field(default_factory=list)
    on_call: list[Message] = field(default_factory=list)
    acknowledged: anyio.Event = field(default_factory=anyio.Event)
    changed: anyio.Event = field(default_factory=anyio.Event)
    called: anyio.Event = field(default_factory=anyio.Event)

    @classmethod
    def numbered(cls, i: int) -> Client:
        # Odd clients use small integers for the call id and the progress token: the gateway
        # numbers its own requests to the backend 1, 2, 3..., so a token it forgot to map would
        # land on somebody else's request. Every third listen id is an integer too.
        small = i % 2 == 1
        return cls(
            index=i,
            listen_id=5000 + i if i % 3 == 0 else f"listen-{i}",
            call_id=i if small else f"call-{i}",
            token=i if small else f"tok-{i}",
        )

    @property
    def own(self) -> set[object]:
        return {self.listen_id, self.call_id, self.token}

    async def run(self, session: aiohttp.ClientSession, url: str) -> None:
        async with (
            anyio.create_task_group() as tg,
            post(session, url, listen(self.listen_id)) as resp,
        ):
            stream = messages(resp)
            self.on_listen.append(await anext(stream))
            self.acknowledged.set()
            tg.start_soon(self.slow_call, session, url)
            async for msg in stream:
                self.on_listen.append(msg)
                if msg.get("method") == TOOLS_CHANGED:
                    self.changed.set()

    async def slow_call(self, session: aiohttp.ClientSession, url: str) -> None:
        msg = call(self.call_id, "slow", token=self.token, seconds=1.0, steps=SLOW_STEPS)
        async with post(session, url, msg) as resp:
            async for item in messages(resp):
                self.on_call.append(item)
        self.called.set()

    def check(self) -> None:
        for msg in self.on_listen + self.on_call:
            foreign = [v for v in carried_ids(msg) if v not in self.own]
            assert not foreign, f"client {self.index} got another client's {foreign}: {msg}"
        assert len(self.on_listen) == 3, self.on_listen
        acknowledgement, changed, completion = self.on_listen
        assert_acknowledged(acknowledgement, self.listen_id)
        assert_tools_changed(changed, self.listen_id)
        assert_completed(completion, self.listen_id)

        assert len(self.on_call) == SLOW_STEPS + 1, self.on_call
        *progress, reply = self.on_call
        for note in progress:
            assert note.get("method") == PROGRESS, note
            assert note["params"]["progressToken"] == self.token, note
        assert [p["params"]["progress"] for p in progress] == [1, 2, 3], progress
        assert reply.get("id") == self.call_id, reply
        assert reply["result"]["content"][0]["text"] == "done", reply


async def test_fifty_clients_with_listens_and_long_calls_stay_apart() -> None:
    clients = [Client.numbered(i) for i in range(CLIENTS)]
    # One connection for each listen and each call at once (aiohttp's default pool holds 100).
    connector = aiohttp.TCPConnector(limit=0)
    with anyio.fail_after(FIFTY_BOUND):
        async with (
            Gateway(parse(http_config_text())) as gw,
            aiohttp.ClientSession(connector=connector) as session,
        ):
            url = gw.http_url
            assert url is not None
            async with anyio.create_task_group() as tg:
                for client in clients:
                    tg.start_soon(client.run, session, url)
                for client in clients:
                    await client.acknowledged.wait()
                changed = await ask(session, url, call("change", "change_tools"))
                assert changed["result"]["content"][0]["text"] == "dummy absent", changed
                for client in clients:
                    await client.changed.wait()
                    await client.called.wait()
                # Every listen now ends with its completion (the shutdown path, without
                # stopping the gateway), so each stream is known to its end.
                gw.dispatcher.close_streams()
            assert gw.dispatcher.subscriptions.active == 0
    for client in clients:
        client.check()


# --- 2. keep-alive comments --------------------------------------------------------------------


async def test_quiet_listen_stream_gets_keepalive_comments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Keep-alives begin once the JSON window closes, then come every interval.
    monkeypatch.setattr(replies, "JSON_WINDOW", 0.05)
    monkeypatch.setattr(replies, "KEEPALIVE_INTERVAL", 0.05)
    with anyio.fail_after(START_BOUND):
        async with (
            Gateway(parse(http_config_text())) as gw,
            aiohttp.ClientSession() as session,
        ):
            assert gw.http_url is not None
            # Ready first: while the backend starts, keep-alives would precede the ack.
            await gw.catalogs_loaded.wait()
            async with post(session, gw.http_url, listen("quiet")) as resp:
                assert resp.status == 200
                assert resp.content_type == "text/event-stream"
                data: list[bytes] = []
                # The acknowledgement event: its data lines, up to the blank line ending it.
                while (line := (await resp.content.readline()).rstrip(b"\r\n")) or not data:
                    assert line, "the stream ended before the acknowledgement"
                    if line.startswith(b"data:"):
                        data.append(line[5:].removeprefix(b" "))
                assert_acknowledged(orjson.loads(b"\n".join(data)), "quiet")
                # Nothing happens on the backend: only comments may follow, and one must.
                while not (line := await resp.content.readline()).startswith(b":"):
                    assert line, "the stream ended without a keep-alive comment"
                    assert not line.strip(b"\r\n"), f"not a comment: {line!r}"


# --- 3. graceful end at shutdown, HTTP ---------------------------------------------------------


async def test_shutdown_ends_listen_streams_gracefully_over_http() -> None:
    stop = anyio.Event()
    stopped = anyio.Event()

    async def serve(*, task_status: anyio.abc.TaskStatus[str]) -> None:
        try:
            async with Gateway(parse(http_config_text())) as gw:
                assert gw.http_url is not None
                task_status.started(gw.http_url)
                await stop.wait()
        finally:
            stopped.set()

    listen_id = "listen-shutdown"
    after_ack: list[Message] = []
    async with anyio.create_task_group() as tg, aiohttp.ClientSession() as session:
        with anyio.fail_after(START_BOUND):
            url: str = await tg.start(serve)
        with anyio.fail_after(BOUND):
            async with post(session, url, listen(listen_id)) as resp:
                stream = messages(resp)
                assert_acknowledged(await anext(stream), listen_id)
                stop.set()  # the gateway leaves its `async with` while we keep reading
                async for msg in stream:  # ends when the body ends
                    after_ack.append(msg)
            await stopped.wait()
    assert len(after_ack) == 1, after_ack
    assert_completed(after_ack[0], listen_id)


# --- 4 and 5. a gateway process with a stdio front end -----------------------------------------


class StdioGateway:
    """A gateway process spoken to in raw lines; every stdout line read is kept in `seen`."""

    def __init__(self, proc: anyio.abc.Process, log: Path) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self.proc = proc
        self.log = log
        self._stdin = proc.stdin
        self._stdout = BufferedByteReceiveStream(proc.stdout)
        self.seen: list[Message] = []

    async def send(self, msg: Message) -> None:
        await self._stdin.send(orjson.dumps(msg) + b"\n")

    async def read(self) -> Message | None:
        """The next stdout line, parsed; None at the end of stdout."""
        try:
            line = await self._stdout.receive_until(b"\n", 1 << 24)
        except (anyio.EndOfStream, anyio.IncompleteRead):
            return None
        msg: Message = orjson.loads(line)
        self.seen.append(msg)
        return msg

    async def until(self, match: Callable[[Message], bool]) -> Message:
        """The first line, already read or still to come, that `match`es."""
        for old in self.seen:
            if match(old):
                return old
        while (msg := await self.read()) is not None:
            if match(msg):
                return msg
        raise AssertionError(f"stdout ended first; seen {self.seen}\n{self.log_text()}")

    async def reply(self, rid: RequestId) -> Message:
        return await self.until(lambda m: "method" not in m and m.get("id") == rid)

    async def acknowledgement(self, sub_id: RequestId) -> Message:
        return await self.until(
            lambda m: m.get("method") == ACKNOWLEDGED and subscription_of(m) == sub_id
        )

    async def rest(self) -> list[Message]:
        """Every line up to the end of stdout."""
        out: list[Message] = []
        while (msg := await self.read()) is not None:
            out.append(msg)
        return out

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


@asynccontextmanager
async def stdio_gateway(tmp_path: Path) -> AsyncIterator[StdioGateway]:
    config = write_config(
        tmp_path, {"sdk": stdio_backend(sdk_stdio_command())}, http=False, stdio=True
    )
    log = tmp_path / "gateway.log"
    with log.open("wb") as log_file:
        proc = await anyio.open_process(
            gateway_command(config), stdin=-1, stdout=-1, stderr=log_file, cwd=ROOT
        )
    try:
        yield StdioGateway(proc, log)
    finally:
        with anyio.CancelScope(shield=True):
            if proc.returncode is None:
                proc.terminate()
                with anyio.move_on_after(BOUND):
                    await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await proc.aclose()


async def test_sigterm_ends_listen_streams_gracefully_over_stdio(tmp_path: Path) -> None:
    async with stdio_gateway(tmp_path) as gw:
        await gw.send(listen("listen-term"))
        with anyio.fail_after(START_BOUND):
            assert_acknowledged(await gw.acknowledgement("listen-term"), "listen-term")
        gw.proc.send_signal(signal.SIGTERM)
        with anyio.fail_after(BOUND):
            after = await gw.rest()
            code = await gw.proc.wait()
        assert len(after) == 1, f"{after}\n{gw.log_text()}"
        assert_completed(after[0], "listen-term")
        assert code == 0, gw.log_text()


def assert_silent_after_ack(seen: list[Message], sub_id: RequestId) -> None:
    """Only the acknowledgement carries `sub_id`: no notification, no response."""
    carrying = [m for m in seen if subscription_of(m) == sub_id or m.get("id") == sub_id]
    assert len(carrying) == 1, f"after cancellation: {carrying}"
    assert_acknowledged(carrying[0], sub_id)


async def test_cancelling_a_listen_on_stdio_cancels_it_on_the_backend(tmp_path: Path) -> None:
    cancelled, control = "listen-cancelled", "listen-control"
    async with stdio_gateway(tmp_path) as gw:
        await gw.send(listen(cancelled))
        await gw.send(listen(control))
        with anyio.fail_after(START_BOUND):
            await gw.acknowledgement(cancelled)
            await gw.acknowledgement(control)
        await gw.send(
            {
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": cancelled, "reason": "no longer interested"},
            }
        )
        with anyio.fail_after(BOUND):
            await gw.send(call("change", "change_tools"))
            await gw.reply("change")
            # The control listen shows the change did reach listen streams.
            await gw.until(
                lambda m: m.get("method") == TOOLS_CHANGED and subscription_of(m) == control
            )
            await gw.send(call("echo", "echo", text="after"))
            echoed = await gw.reply("echo")
        assert echoed["result"]["content"][0]["text"] == "after", echoed
        assert_silent_after_ack(gw.seen, cancelled)
        # Read to the very end (closing stdin ends the gateway): the cancelled listen id must
        # never be answered, nor carried by anything after its acknowledgement.
        assert gw.proc.stdin is not None
        await gw.proc.stdin.aclose()
        with anyio.fail_after(BOUND):
            await gw.rest()
            assert await gw.proc.wait() == 0, gw.log_text()
        assert_silent_after_ack(gw.seen, cancelled)
