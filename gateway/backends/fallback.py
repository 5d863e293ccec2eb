"""Which HTTP transport a URL speaks, for `connect --transport auto` (2025-11-25 and 2026-07-28
basic/transports, Backward Compatibility, for clients): Streamable HTTP first; the deprecated
HTTP+SSE transport of 2024-11-05 when the POST is answered 404 or 405 without a JSON-RPC error
(a modern server's 404 for an unknown method carries one).

This is settled once, before the gateway starts, rather than inside a backend that switches
under the era layer: each transport then keeps its own supervision, era probing and legacy lanes
unchanged, and the choice is logged once. The question is a `server/discover`, which opens no
session on a modern server; on anything but such a 404/405 (a reply, another status, no answer
at all) the URL stays Streamable HTTP, whose backend then reports and retries as it always does.
"""

from __future__ import annotations

import dataclasses
import logging

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


async def settle(config: BackendConfig) -> BackendConfig:
    """`config` (a Streamable HTTP backend) as it is, or on HTTP+SSE if the server says so."""
    url = web.target_url(config)
    tls = web.ssl_context(config)
    sent = CIMultiDict(
        [
            *web.fixed_headers(config),
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            *headers.derive(PROBE).items(),
        ]
    )
    within = config.connect_timeout
    try:
        async with (
            web.session(
                config,
                limit=1,
                default_timeout=web.timeout(within, within),
                tls=tls,
                proxy=env_proxy(url, f"backend {config.name}"),
            ) as session,
            session.post(
                url, data=jsonrpc.encode(PROBE), headers=sent, allow_redirects=False
            ) as resp,
        ):
            status = resp.status
            body = bytearray()
            while len(body) < MAX_PROBE_BODY and (
                chunk := await resp.content.read(MAX_PROBE_BODY - len(body))
            ):
                body += chunk
    except (aiohttp.ClientError, TimeoutError) as exc:
        reason = web.failure(config.name, exc, within)
        log.warning(
            "backend %s: transport: Streamable HTTP (%s not reached: %s)", config.name, url, reason
        )
        return config
    if is_legacy_refusal(status, bytes(body)):
        log.info(
            "backend %s: transport: HTTP+SSE (2024-11-05); the POST to %s was answered HTTP %d",
            config.name,
            url,
            status,
        )
        return as_sse(config)
    log.info("backend %s: transport: Streamable HTTP (%s)", config.name, url)
    return config
