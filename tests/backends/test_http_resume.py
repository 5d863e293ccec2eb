"""A legacy backend's SSE stream that ends before its response is resumed (2025-11-25
transports, Resumability and Redelivery; the SSE `retry` field; the conformance client
scenario `sse-retry`): a GET with `Last-Event-ID` after the server's `retry`, bounded in
attempts and in time; a stream without event ids, or a modern one (2026-07-28 streamable-http:
no resumability), fails with -31005 and the POST is never sent again.

Against a real aiohttp server (tests/servers/unruly_http.py) that closes the stream after
`id:` + `retry:` and serves the rest on a GET; errors by code.
"""

from __future__ import annotations

import aiohttp
import anyio
import orjson
import pytest
import yaml

from gateway import config as gateway_config
from gateway import errors
from gateway.app import Gateway
from gateway.backends.base import GATEWAY_CALL
from gateway.backends.era import resume
from gateway.backends.era.http_session import HttpSession
from gateway.backends.era.link import SessionLink
from gateway.backends.http import HttpBackend
from gateway.protocol import codes, sse
from gateway.protocol.jsonrpc import Message
from tests.servers import unruly_http
from tests.support import (
    BOUND,
    both_event_loops,  # noqa: F401  (the anyio_backend fixture)
    call,
    mirrored_headers,
)
from tests.support.backend import backend_config, code_of, ignore, running

pytestmark = pytest.mark.anyio


def legacy(backend: HttpBackend) -> HttpSession:
    """The backend as the era layer leaves it after `initialize`: a legacy session."""
    session = HttpSession(backend)
    session.begin_session()
    session.agreed(unruly_http.LEGACY)
    return session


async def test_the_era_layer_holds_an_http_backend_as_a_session_link() -> None:
    """The legacy session is the era wing's (era/http_session.py): the era layer recognises
    it by `SessionLink` (mypy checks the annotation, the era layer `isinstance`), and the
    backend sees it only while one is begun."""
    backend = HttpBackend(backend_config("http://127.0.0.1:1/mcp"))
    link: SessionLink = HttpSession(backend)
    assert isinstance(link, SessionLink)
    assert backend.session is None
    link.begin_session()
    assert backend.session is not None
    link.forget_session()
    assert backend.session is None


def posts(server: unruly_http.Unruly) -> int:
    return sum(1 for m in server.received if m.get("method") == "tools/call")


async def test_a_dropped_stream_is_resumed_from_its_last_event_id() -> None:
    """The reply and the progress that followed the drop arrive through a GET carrying the
    last event id received, sent no sooner than the server's `retry` (100 ms) after the drop;
    the POST went once."""
    notes: list[Message] = []

    async def sink(note: Message) -> None:
        notes.append(note)

    async with (
        unruly_http.serving(legacy=True) as (server, url),
        running(backend_config(url)) as backend,
    ):
        with anyio.fail_after(BOUND):
            got = await legacy(backend).request(
                call(7, "drop", token="tok", retry=100), sink, GATEWAY_CALL
            )
    assert got["id"] == 7 and got["result"]["resumed"] == "s1-1"
    assert server.resumes == ["s1-1"]
    assert server.resumed_at[0] - server.closed_at[0] >= 0.1 * 0.9
    assert [(n["params"]["progressToken"], n["params"]["progress"]) for n in notes] == [
        ("tok", 1),
        ("tok", 2),
    ]
    assert posts(server) == 1


async def test_resumption_that_keeps_failing_gives_up_after_a_few_attempts() -> None:
    """Every GET is answered with a fresh priming event and closed empty: MAX_ATTEMPTS of them,
    then -31005 (the call may have run), well within the request's deadline."""
    async with (
        unruly_http.serving(legacy=True) as (server, url),
        running(backend_config(url)) as backend,
    ):
        with anyio.fail_after(BOUND), pytest.raises(errors.BackendConnectionLost) as caught:
            await legacy(backend).request(
                call(1, "drop", retry=50, fail=True), ignore, GATEWAY_CALL
            )
    assert code_of(caught) == codes.BACKEND_CONNECTION_LOST
    assert len(server.resumes) == resume.MAX_ATTEMPTS
    assert server.resumes[0] == "s1-1"  # then the priming ids each failed GET gave
    assert posts(server) == 1


