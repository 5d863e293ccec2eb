"""Which HTTP transport a URL speaks, for `connect --transport auto` (2025-11-25 and 2026-07-28
basic/transports, Backward Compatibility, for clients): Streamable HTTP first; the deprecated
HTTP+SSE transport of 2024-11-05 when the POST is answered 404 or 405 without a JSON-RPC error
(a modern server's 404 for an unknown method carries one).

This is settled once, before the gateway starts, rather than inside a backend that switches
under the era layer: each transport then keeps its own supervision, era probing and legacy lanes
unchanged, and the choice is logged once. The question is a `server/discover`, which opens no
session on a modern server; on anything but such a 404/405 (a reply, another status, no answer
at all) the URL stays Streamable HTTP, whose backend then reports and retries as it always does.

`examine` is the same question asked for `connect`'s start (cli/startup.py): it also returns the
answer, with how a URL that gave none was not reached (refused, unknown host, TLS, no answer in
time), and opens the HTTP+SSE stream when that is the transport (closed once its head is read),
so that a wrong path is told before the gateway starts rather than retried.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
from dataclasses import dataclass

import aiohttp
from multidict import CIMultiDict

from gateway import __version__
from gateway.backends import web
from gateway.config import BackendConfig, HttpTarget, SseTarget
from gateway.protocol import headers, jsonrpc, meta
from gateway.protocol.jsonrpc import Message
from gateway.proxies import env_proxy

log = logging.getLogger("gateway.backend")

# Statuses of a server without the Streamable HTTP endpoint (what mcp-remote's http-first reads
# as "try SSE"). The spec lists 400 too, but a Streamable HTTP server answers 400 to a request it
# finds malformed; that stays Streamable HTTP, where the error is then shown as it is.
LEGACY_STATUSES = frozenset({404, 405})
# Enough of a refusal's body to see whether it is a JSON-RPC error.
MAX_PROBE_BODY = 64 * 1024
PROBE: Message = {
    "jsonrpc": "2.0",
    "id": "gateway-transport-probe",
    "method": "server/discover",
    "params": {"_meta": meta.gateway_meta({"name": "mcp-gateway", "version": __version__})},
}


def is_legacy_refusal(status: int, body: bytes) -> bool:
    """A POST answer that means "no Streamable HTTP here": 404/405 without a JSON-RPC error."""
    if status not in LEGACY_STATUSES:
        return False
    reply = jsonrpc.decode(body) if body else None
    return not (isinstance(reply, dict) and isinstance(reply.get("error"), dict))


def as_sse(config: BackendConfig) -> BackendConfig:
    """The same backend on the HTTP+SSE transport: the URL is taken as its SSE endpoint, and the
    era is legacy, as the config loader pins it for an `sse:` target (the transport is)."""
    target = config.target
    assert isinstance(target, HttpTarget)
    sse = SseTarget(url=target.url, headers=target.headers, tls=target.tls, limits=target.limits)
    return dataclasses.replace(config, target=sse, era="legacy")


@dataclass(frozen=True)
class Answer:
    """What a URL answered one start-up question (`ask`): a status, with what a refusal says,
    or, when nothing was answered, how it was not reached (`unreached`: refused, dns, tls,
    timeout, other) and the reason in words."""

    status: int | None = None
    body: bytes = b""
    content_type: str = ""
    challenges: tuple[str, ...] = ()  # the WWW-Authenticate values of a 401/403
    unreached: str | None = None
    reason: str = ""

    @property
    def jsonrpc_error(self) -> bool:
        reply = jsonrpc.decode(self.body) if self.body else None
        return isinstance(reply, dict) and isinstance(reply.get("error"), dict)


def _unreached(exc: BaseException) -> tuple[str, str]:
    """How a URL was not reached, as a kind and the reason in words (no credential in it)."""
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return "dns", str(exc.os_error.strerror or exc.os_error)
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return "tls", f"certificate not trusted: {exc.certificate_error}"
    if isinstance(exc, aiohttp.ClientSSLError):
        return "tls", str(exc.os_error.strerror or exc.os_error)
    if isinstance(exc, aiohttp.ClientConnectorError):
        if exc.os_error.errno == errno.ECONNREFUSED:
            return "refused", "connection refused"
        return "other", str(exc.os_error.strerror or exc.os_error)
    if isinstance(exc, TimeoutError):
        return "timeout", "no answer"
    return "other", str(exc) or type(exc).__name__


async def ask(config: BackendConfig, method: str = "POST") -> Answer:
    """One start-up question to the backend's URL, within its connect timeout: the
    `server/discover` POST of Streamable HTTP, or (GET) the opening of an HTTP+SSE stream,
    which is closed as soon as its head is read."""
    url = web.target_url(config)
    fixed = web.fixed_headers(config)
    if method == "POST":
        sent = CIMultiDict(
            [
                *fixed,
                ("Content-Type", "application/json"),
                ("Accept", "application/json, text/event-stream"),
                *headers.derive(PROBE).items(),
            ]
        )
        data: bytes | None = jsonrpc.encode(PROBE)
    else:
        sent, data = CIMultiDict([*fixed, ("Accept", "text/event-stream")]), None
    within = config.connect_timeout
    try:
        async with (
            web.session(
                config,
                limit=1,
                default_timeout=web.timeout(within, within),
                tls=web.ssl_context(config),
                proxy=env_proxy(url, f"backend {config.name}"),
            ) as session,
            session.request(method, url, data=data, headers=sent, allow_redirects=False) as resp,
        ):
            body = bytearray()
            # (an SSE stream's body never ends: its head is the answer)
            while method == "POST" and len(body) < MAX_PROBE_BODY:
                chunk = await resp.content.read(MAX_PROBE_BODY - len(body))
                if not chunk:
                    break
                body += chunk
            return Answer(
                status=resp.status,
                body=bytes(body),
                content_type=resp.content_type,
                challenges=tuple(resp.headers.getall("WWW-Authenticate", ())),
            )
    except (aiohttp.ClientError, TimeoutError) as exc:
        kind, reason = _unreached(exc)
        return Answer(unreached=kind, reason=reason)


async def examine(
    config: BackendConfig, transport: str, *, open_stream: bool = True
) -> tuple[BackendConfig, Answer]:
    """`config` on the transport the URL speaks (`transport`: auto, http or sse; see
    `settle`), and the answer that decided it: for HTTP+SSE, the stream's opening (with
    `open_stream`; else the POST's refusal), so that a wrong path is known at once."""
    if transport == "sse":
        sse = as_sse(config)
        return sse, await ask(sse, "GET")
    url = web.target_url(config)
    answer = await ask(config)
    if transport != "auto":
        return config, answer
    if answer.unreached is not None:
        log.warning(
            "backend %s: transport: Streamable HTTP (%s not reached: %s)",
            config.name,
            url,
            answer.reason,
        )
        return config, answer
    assert answer.status is not None
    if is_legacy_refusal(answer.status, answer.body):
        log.info(
            "backend %s: transport: HTTP+SSE (2024-11-05); the POST to %s was answered HTTP %d",
            config.name,
            url,
            answer.status,
        )
        sse = as_sse(config)
        return sse, await ask(sse, "GET") if open_stream else answer
    log.info("backend %s: transport: Streamable HTTP (%s)", config.name, url)
    return config, answer


async def settle(config: BackendConfig) -> BackendConfig:
    """`config` (a Streamable HTTP backend) as it is, or on HTTP+SSE if the server says so."""
    settled, _ = await examine(config, "auto", open_stream=False)
    return settled
