"""An HTTP listener on aiohttp's low-level server: one handler coroutine for every request, and
around it what the gateway needs of a listener: the limits of `listen.http.limits`, TLS, and a
graceful close.

aiohttp parses and frames HTTP/1.1 and enforces the head limits itself (request and header line
size, header and trailer count, a bounded queue of pipelined requests, the idle keep-alive
timeout). The listener adds what aiohttp leaves to its user: a cap on open connections (a
protocol wrapped around aiohttp's, which also closes a connection whose first request head has
not arrived within `header_timeout`), requests per connection, the body's size and arrival time
(`read_body`, with `bodies.py` for content codings).

A client that disconnects cancels its request (`handler_cancellation`); one that only shut down
its sending side after its request still gets the reply (`_Gate.eof_received`). One that stops
reading a reply is reset after `idle_timeout`. Only HTTP/1.1 and 1.0 are served (505 otherwise).
Bad client input costs at most one debug line: aiohttp logs a refused request with its
traceback, so the listener gives aiohttp a logger of its own that shortens those records.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import ssl
import struct
from asyncio import FIRST_COMPLETED
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, cast

from aiohttp import HttpVersion10, HttpVersion11, hdrs, web
from aiohttp.http import HttpProcessingError

from gateway.config import ListenerLimits, ServerTls
from gateway.frontends.bodies import BodyError, body_coding, inflate, too_big
from gateway.protocol import codes, jsonrpc
from gateway.telemetry.api import Stats

log = logging.getLogger("gateway.http")

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
# Set on a request whose response ends its connection (the connection's last request, or one
# being answered while the listener closes): its response says `Connection: close`.
CLOSE = web.RequestKey("gateway.close", bool)
# Set on a request still being answered when the listener's grace ends, just before its
# handler is cancelled: the handler then answers with GATEWAY_SHUTTING_DOWN instead of nothing.
CUT = web.RequestKey("gateway.cut", bool)

# After answering a request whose body it did not read (413, 408, 415), aiohttp reads and drops
# the rest of the body for this long before closing, so that the client, still sending, is not
# reset before it has read the answer.
LINGER = 2.0
# When the listener closes, what is left after the grace gets this long more to hand its last
# bytes over before it is cut; a grace of 0 still lets aiohttp look at each connection once.
LAST_WORDS = 1.0
MIN_GRACE = 0.001
# Connections refused over max_connections are logged at most once per this many seconds: a
# flood of them must not become a flood of log lines.
REFUSALS_LOG_INTERVAL = 10.0
# After a FIN, how soon the socket is first looked at for the reset of a client that closed
# (a loopback or LAN round trip is well within it), and the longest wait between looks after.
PROBE_FIRST = 0.01
PROBE_MAX = 1.0
# SO_LINGER on, with a timeout of 0: closing the socket resets the connection.
_RESET = struct.pack("ii", 1, 0)
# The interim response to `Expect: 100-continue` (RFC 9110 10.1.1), written as aiohttp's own
# router writes it; the low-level server leaves expectations to its handler.
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_NO_TUNNEL = jsonrpc.encode(jsonrpc.error(None, codes.INVALID_REQUEST, "CONNECT is not served"))
_NO_VERSION = jsonrpc.encode(
    jsonrpc.error(None, codes.INVALID_REQUEST, "Only HTTP/1.1 and HTTP/1.0 are served")
)
# The versions served: aiohttp's parser takes any `HTTP/d.d`, and would answer an `HTTP/2.0`
# request line as if it were 1.1 (RFC 9110 6.2: its major version says it is not).
SERVED_VERSIONS = frozenset({HttpVersion10, HttpVersion11})
_NOT_STARTED = jsonrpc.encode(
    jsonrpc.error(None, codes.GATEWAY_SHUTTING_DOWN, "The gateway stopped before it started")
)


def must_close(request: web.BaseRequest) -> bool:
    return CLOSE in request


async def start_stream(
    request: web.BaseRequest, headers: Iterable[tuple[str, str]]
) -> web.StreamResponse:
    """A 200 response whose body is written as it goes: chunked on HTTP/1.1; on HTTP/1.0,
    which has no chunks, it ends with the connection (RFC 9112 6.3), which aiohttp would keep
    open when the client asked for keep-alive."""
    response = web.StreamResponse(headers=list(headers))
    if request.version < HttpVersion11 or must_close(request):
        response.force_close()
    await response.prepare(request)
    return response


def body_now(request: web.BaseRequest, limit: int) -> bytes | None:
    """The request body if it came with its head (the usual case), without a coroutine: None
    when it is still arriving (then `read_body`). Decoded from its content coding, at most
    `limit` bytes; raises BodyError."""
    content = request.content
    if not content.is_eof():
        return None
    coding = body_coding(request.headers.get(hdrs.CONTENT_ENCODING))
    try:
        body = content.read_nowait()
    except web.RequestPayloadError as exc:
        raise BodyError(400, "framing", "The request body could not be read") from exc
    return _within_limit(body, coding, limit)


def _within_limit(body: bytes, coding: str | None, limit: int) -> bytes:
    if len(body) > limit:
        raise too_big(limit)
    return body if coding is None else inflate(body, coding, limit)


async def read_body(request: web.BaseRequest, limit: int, body_timeout: float) -> bytes:
    """The request body, decoded from its content coding: at most `limit` bytes, arrived within
    `body_timeout` seconds of its head. Raises BodyError."""
    body = body_now(request, limit)
    if body is not None:
        return body
    coding = body_coding(request.headers.get(hdrs.CONTENT_ENCODING))
    content = request.content
    try:
        length = request.content_length
        if length is not None and length > limit:
            raise too_big(limit)
        if request.version >= HttpVersion11 and _expects_continue(request):
            await request.writer.write(CONTINUE)
        body = await _gather(content, limit, body_timeout)
    except web.RequestPayloadError as exc:
        raise BodyError(400, "framing", "The request body could not be read") from exc
    return _within_limit(body, coding, limit)


def _expects_continue(request: web.BaseRequest) -> bool:
    expect = request.headers.get(hdrs.EXPECT)
    return expect is not None and expect.strip(" \t").lower() == "100-continue"


async def _gather(content: Any, limit: int, body_timeout: float) -> bytes:
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(body_timeout):
            while chunk := await content.readany():
                size += len(chunk)
                if size > limit:
                    raise too_big(limit)
                chunks.append(chunk)
    except TimeoutError:
        message = f"Body not received within {body_timeout} s"
        raise BodyError(408, "body_timeout", message) from None
    return b"".join(chunks)


def tls_context(tls: ServerTls) -> ssl.SSLContext:
    """The listener's TLS: the configured chain and key, the standard library's server defaults
    (TLS 1.2 or later), and HTTP/1.1 offered by ALPN (the only protocol served)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls.cert_file, tls.key_file)
    context.set_alpn_protocols(["http/1.1"])
    return context


