"""The legacy session of an HTTP backend (2025-11-25 transports, Session Management).

An HTTP backend has no connection to hang a session on: the session is state the backend keeps
across requests. `HttpSession` is the backend as the era layer sees it (link.py's
`SessionLink`): it begins a session before `initialize` and hands the backend its `_Session`
(http_exchange.py's `Session`), whose headers carry the `Mcp-Session-Id` and the agreed
version on every request; a 404 to them means the server forgot the session (SessionExpired:
the era layer initializes again). It follows the session's standing GET stream, resumes a
reply stream that broke off (resume.py), tells the server of a request given up (a
disconnection is not a cancellation in that era), and ends the session with DELETE.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp
import anyio
from multidict import CIMultiDict

from gateway.backend_auth.failures import AuthFailed
from gateway.backend_auth.seam import GATEWAY
from gateway.backends import hop, ids, web
from gateway.backends.base import NotificationSink
from gateway.backends.era import questions, resume
from gateway.backends.http import END_SESSION_TIMEOUT, HttpBackend
from gateway.backends.http_exchange import SSE, Reading
from gateway.backends.replicas import Replica
from gateway.errors import (
    BackendConnectionLost,
    BackendError,
    BackendLoginNeeded,
    BackendProtocolError,
    BackendTimeout,
    BackendUnavailable,
    SessionExpired,
)
from gateway.origin import Origin
from gateway.protocol import headers, jsonrpc, sse
from gateway.protocol.jsonrpc import Message

log = logging.getLogger("gateway.backend")

SESSION_HEADER = "Mcp-Session-Id"
# A session id is visible ASCII (2025-11-25 transports, Session Management): anything else
# from a server is not sent back in a header.
_SESSION_ID = re.compile(r"[\x21-\x7e]+")


class HttpSession:
    """An HTTP backend as the era layer's link: the backend's own requests, and the legacy
    session the era layer begins, agrees, forgets and ends on it."""

    transport = "http"

    def __init__(self, backend: HttpBackend) -> None:
        self.backend = backend
        self.name = backend.name
        # The backend's own methods, not wrappers around them: the era layer's calls reach the
        # transport with no frame in between (the hot path).
        self.request = backend.request
        self.exchange = backend.exchange
        self.notify = backend.notify
        self.send = backend.send
        self.run = backend.run
        # Set once the legacy session's standing GET stream has its answer's head (or none:
        # refused, failed): the era layer lets the session's requests go after it, so a server
        # sees the stream before any call whose reply it might send there (era/layer.py).
        self.stream_ready = asyncio.Event()
        # Legacy requests whose reply is being read from an SSE stream, by their id on the wire:
        # a 2025-11-25 server may send the reply of a request whose stream it closed on the
        # session's standing GET stream instead of the resumed one (`_reply_elsewhere`).
        self._awaited: dict[str, asyncio.Future[Message]] = {}
        self._background: set[asyncio.Task[None]] = set()

    @property
    def up(self) -> bool:
        return self.backend.up

    @property
    def takes_requests(self) -> bool:
        return self.backend.takes_requests

    @takes_requests.setter
    def takes_requests(self, value: bool) -> None:
        self.backend.takes_requests = value

    @property
    def on_notification(self) -> Callable[[str, Message], None] | None:
        return self.backend.on_notification

    @on_notification.setter
    def on_notification(self, value: Callable[[str, Message], None] | None) -> None:
        self.backend.on_notification = value

    # --- the session's life ------------------------------------------------------------------

    def begin_session(self) -> None:
        """Legacy from now on, with no session yet (before `initialize`)."""
        self.backend.session = _Session(self)
        self.stream_ready.clear()

    def forget_session(self) -> None:
        """Modern after all (its answer to `initialize` was a modern error): no session."""
        self.backend.session = None

    def agreed(self, version: str) -> None:
        legacy = self.backend.session
        assert isinstance(legacy, _Session)
        legacy.version = version
        legacy.encode()

    async def end_session(self) -> None:
        """A view's session ends with its client's (`run` ends the backend's own and those of
        the views still open)."""
        if not self.backend.leave():
            return  # the backend has stopped, and ended the session then
        legacy = self.backend.session
        if legacy is None:
            return
        with anyio.move_on_after(END_SESSION_TIMEOUT):
            await legacy.end()

    # --- the standing GET stream -------------------------------------------------------------

    async def watch(self, deliver: Callable[[str, Message], None]) -> bool:
        """The legacy session's GET stream, until it ends: its notifications to `deliver`.
        False if the server offers none (405). A stream that had event ids is taken up again
        with `Last-Event-ID` after the server's `retry` (era/resume.py's bounds), so nothing sent
        meanwhile is lost; it returns once that fails."""
        backend = self.backend
        session, legacy = backend.streams, backend.session
        if session is None or not isinstance(legacy, _Session):
            raise BackendUnavailable(self.name, "not started")
        reading = Reading(sse.Decoder(backend.limits.max_event_bytes))
        if not await self._watch_once(session, legacy, legacy.stream_headers, reading, deliver):
            return False
        failed = 0
        while failed < resume.MAX_ATTEMPTS and (last := resume.last_event_id(reading.decoder)):
            await anyio.sleep(resume.delay(reading.decoder, backend.limits.max_resume_delay))
            reading.decoder = reading.decoder.resumed()
            before = reading.messages
            sent = legacy.stream_headers.copy()
            sent[resume.LAST_EVENT_ID] = last
            try:
                await self._watch_once(session, legacy, sent, reading, deliver)
            except SessionExpired:
                raise
            except BackendError as exc:
                log.info("backend %s: resuming the GET stream failed (%s)", self.name, exc)
            failed = 0 if reading.messages > before else failed + 1
        return True

    async def _watch_once(
        self,
        session: aiohttp.ClientSession,
        legacy: _Session,
        sent: CIMultiDict[str],
        reading: Reading,
        deliver: Callable[[str, Message], None],
    ) -> bool:
        backend = self.backend
        replica = legacy.pinned()
        try:
            resp = await backend.open(replica, session, "GET", sent, None, None)
        except BackendError as exc:
            if not backend.replicas.several:
                raise
            raise legacy.lose(exc, True) from None
        finally:
            self.stream_ready.set()
        try:
            if resp.status == 405:
                return False
            legacy.check(resp)
            if resp.status != 200 or resp.content_type != SSE:
                raise BackendProtocolError(self.name, f"GET stream answered HTTP {resp.status}")
            decoder = reading.decoder
            async for chunk in resp.content.iter_any():
                backend.stats.bytes["backend", "in"] += len(chunk)
                for data in decoder.feed(chunk):
                    if not data:
                        continue  # (the priming event: an id, a `retry`, no message)
                    reading.messages += 1
                    event = jsonrpc.decode(data, keep=True)
                    if isinstance(event, jsonrpc.Invalid):
                        continue
                    if backend.tap is not None:
                        backend.tap.record("backend", "in", event, backend=self.name)
                    kind = jsonrpc.kind(event)
                    if kind is jsonrpc.Kind.NOTIFICATION:
                        deliver(self.name, event)
                    elif kind is jsonrpc.Kind.REQUEST:
                        await self._on_stream_request(event)
                    elif kind is jsonrpc.Kind.RESPONSE:
                        self._reply_elsewhere(event)
            return True
        except sse.EventTooLarge as exc:
            raise BackendProtocolError(self.name, f"GET stream: {exc}") from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            if resume.last_event_id(reading.decoder) is not None:
                return True  # (broken, but it can be resumed)
            raise web.failure(self.name, exc, None) from None
        finally:
            resp.close()

    def _reply_elsewhere(self, reply: Message) -> None:
        """A response on the session's standing GET stream: the reply of a request whose own
        stream ended without it, if one is awaited under its id (some servers send it on
        whatever GET stream comes next); anything else is dropped."""
        id_ = reply.get("id")
        waiter = self._awaited.get(id_) if isinstance(id_, str) else None
        if waiter is None or waiter.done():
            self.backend.stray(id_)
            return
        waiter.set_result(reply)

    async def _on_stream_request(self, request: Message) -> None:
        """A question on the GET stream names no request (2025-11-25 servers may send one
        there while a call runs): it goes to the request in flight when there is exactly one,
        as on stdio, since a guess could show one user's question to another."""
        asking = self.backend.asking
        if request.get("method") != "ping" and len(asking) == 1:
            (sink,) = asking.values()
            await sink(request)
            return
        await self._refuse_unrelated(request)

    async def _refuse_unrelated(self, request: Message) -> None:
        """A request on the GET stream belongs to no client request: only ping and roots/list
        (with the configured roots) are answered."""
        refusal = "The gateway answers questions only within a request"
        roots = self.backend.config.roots
        await self.backend.notify(questions.refuse_unattended(request, roots, refusal))

    # --- a request's reply stream, and its end -----------------------------------------------

    def cancel(self, sent: ids.Sent, msg: Message, origin: Origin) -> None:
        """A legacy server learns that a request is given up only from `notifications/cancelled`
        (2025-11-25: a disconnection is not a cancellation), naming the id it was sent; never
        for `initialize` (basic/utilities/cancellation)."""
        if msg.get("method") == "initialize":
            return
        note: Message = {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": sent.wire, "reason": "cancelled by the client"},
        }
        task = asyncio.get_running_loop().create_task(self._notify_quietly(note, origin))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _notify_quietly(self, note: Message, origin: Origin) -> None:
        with contextlib.suppress(BackendError):
            await self.backend.notify(note, origin)

    async def read_stream(
        self,
        legacy: _Session,
        resp: aiohttp.ClientResponse,
        sent: ids.Sent,
        sink: NotificationSink,
        origin: Origin,
        within: float | None,
    ) -> Message:
        """The events of a streamed reply until the response, across resumptions (bounded by
        `limits` as a modern stream is, http_exchange.py)."""
        # Awaited from the start: the reply may come on the standing stream before this one's
        # end is read.
        waiter: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._awaited[sent.wire] = waiter
        try:
            return await self._read_reply(legacy, resp, sent, sink, origin, within, waiter)
        finally:
            del self._awaited[sent.wire]

    async def _read_reply(
        self,
        legacy: _Session,
        resp: aiohttp.ClientResponse,
        sent: ids.Sent,
        sink: NotificationSink,
        origin: Origin,
        within: float | None,
        elsewhere: asyncio.Future[Message],
    ) -> Message:
        backend = self.backend
        started = anyio.current_time()
        reading = Reading(sse.Decoder(backend.limits.max_event_bytes))
        bounded = within is not None
        try:
            reply = await backend.read_events(resp, reading, sent, sink, bounded)
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
            if resume.last_event_id(reading.decoder) is None and not elsewhere.done():
                raise  # (the request may have run: -31005)
            reply = None
        if reply is not None:
            return reply
        if elsewhere.done():
            return ids.restore(elsewhere.result(), sent)
        if reading.strays:
            raise BackendProtocolError(self.name, "the stream ended with replies to other ids")
        resp.close()
        left = None if within is None else within - (anyio.current_time() - started)

        async def attempt(last_id: str, remaining: float | None) -> Message | None:
            return await self._resume_once(legacy, last_id, remaining, reading, sent, sink, origin)

        limits = backend.limits
        resuming = resume.resume(
            self.name,
            reading,
            attempt,
            left,
            attempts=limits.max_resumptions,
            longest=limits.max_resume_delay,
        )
        return await self._first_of(resuming, elsewhere, sent)

    @staticmethod
    async def _first_of(
        resuming: Coroutine[Any, Any, Message], elsewhere: asyncio.Future[Message], sent: ids.Sent
    ) -> Message:
        """The reply from the resumed stream, or from the standing one if it comes there first
        (the resumption is then given up)."""
        task = asyncio.ensure_future(resuming)
        try:
            await asyncio.wait((task, elsewhere), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, BackendError):
                    await task
        if elsewhere.done():
            return ids.restore(elsewhere.result(), sent)
        return task.result()

    async def _resume_once(
        self,
        legacy: _Session,
        last_id: str,
        within: float | None,
        reading: Reading,
        sent: ids.Sent,
        sink: NotificationSink,
        origin: Origin,
    ) -> Message | None:
        """One GET taking up a request's stream (2025-11-25 transports, Resumability and
        Redelivery): the response if it came on it."""
        backend = self.backend
        session = backend.streams
        if session is None:
            raise BackendUnavailable(self.name, "not started")
        headers = legacy.stream_headers.copy()
        headers[resume.LAST_EVENT_ID] = last_id
        deadline = web.timeout(within, backend.connect_timeout)
        whose = web.caller(backend.authorizer, origin)
        try:
            resp = await backend.open(
                legacy.pinned(), session, "GET", headers, None, within, deadline, whose=whose
            )
        except BackendTimeout:
            raise
        except BackendError:
            return None  # (cannot connect, or broken before the head: a GET may go again)
        try:
            legacy.check(resp)
            if resume.final(resp.status):
                raise BackendConnectionLost(
                    self.name, f"the stream ended before the reply; resuming: HTTP {resp.status}"
                )
            if resp.status != 200 or resp.content_type != SSE:
                return None
            return await backend.read_events(resp, reading, sent, sink, within is not None)
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
            return None  # (broken again: perhaps resumed again)
        finally:
            resp.close()