async def test_the_resumption_limits_are_the_backends_limits() -> None:
    """`limits.max_resumptions: 1` gives up after one empty reconnection; `max_resume_delay`
    caps the server's `retry` (here 60 s asked, 0.05 s waited)."""
    limits = {"max_resumptions": 1, "max_resume_delay": 0.05}
    async with (
        unruly_http.serving(legacy=True) as (server, url),
        running(backend_config(url, limits=limits)) as backend,
    ):
        with anyio.fail_after(BOUND), pytest.raises(errors.BackendConnectionLost) as caught:
            await legacy(backend).request(
                call(1, "drop", retry=60_000, fail=True), ignore, GATEWAY_CALL
            )
    assert code_of(caught) == codes.BACKEND_CONNECTION_LOST
    assert len(server.resumes) == 1 and posts(server) == 1


async def test_a_refused_resumption_is_not_tried_again() -> None:
    """A 4xx to the resuming GET (here 404: the server forgot the stream) ends it at once."""
    async with (
        unruly_http.serving(legacy=True) as (server, url),
        running(backend_config(url)) as backend,
    ):
        with anyio.fail_after(BOUND), pytest.raises(errors.BackendConnectionLost) as caught:
            await legacy(backend).request(
                call(1, "drop", retry=10, forget=True), ignore, GATEWAY_CALL
            )
    assert code_of(caught) == codes.BACKEND_CONNECTION_LOST
    assert server.resumes == ["s1-1"] and posts(server) == 1


async def test_a_retry_beyond_the_deadline_fails_at_once() -> None:
    """A `retry` longer than what is left of the request's deadline is not waited out."""
    async with unruly_http.serving(legacy=True) as (server, url):
        config = backend_config(url, _backend={"request_timeout": 2})
        async with running(config) as backend:
            started = anyio.current_time()
            with anyio.fail_after(BOUND), pytest.raises(errors.BackendTimeout) as caught:
                await legacy(backend).request(call(1, "drop", retry=600_000), ignore, GATEWAY_CALL)
    assert code_of(caught) == codes.BACKEND_TIMEOUT
    assert anyio.current_time() - started < 1.0
    assert server.resumes == []


@pytest.mark.parametrize("era", ["legacy-without-ids", "modern-with-ids"])
async def test_a_stream_that_cannot_be_resumed_fails_without_sending_again(era: str) -> None:
    """Without event ids there is nothing to resume from; a modern stream is never resumed.
    Either way -31005, one POST and no GET."""
    async with (
        unruly_http.serving(legacy=era.startswith("legacy")) as (server, url),
        running(backend_config(url)) as backend,
    ):
        if era.startswith("legacy"):
            legacy(backend)
        msg = call(1, "drop", ids=era.endswith("with-ids"))
        with anyio.fail_after(BOUND), pytest.raises(errors.BackendConnectionLost) as caught:
            await backend.request(msg, ignore, GATEWAY_CALL)
    assert code_of(caught) == codes.BACKEND_CONNECTION_LOST
    assert server.resumes == []
    assert posts(server) == 1


async def test_the_get_stream_is_resumed_from_its_last_event_id() -> None:
    """The legacy session's own GET stream: after it drops, a GET with `Last-Event-ID` picks it
    up (its second notification arrives); once resuming is refused, `watch` returns (the era
    layer opens a fresh stream later)."""
    seen: list[Message] = []
    async with (
        unruly_http.serving(legacy=True, watch=True) as (server, url),
        running(backend_config(url)) as backend,
    ):
        with anyio.fail_after(BOUND):
            offered = await legacy(backend).watch(lambda _, note: seen.append(note))
    assert offered is True
    assert [n["params"]["n"] for n in seen] == [1, 2]
    assert server.resumes == [None, "w-1"] + ["w-2"] * resume.MAX_ATTEMPTS


async def test_through_the_gateway_a_legacy_backends_dropped_stream_is_resumed() -> None:
    """A modern client, the gateway, a legacy backend that drops the call's stream: the client
    gets the result, once."""
    async with unruly_http.serving(legacy=True) as (server, url):
        text = yaml.safe_dump(
            {
                "listen": {"http": {"host": "127.0.0.1", "port": 0}},
                "backends": {"b": {"http": {"url": url}}},
            }
        )
        async with Gateway(gateway_config.parse(text)) as gw, aiohttp.ClientSession() as client:
            assert gw.http_url is not None
            msg = call(3, "drop", retry=100)
            with anyio.fail_after(BOUND):
                async with client.post(
                    gw.http_url, data=orjson.dumps(msg), headers=mirrored_headers(msg)
                ) as resp:
                    body = orjson.loads(await resp.read())
    assert body["id"] == 3 and body["result"]["resumed"] == "s1-1", body
    assert "s1-1" in server.resumes and posts(server) == 1