class BindError(Exception):
    """The listening address cannot be taken; the message names it and what to do. `in_use`:
    the address, when another process holds it (a command line can name its port flag)."""

    def __init__(self, message: str, in_use: str | None = None) -> None:
        super().__init__(message)
        self.in_use = in_use


# Ports below this need root (or CAP_NET_BIND_SERVICE) on Linux and macOS.
PRIVILEGED_PORTS = 1024


def bind_failure(host: str, port: int, exc: OSError) -> str:
    """One line for a newcomer: which address could not be taken, why, and what to do."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if isinstance(exc, socket.gaierror):
        return (
            f"cannot resolve host {host!r} ({exc.strerror}): use an IP address such as "
            "127.0.0.1 or a name this machine resolves"
        )
    if exc.errno == errno.EADDRINUSE:
        return (
            f"{where} is already in use: stop what listens there (another gateway?) "
            "or choose another port (0 picks a free one)"
        )
    if exc.errno in (errno.EACCES, errno.EPERM):
        if 0 < port < PRIVILEGED_PORTS:
            return (
                f"no permission to listen on {where}: ports below {PRIVILEGED_PORTS} need root "
                f"or CAP_NET_BIND_SERVICE; choose a port of {PRIVILEGED_PORTS} or above"
            )
        return f"no permission to listen on {where}: {exc.strerror}"
    if exc.errno == errno.EADDRNOTAVAIL:
        return (
            f"cannot listen on {where}: {host} is not an address of this machine; use "
            "127.0.0.1, 0.0.0.0 or an address of one of its interfaces"
        )
    return f"cannot listen on {where}: {exc.strerror or exc}"


# Exceptions that mean the client sent something wrong, or went away mid-response.
_CLIENT_FAULTS = (HttpProcessingError, web.RequestPayloadError, ConnectionResetError)


class _ClientFaults(logging.Filter):
    """aiohttp logs a request it refuses as unparseable, and a body that broke off, with a
    traceback at ERROR; those are the client's faults, so they become one debug line naming
    only the kind of fault (the message may quote what the client sent, credentials too).
    Anything else (an error of the gateway's own) keeps its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, _CLIENT_FAULTS):
            # The logger let the record through at its first level (ERROR); lowered, it must
            # pass the level check again, or it is written at the default level regardless.
            if not SERVER_LOG.isEnabledFor(logging.DEBUG):
                return False
            message = record.getMessage()
            record.msg = "%s: %s"
            record.args = (message, type(exc).__name__)
            record.exc_info = None
            record.exc_text = None
            record.levelno = logging.DEBUG
            record.levelname = logging.getLevelName(logging.DEBUG)
        return True


# What aiohttp's request handlers log for the gateway's listeners.
SERVER_LOG = logging.getLogger("gateway.http.server")
SERVER_LOG.addFilter(_ClientFaults())


class _Gate(asyncio.Protocol):
    """One connection, around aiohttp's protocol for it: counts it against max_connections
    (refusing it at once when the listener is full or closing), closes it when its first request
    head is late, and counts its requests."""

    __slots__ = (
        "_head_timer",
        "_listener",
        "_probe_timer",
        "_stall_timer",
        "_transport",
        "current",
        "eof",
        "inner",
        "last",
        "received",
        "requests",
    )

    def __init__(self, listener: Listener) -> None:
        self._listener = listener
        self.inner: asyncio.Protocol = _REFUSED
        self._transport: asyncio.BaseTransport | None = None
        self._head_timer: asyncio.TimerHandle | None = None
        self._stall_timer: asyncio.TimerHandle | None = None
        self._probe_timer: asyncio.TimerHandle | None = None
        self.requests = 0
        self.last = False  # this connection's current request is its last
        self.eof = False  # the client has shut down its side: no request follows
        self.received = False
        self.current: web.BaseRequest | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        listener = self._listener
        if listener.closing or listener.open >= listener.limits.max_connections:
            if not listener.closing:
                listener.refuse()
            transport.close()
            return
        listener.open += 1
        inner = listener.web_server()
        self.inner = inner
        self._transport = transport
        listener.gates[inner] = self
        self._head_timer = asyncio.get_running_loop().call_later(
            listener.limits.header_timeout, self._head_late
        )
        inner.connection_made(transport)

    def _head_late(self) -> None:
        self._head_timer = None
        if self.requests == 0 and self._transport is not None:
            log.debug("closing a connection whose first request head did not arrive in time")
            self._transport.close()

    def _stalled(self) -> None:
        """The client has taken nothing of a reply for the idle timeout: aiohttp would wait
        for it forever, holding the reply and the connection."""
        self._stall_timer = None
        transport = self._transport
        if transport is not None:
            log.debug("dropping a connection whose client stopped reading")
            # A plain close would leave the connection to the kernel, which goes on offering
            # the unsent reply (and then the FIN) to a zero window: the client keeps its
            # connection. A reset ends it at once and frees the buffers.
            sock = transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
            cast(asyncio.Transport, transport).abort()

    def first_request(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def data_received(self, data: bytes) -> None:
        self.received = True
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        """The client shut down its sending side. That is how a client closes its connection
        (or a stream: a cancellation), but also how `curl -T` or `nc -N` say their request is
        complete (a half-close), and the two cannot be told apart from here. aiohttp lets the
        transport close at once, cancelling the request being answered; so the transport stays
        open (but over TLS, which has no half-close) until `_half_closed` has looked."""
        self.eof = True
        self.inner.eof_received()
        if self._listener.tls or (self.requests == 0 and not self.received):
            return None  # nothing was asked: closed now, as before
        # (after the request just parsed, if any, has reached `_serve`: its task runs first)
        asyncio.get_running_loop().call_soon(self._half_closed)
        return True

    def _half_closed(self) -> None:
        """A request not yet answered at all is probed with an interim `100 Continue`, which
        any HTTP/1.1 client reads past (RFC 9110 15.2): a client that closed its socket answers
        it with a reset, which cancels the request; a half-closed one gets its reply, and the
        connection ends after it. Nothing to answer, a reply under way (a stream: closing it
        cancels) or HTTP/1.0 (no interim responses): the connection closes, as before."""
        transport = self._transport
        if transport is None:
            return
        request = self.current
        if request is None or request.writer.output_size or request.version < HttpVersion11:
            transport.close()
            return
        request[CLOSE] = True
        self.last = True
        cast(asyncio.Transport, transport).write(CONTINUE)
        # The reset comes back within a round trip, but the transport reads no more after
        # the FIN: the socket's pending error is looked at instead, more rarely as time goes.
        self._look_again(request, PROBE_FIRST)

    def _look_again(self, request: web.BaseRequest, delay: float) -> None:
        loop = asyncio.get_running_loop()
        self._probe_timer = loop.call_later(delay, self._probe_answered, request, delay)

    def _probe_answered(self, request: web.BaseRequest, delay: float) -> None:
        self._probe_timer = None
        transport = self._transport
        if transport is None or self.current is not request:
            return
        sock = transport.get_extra_info("socket")
        error = 0
        if sock is not None:
            with contextlib.suppress(OSError):
                error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if error:
            log.debug("a client closed its connection while its request was being answered")
            cast(asyncio.Transport, transport).abort()  # cancels the request, as a close does
            return
        self._look_again(request, min(delay * 2, PROBE_MAX))

    def pause_writing(self) -> None:
        self._stall_timer = asyncio.get_running_loop().call_later(
            self._listener.limits.idle_timeout, self._stalled
        )
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        inner = self.inner
        if inner is _REFUSED:
            return
        self.first_request()
        if self._stall_timer is not None:
            self._stall_timer.cancel()
        if self._probe_timer is not None:
            self._probe_timer.cancel()
        self._transport = None
        self._listener.forget(self)
        inner.connection_lost(exc)

    def abort(self) -> None:
        if self._transport is not None:
            cast(asyncio.Transport, self._transport).abort()


# The stand-in protocol of a refused connection: it ignores what arrives before the close.
_REFUSED = asyncio.Protocol()


class Listener:
    """Serves `handler` on one listening socket, within `limits`, over TLS when given."""

    def __init__(
        self,
        handler: Handler,
        limits: ListenerLimits,
        *,
        tls: ServerTls | None = None,
        stats: Stats | None = None,
    ) -> None:
        self._handler = handler
        self.limits = limits
        self._tls = tls
        self.tls = tls is not None
        self._stats = stats
        self.open = 0
        self.closing = False
        self.gates: dict[asyncio.Protocol, _Gate] = {}
        self.web_server = web.Server(
            self._serve,
            handler_cancellation=True,
            access_log=None,  # the gateway keeps its own access log
            logger=SERVER_LOG,
            keepalive_timeout=limits.idle_timeout,
            max_line_size=limits.max_header_bytes,
            max_field_size=limits.max_header_bytes,
            max_headers=limits.max_headers,
            lingering_time=LINGER,
            auto_decompress=False,  # bodies are inflated by read_body
        )
        self._server: asyncio.Server | None = None
        self._held: asyncio.Event | None = None
        self._hurried = asyncio.Event()  # `close`'s grace is to end now (a second signal)
        self._refused = 0
        self._refusals_logged = -REFUSALS_LOG_INTERVAL

    async def start(self, host: str, port: int) -> int:
        """Listen; the port bound (useful with port 0). Raises BindError when the address
        cannot be taken, ssl.SSLError when the TLS chain cannot be used."""
        loop = asyncio.get_running_loop()
        context = tls_context(self._tls) if self._tls is not None else None
        try:
            self._server = await loop.create_server(
                lambda: _Gate(self),
                host,
                port,
                reuse_address=True,
                ssl=context,
                # a TLS handshake is part of what a new connection must finish in time
                ssl_handshake_timeout=self.limits.header_timeout if context else None,
            )
        except OSError as exc:
            taken = exc.errno == errno.EADDRINUSE and not isinstance(exc, socket.gaierror)
            where = (f"[{host}]:{port}" if ":" in host else f"{host}:{port}") if taken else None
            raise BindError(bind_failure(host, port, exc), where) from None
        return int(self._server.sockets[0].getsockname()[1])

    def hold(self) -> None:
        """Requests that arrive from now on wait for `release` (their connections are accepted):
        the address is taken before the gateway is ready to answer on it."""
        self._held = asyncio.Event()

    def release(self) -> None:
        if self._held is not None:
            self._held.set()

    async def _serve(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.method == hdrs.METH_CONNECT:
            # A tunnel is never made: what follows the head is not for us to parse either.
            refusal = web.Response(status=501, body=_NO_TUNNEL, content_type="application/json")
            refusal.force_close()
            return refusal
        if request.version not in SERVED_VERSIONS:
            # Another version's framing may differ: nothing after this head is parsed.
            refusal = web.Response(status=505, body=_NO_VERSION, content_type="application/json")
            refusal.force_close()
            return refusal
        gate = self.gates.get(request.protocol)
        if gate is not None:
            gate.requests += 1
            if gate.requests == 1:
                gate.first_request()
            if gate.requests >= self.limits.max_requests_per_connection or self.closing or gate.eof:
                gate.last = True
                request[CLOSE] = True
            gate.current = request
        try:
            if self._held is not None and not self._held.is_set():
                await self._held.wait()
                if self.closing:  # the start failed: nothing was ever served here
                    refusal = web.Response(
                        status=503, body=_NOT_STARTED, content_type="application/json"
                    )
                    refusal.force_close()
                    return refusal
            response = await self._handler(request)
        finally:
            if gate is not None:
                gate.current = None
        if self.closing or (gate is not None and gate.last):
            response.force_close()  # says `Connection: close` unless already sent
        return response

    def refuse(self) -> None:
        self._refused += 1
        if self._stats is not None:
            self._stats.rejections["connections"] += 1
        now = asyncio.get_running_loop().time()
        if now - self._refusals_logged >= REFUSALS_LOG_INTERVAL:
            self._refusals_logged = now
            log.warning(
                "refusing connections over max_connections (%d); %d refused so far",
                self.limits.max_connections,
                self._refused,
            )

    async def close(self, grace: float) -> None:
        """Stop listening and close idle connections; requests being answered get `grace`
        seconds to finish (their responses say `Connection: close`), then what still runs is
        cut (marked CUT and cancelled, so that its handler can still answer within LAST_WORDS)
        and every connection closed."""
        self.closing = True
        self.release()
        if self._server is not None:
            self._server.close()
        for gate in self.gates.values():
            if gate.current is not None:
                gate.current[CLOSE] = True
        self.web_server.pre_shutdown()
        # aiohttp's shutdown closes idle connections at once and waits for busy ones; it may
        # wait twice its timeout (and forever for 0), so it is bounded here.
        shutdown = asyncio.ensure_future(self.web_server.shutdown(max(grace, MIN_GRACE)))
        hurried = asyncio.ensure_future(self._hurried.wait())
        try:
            await asyncio.wait((shutdown, hurried), timeout=grace, return_when=FIRST_COMPLETED)
        finally:
            hurried.cancel()
        if shutdown.done():
            shutdown.result()  # (raises what it raised)
        else:
            self._cut()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(shutdown, LAST_WORDS)
        for gate in list(self.gates.values()):
            gate.abort()  # its request, if any, is cancelled with the connection
        if self._server is not None:
            await self._server.wait_closed()

    def hurry(self) -> None:
        """End `close`'s grace now, or make it none if the close is still to come: what runs is
        cut as at the grace's end."""
        self._hurried.set()

    def _cut(self) -> None:
        for gate in self.gates.values():
            request = gate.current
            if request is not None and not request.task.done():
                request[CUT] = True
                request.task.cancel()

    def forget(self, gate: _Gate) -> None:
        self.open -= 1
        self.gates.pop(gate.inner, None)