class _Session:
    """One legacy session, from `initialize` to its end: its headers, built once per change,
    the replica it lives on, and what the backend's exchanges ask of it (http_exchange.py's
    `Session`)."""

    def __init__(self, link: HttpSession) -> None:
        self._link = link
        self._backend = link.backend
        self._fixed = self._backend.fixed
        self._custom = self._backend.custom
        self.version: str | None = None
        self.session_id: str | None = None
        # Several replicas: the one the session lives on, and whether it failed since (the
        # session is then given up: SessionExpired).
        self.replica: Replica | None = None
        self.lost = False
        self.headers: CIMultiDict[str] = CIMultiDict(self._fixed)
        self.stream_headers: CIMultiDict[str] = CIMultiDict(self._custom)
        self.encode()

    def encode(self) -> None:
        fields: list[tuple[str, str]] = []
        if self.version is not None and hop.plain(self.version):
            fields.append((headers.PROTOCOL_VERSION, self.version))
        if self.session_id is not None:
            fields.append((SESSION_HEADER, self.session_id))
        self.headers = CIMultiDict([*self._fixed, *fields])
        self.stream_headers = CIMultiDict([*self._custom, ("Accept", SSE), *fields])

    def pinned(self) -> Replica:
        """The replica of the session (the one that answered its `initialize`)."""
        return self.replica or self._backend.replicas.all[0]

    def check(self, resp: aiohttp.ClientResponse) -> None:
        name = self._backend.name
        if resp.status == 404 and self.session_id is not None:
            raise SessionExpired(name, "the server no longer knows the session")
        session_id = resp.headers.get(SESSION_HEADER)
        if session_id is not None and session_id != self.session_id:
            if _SESSION_ID.fullmatch(session_id) is None:
                raise BackendProtocolError(name, "the session id is not visible ASCII")
            self.session_id = session_id
            self.encode()

    def lose(self, exc: BaseException, repeatable: bool) -> BaseException:
        """A legacy session's replica failed: the session is given up. A request that was not
        sent, or may be repeated, is SessionExpired, which the era layer answers as any lost
        session: a new `initialize` (on another replica) and the request sent again."""
        if not isinstance(exc, BackendUnavailable | BackendConnectionLost):
            return exc
        if isinstance(exc, BackendLoginNeeded | SessionExpired):
            return exc
        self.lost = True
        name = self._backend.name
        if isinstance(exc, BackendUnavailable) or repeatable:
            log.info("backend %s: a legacy session's replica failed (%s)", name, exc)
            return SessionExpired(name, f"the session's replica failed ({exc})")
        return exc

    def read_stream(
        self,
        resp: aiohttp.ClientResponse,
        sent: ids.Sent,
        sink: NotificationSink,
        origin: Origin,
        within: float | None,
    ) -> Coroutine[Any, Any, Message]:
        return self._link.read_stream(self, resp, sent, sink, origin, within)

    def cancel(self, sent: ids.Sent, msg: Message, origin: Origin) -> None:
        self._link.cancel(sent, msg, origin)

    async def end(self) -> None:
        """A legacy session the gateway no longer needs is ended with DELETE (2025-11-25
        transports, Session Management); a server that refuses (405) just lets it expire."""
        backend = self._backend
        session, authorizer = backend.calls, backend.authorizer
        if self.session_id is None or session is None:
            return
        sent = self.stream_headers
        if authorizer is not None:
            sent = sent.copy()
            with contextlib.suppress(AuthFailed):
                header = await authorizer.authorization(GATEWAY)
                if header is not None:
                    sent["Authorization"] = header
        try:
            resp = await web.send(session, "DELETE", self.pinned().url, sent)
            resp.close()
        except (aiohttp.ClientError, TimeoutError):
            pass
