"""The aiohttp client sessions of HTTP and HTTP+SSE backends, built from a backend's config,
and the one place where aiohttp's client errors become the gateway's backend errors.

Tuned only through aiohttp's public API: connector limits and keep-alive expiry, ClientTimeouts
built once, DummyCookieJar, no decompression, the response parser's limits (max_line_size,
max_field_size, max_headers), a session-wide proxy, and the documented `request_class` hook.
"""

from __future__ import annotations

import itertools
import logging
import re
import ssl
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import client_exceptions as failures
from multidict import CIMultiDict
from yarl import URL

from gateway import __version__
from gateway.backend_auth.failures import AuthFailed
from gateway.backend_auth.seam import GATEWAY, Caller
from gateway.caller_auth.identity import INTROSPECTION, JWT
from gateway.config import BackendConfig, ConfigInvalid, HttpTarget, SseTarget
from gateway.errors import (
    BackendConnectionLost,
    BackendError,
    BackendLoginNeeded,
    BackendProtocolError,
    BackendTimeout,
    BackendUnavailable,
)
from gateway.origin import Origin
from gateway.protocol.jsonrpc import Message

if TYPE_CHECKING:
    from gateway.backend_auth.authorizer import Authorizer

log = logging.getLogger("gateway.backend")

# Sent with every request. Identity only: replies are forwarded as the bytes that came, and no
# decompression means no decompression bomb (a coded reply fails as not JSON-RPC).
BASE_HEADERS = (("User-Agent", f"mcp-gateway/{__version__}"), ("Accept-Encoding", "identity"))
# A pooled connection found holding bytes nobody asked for is replaced by another; at most this
# many times per request (each such connection is closed, so the pool is soon rid of them).
STALE_RETRIES = 8
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# A header value we may send as it is: visible ASCII, inner spaces and tabs.
_VALUE = re.compile(r"(?:[\x21-\x7e](?:[\x20-\x7e\t]*[\x21-\x7e])?)?")


class StaleConnection(failures.ClientConnectionError):
    """A pooled connection the backend wrote to while it was idle; nothing was sent on it."""


class _FreshRequest(aiohttp.ClientRequest):
    """Refuses a pooled connection that holds bytes the backend sent while it sat idle.

    aiohttp 3.14's pool checks only that an idle connection is open and young enough: a whole
    response written to it unasked is read as the reply to the next request sent on it. This
    runs before anything is written, so the request can safely go out on another connection."""

    async def send(self, conn: aiohttp.connector.Connection) -> aiohttp.ClientResponse:
        protocol = conn.protocol
        if protocol is not None and protocol.should_close:
            raise StaleConnection("the backend wrote to an idle connection")
        return await super().send(conn)


def target(config: BackendConfig) -> HttpTarget | SseTarget:
    assert isinstance(config.target, HttpTarget | SseTarget)
    return config.target


def where(config: BackendConfig) -> str:
    kind = "sse" if isinstance(config.target, SseTarget) else "http"
    return f"backends.{config.name}.{kind}"


def target_url(config: BackendConfig) -> URL:
    """The backend's URL, parsed once (aiohttp takes a URL object as it is, per request)."""
    return _parsed(config, target(config).url, "url")


def replica_urls(config: BackendConfig) -> list[URL]:
    """Every replica's URL (one without `urls`), parsed once."""
    t = target(config)
    if not isinstance(t, HttpTarget) or not t.urls:
        return [target_url(config)]
    return [_parsed(config, url, f"urls.{at}") for at, url in enumerate(t.urls)]


def _parsed(config: BackendConfig, text: str, key: str) -> URL:
    url = URL(text)
    if url.scheme not in ("http", "https") or not url.host:
        raise ConfigInvalid([f"{where(config)}.{key}: not an http(s) URL with a host"])
    return url


def fixed_headers(config: BackendConfig) -> list[tuple[str, str]]:
    """Our own headers, then the configured `headers` (checked here: aiohttp would refuse a
    control character only at the first request)."""
    custom = list(target(config).headers.items())
    for name, value in custom:
        if _TOKEN.fullmatch(name) is None or _VALUE.fullmatch(value) is None:
            raise ConfigInvalid([f"{where(config)}.headers.{name}: not a valid header"])
    return [*BASE_HEADERS, *custom]