# --- the rules on their own ------------------------------------------------------------------


def decoder_after(stream: bytes) -> sse.Decoder:
    decoder = sse.Decoder()
    decoder.feed(stream)
    return decoder


def test_the_wait_is_the_servers_retry_capped() -> None:
    assert resume.delay(decoder_after(b"retry: 250\n\n")) == 0.25
    assert resume.delay(decoder_after(b"retry: 86400000\n\n")) == resume.MAX_DELAY
    assert resume.delay(decoder_after(b"retry: 99999999999999999999\n\n")) == resume.MAX_DELAY
    assert resume.delay(decoder_after(b"retry: soon\n\n")) == resume.DEFAULT_DELAY
    assert resume.delay(decoder_after(b"data: x\n\n")) == resume.DEFAULT_DELAY


def test_the_last_event_id_is_the_one_dispatched_last() -> None:
    """SSE standard: an event's id sticks until another sets it; an event not yet ended sets
    nothing; an id that cannot be a header value cannot be resumed from."""
    assert resume.last_event_id(decoder_after(b"id: a\ndata: x\n\ndata: y\n\n")) == "a"
    assert resume.last_event_id(decoder_after(b"id: a\n\nid: b\ndata: half")) == "a"
    assert resume.last_event_id(decoder_after(b"data: x\n\n")) is None
    assert resume.last_event_id(decoder_after(b"id: \xc3\xa9\n\n")) is None
    assert resume.last_event_id(decoder_after(b"id: a\n\nid\n\n")) is None  # reset to empty
    carried = decoder_after(b"id: a\nretry: 5\n\nid: b\ndata: half").resumed()
    assert resume.last_event_id(carried) == "a" and carried.retry == 5


async def test_a_reply_sent_on_the_standing_stream_instead_is_taken() -> None:
    """2025-11-25 transports, Resumability and Redelivery: the server closed the request's
    stream and, while the resuming GET stays open and empty, sends the reply on the session's
    standing GET stream (the conformance suite's `sse-retry` server does this when the standing
    stream connects after the call). The reply is the call's: it is not dropped as a stray,
    and the call does not wait out its deadline on the resumed stream."""
    delivered: list[Message] = []
    async with (
        unruly_http.serving(legacy=True) as (server, url),
        running(backend_config(url)) as backend,
        anyio.create_task_group() as tg,
    ):
        session = legacy(backend)
        got: list[Message] = []
        answered = anyio.Event()

        async def call_orphan() -> None:
            got.append(await session.request(call(5, "orphan", retry=20), ignore, GATEWAY_CALL))
            answered.set()

        async def watch() -> None:
            await session.watch(lambda _, note: delivered.append(note))

        with anyio.fail_after(BOUND):
            tg.start_soon(call_orphan)
            await server.until(lambda: any(last is not None for last in server.resumes))
            tg.start_soon(watch)  # the standing stream, after the call: it carries the reply
            await server.until(lambda: None in server.resumes)
            await answered.wait()
        tg.cancel_scope.cancel()
    assert got[0]["id"] == 5 and got[0]["result"]["on"] == "the standing stream"
    assert posts(server) == 1
    assert delivered == []  # a reply is no notification


async def test_a_legacy_sessions_requests_wait_for_its_standing_stream() -> None:
    """2025-11-25 transports, Listening for Messages from the Server: the session's standing GET
    stream is answered before any request of the session goes (bounded: era/layer.py
    STREAM_READY_WAIT), so a server that sends an owed reply on whichever GET comes next never
    sends it on the standing stream of a session whose call it does not know yet."""
    async with unruly_http.serving(legacy=True, watch=True) as (server, url):
        text = yaml.safe_dump(
            {
                "listen": {"http": {"host": "127.0.0.1", "port": 0}},
                "backends": {"unruly": {"http": {"url": url}, "era": "legacy"}},
            }
        )
        async with Gateway(gateway_config.parse(text)) as gw:
            with anyio.fail_after(BOUND):
                await gw.catalogs_loaded.wait()
    opening = ["POST initialize", "POST notifications/initialized"]
    assert server.order[:2] == opening
    assert server.order[2] == "GET", server.order
