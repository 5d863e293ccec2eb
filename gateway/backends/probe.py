"""Learning a backend's era and opening a legacy session on it (basic/versioning, Backward
Compatibility with Initialization-Based Versions; transports/stdio, Backward Compatibility).

`server/discover` is asked first; anything but a recognised modern answer means legacy, which
then gets the `initialize` handshake."""

from __future__ import annotations

from typing import Any

from gateway import __version__
from gateway.backends.link import Link
from gateway.backends.translate import LegacySession, session_from
from gateway.errors import BackendProtocolError, BackendTimeout, BackendUnavailable
from gateway.protocol import codes, meta
from gateway.protocol.jsonrpc import Message

# A legacy server may stay silent on a method it does not know; past this the probe gives up
# and the backend is taken for legacy (transports/stdio, Backward Compatibility).
PROBE_TIMEOUT = 3.0
GATEWAY_INFO = {"name": "mcp-gateway", "version": __version__}
# What the gateway offers a legacy backend on behalf of all its clients; a client without the
# capability gets no question, and the backend an error for it.
GATEWAY_CAPABILITIES: dict[str, Any] = {
    "elicitation": {"form": {}, "url": {}},
    "sampling": {},
    "roots": {},
}


async def ignore(_: Message) -> None:
    """A sink for exchanges whose notifications nobody wants."""
    return None


def is_modern_answer(reply: Message) -> bool:
    """A DiscoverResult, or a modern error naming the versions it supports."""
    result = reply.get("result")
    if isinstance(result, dict):
        return isinstance(result.get("supportedVersions"), list)
    error = reply.get("error")
    if not isinstance(error, dict) or error.get("code") != codes.UNSUPPORTED_PROTOCOL_VERSION:
        return False
    data = error.get("data")
    return isinstance(data, dict) and isinstance(data.get("supported"), list)


async def probe(link: Link, channel: bool) -> str:
    """ "modern" or "legacy"; BackendUnavailable when the backend was not reached at all."""
    msg: Message = {
        "jsonrpc": "2.0",
        "id": "gateway-probe",
        "method": "server/discover",
        "params": {"_meta": meta.gateway_meta(GATEWAY_INFO)},
    }
    try:
        reply = await link.exchange(msg, ignore, PROBE_TIMEOUT)
    except (BackendTimeout, BackendProtocolError):
        return "legacy"
    except BackendUnavailable:
        if channel or not link.up:
            raise  # not reached at all: nothing learnt
        return "legacy"  # an HTTP refusal without a modern error
    return "modern" if is_modern_answer(reply) else "legacy"


async def handshake(link: Link, within: float) -> LegacySession:
    """`initialize` and `notifications/initialized`: the link then takes the server's requests."""
    begin = getattr(link, "begin_session", None)
    if begin is not None:
        begin()
    init: Message = {
        "jsonrpc": "2.0",
        "id": "gateway-initialize",
        "method": "initialize",
        "params": {
            "protocolVersion": meta.LEGACY_VERSIONS[0],
            "capabilities": GATEWAY_CAPABILITIES,
            "clientInfo": GATEWAY_INFO,
        },
    }
    reply = await link.exchange(init, ignore, within)
    result = reply.get("result")
    if not isinstance(result, dict):
        raise BackendProtocolError(link.name, f"initialize failed: {reply.get('error')}")
    version = result.get("protocolVersion")
    if version not in meta.LEGACY_VERSIONS:
        raise BackendProtocolError(link.name, f"initialize answered version {version!r}")
    session = session_from(result)
    agreed = getattr(link, "agreed", None)
    if agreed is not None:
        agreed(session.version)
    await link.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    link.takes_requests = True
    return session