def ssl_context(config: BackendConfig) -> ssl.SSLContext | bool:
    """TLS for an https backend: the system's trust store, or only `tls.ca_file`; a client
    certificate from `tls.cert_file`/`tls.key_file`; no verification with `verify: false`."""
    tls = target(config).tls
    t = target(config)
    urls = t.replicas if isinstance(t, HttpTarget) else (t.url,)
    if not any(url.startswith("https:") for url in urls):
        return True  # aiohttp's default; never used for http://
    try:
        context = ssl.create_default_context(cafile=tls.ca_file)
        if not tls.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if tls.cert_file is not None:
            context.load_cert_chain(tls.cert_file, tls.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigInvalid([f"{where(config)}.tls: cannot be loaded: {exc}"]) from None
    return context


def timeout(total: float | None, connect: float) -> aiohttp.ClientTimeout:
    """`total` bounds the whole exchange, waiting for a pooled connection and reading the body
    included; `connect` only the TCP and TLS connect, so a wait for a free connection is never
    taken for a backend that cannot be reached."""
    return aiohttp.ClientTimeout(total=total, sock_connect=connect)


def session(
    config: BackendConfig,
    *,
    limit: int | None,
    default_timeout: aiohttp.ClientTimeout,
    tls: ssl.SSLContext | bool,
    proxy: str | None,
) -> aiohttp.ClientSession:
    """One pooled session to a backend: at most `limit` connections (None: no limit), each
    closed after `limits.idle_timeout` idle, so that the gateway closes an idle connection
    before the backend's keep-alive would, and a reused one is never one being closed."""
    limits = target(config).limits
    connector = aiohttp.TCPConnector(
        limit=limit or 0, keepalive_timeout=limits.idle_timeout, ssl=tls
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=default_timeout,
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
        proxy=proxy,
        request_class=_FreshRequest,
        max_line_size=limits.max_header_bytes,
        max_field_size=limits.max_header_bytes,
        max_headers=limits.max_headers,
    )


def pool_connections(*sessions: aiohttp.ClientSession | None) -> tuple[int, int]:
    """Connections (in use, idle) of the sessions' pools, for /metrics. aiohttp 3.14 has no
    public count: its BaseConnector's `_acquired` (the connections handed out) and `_conns`
    (the idle ones, by host) are read, and a pool without them counts 0 (tests pin both)."""
    in_use = idle = 0
    for session in sessions:
        if session is None or session.closed:
            continue
        connector = session.connector
        in_use += len(getattr(connector, "_acquired", ()))
        idle += sum(len(conns) for conns in getattr(connector, "_conns", {}).values())
    return in_use, idle


def request(
    session: aiohttp.ClientSession,
    method: str,
    url: URL,
    headers: CIMultiDict[str],
    data: bytes | None = None,
    deadline: aiohttp.ClientTimeout | None = None,
) -> Awaitable[aiohttp.ClientResponse]:
    """One try of `send`: StaleConnection when the pooled connection it took held bytes nobody
    asked for (nothing was sent). A plain function: no frame of its own on the request path."""
    if deadline is None:
        return session.request(method, url, data=data, headers=headers, allow_redirects=False)
    return session.request(
        method, url, data=data, headers=headers, allow_redirects=False, timeout=deadline
    )


async def send(
    session: aiohttp.ClientSession,
    method: str,
    url: URL,
    headers: CIMultiDict[str],
    data: bytes | None = None,
    deadline: aiohttp.ClientTimeout | None = None,
) -> aiohttp.ClientResponse:
    """One request; its response once the head has arrived. Redirects are not followed, and
    nothing is ever sent twice: aiohttp retries only idempotent methods on a reused connection
    that closed (RFC 9112, Retrying Requests), and a stale connection is left before sending."""
    for _ in range(STALE_RETRIES):
        try:
            return await request(session, method, url, headers, data, deadline)
        except StaleConnection:
            continue
    raise StaleConnection("every pooled connection held bytes nobody asked for")


# What a backend with per-caller tokens is asked under the gateway's own: what everyone sees
# alike (discovery, lists, the legacy handshake). Everything else goes with the caller's token.
SHARED_METHODS = frozenset(
    {
        "server/discover",
        "initialize",
        "notifications/initialized",
        "ping",
        "tools/list",
        "prompts/list",
        "resources/list",
        "resources/templates/list",
    }
)


def shared(msg: Message) -> bool:
    return msg.get("method") in SHARED_METHODS


def caller(authorizer: Authorizer | None, origin: Origin, shared: bool = False) -> Caller:
    """Whose token a request made for `origin` (its `Call`'s) takes: the gateway's own, except
    where each caller has a token of their own (token exchange, per_user) and the request is not
    `shared` (what everyone sees alike, and the streams that carry everyone's replies)."""
    if authorizer is None or not authorizer.per_caller:
        return GATEWAY
    if shared:
        return GATEWAY
    identity = origin.identity
    if identity is None:
        return GATEWAY
    # The token to exchange is the one this request presented, read from its own headers; an
    # API key is a secret of its own and a configured (stdio) identity has none: neither is sent.
    presented = None
    if identity.method in (JWT, INTROSPECTION):
        scheme, _, token = (origin.authorization() or "").partition(" ")
        presented = token.strip(" ") if scheme.lower() == "bearer" and token.strip(" ") else None
    return Caller(identity.key(), presented, (identity.issuer, identity.subject))


async def send_with_token(
    name: str,
    authorizer: Authorizer,
    caller: Caller,
    send: Callable[[CIMultiDict[str]], Awaitable[aiohttp.ClientResponse]],
    sent: CIMultiDict[str],
) -> aiohttp.ClientResponse:
    """`send(headers)` with the gateway's token (basic/authorization, Access Token Usage). A 401,
    or a 403 `insufficient_scope`, means the server did not act on the request, so it is sent
    again after a new token, at most `auth.max_attempts` times (the server's refusal then
    stands, and the caller reports its status)."""
    for attempt in itertools.count():
        try:
            header = await authorizer.authorization(caller)
        except AuthFailed as exc:
            raise BackendLoginNeeded(name, str(exc)) from None
        headers = sent.copy()
        if header is not None:
            headers["Authorization"] = header
        resp = await send(headers)
        if resp.status not in (401, 403):
            return resp
        challenges = resp.headers.getall("WWW-Authenticate", [])
        if resp.status == 403 and not any("insufficient_scope" in c for c in challenges):
            return resp
        resp.release()
        if attempt >= authorizer.max_attempts:
            raise BackendLoginNeeded(
                name,
                f"refuses the gateway's credentials (HTTP {resp.status}) after {attempt} new "
                f"token(s); check its auth: section, or forget the stored login with "
                f"`mcp-transparent-gateway auth logout {name}`",
            )
        try:
            await authorizer.refused(caller, resp.status, challenges, header)
        except AuthFailed as exc:
            raise BackendLoginNeeded(name, str(exc)) from None
    raise AssertionError("unreachable")


def failure(name: str, exc: BaseException, within: float | None) -> BackendError:
    """The backend error for what aiohttp raised. Only a failure to connect, where nothing was
    sent, is "unavailable"; a connection that broke later is "lost" (the request may have run)."""
    if isinstance(exc, failures.ClientConnectorCertificateError):
        return BackendUnavailable(name, f"TLS: certificate not trusted: {exc.certificate_error}")
    if isinstance(exc, failures.ConnectionTimeoutError):
        return BackendUnavailable(name, "connect timed out")
    if isinstance(exc, failures.ClientConnectorError | failures.ClientHttpProxyError):
        return BackendUnavailable(name, f"cannot connect: {_reason(exc)}")
    if isinstance(exc, StaleConnection):
        return BackendUnavailable(name, str(exc))
    if isinstance(exc, TimeoutError):
        return BackendTimeout(name, f"no reply within {within or 0:g}s")
    if isinstance(exc, failures.ClientResponseError):
        return BackendProtocolError(name, f"malformed HTTP reply: {exc.message}")
    if _tls_alert(exc):
        # A TLS 1.3 server refuses a client certificate after the handshake, before it reads
        # any request: a refusal at the TLS layer, not a lost request.
        return BackendUnavailable(name, f"TLS refused: {_reason(exc)}")
    if isinstance(exc, failures.ClientPayloadError):
        return BackendConnectionLost(name, "the connection closed in the middle of the reply")
    if isinstance(exc, failures.ClientConnectionError | OSError):
        return BackendConnectionLost(name, "the connection was lost after the request went out")
    return BackendProtocolError(name, f"HTTP failure: {_reason(exc)}")


def _tls_alert(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(4):  # the SSLError is at most a few causes down
        if seen is None:
            return False
        if isinstance(seen, ssl.SSLError) and "ALERT" in str(seen.reason or ""):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _reason(exc: BaseException) -> str:
    if isinstance(exc, failures.ClientConnectorError):
        os_error = exc.os_error
        return str(os_error.strerror or os_error) or type(os_error).__name__
    return str(exc) or type(exc).__name__
