"""Learning a backend's era and opening a legacy session on it (basic/versioning, Backward
Compatibility with Initialization-Based Versions; transports/stdio, Backward Compatibility).

`server/discover` is asked first, waiting up to the backend's `connect_timeout` for the answer
(a slow starter is silent too until it has started); anything but a recognised modern answer
means legacy, which then gets the `initialize` handshake. A modern error to that `initialize`
(e.g. -32020 for the missing MCP-Protocol-Version header) still proves a modern server
(`ProvenModern`): one without a `server/discover` of its own gets a discovery result made from
its answers (discovery.py)."""

from __future__ import annotations

from typing import Any

from gateway import __version__
from gateway.backends.base import GATEWAY_CALL
from gateway.backends.era import discovery
from gateway.backends.era.link import Link, SessionLink
from gateway.backends.era.translate import LegacySession, session_from
from gateway.errors import (
    BackendLoginNeeded,
    BackendProtocolError,
    BackendTimeout,
    BackendUnavailable,
)
from gateway.protocol import meta
from gateway.protocol.jsonrpc import Message

GATEWAY_INFO = {"name": "mcp-gateway", "version": __version__}
# What the gateway offers a legacy backend on behalf of all its clients; a client without the
# capability gets no question, and the backend an error for it, but for roots: those are always
# answered, with the backend's `roots:` where no client's can be asked. No `listChanged`: the
# gateway never tells a backend its roots changed (a client's change reaches a backend with the
# next question asked in that client's request).
GATEWAY_CAPABILITIES: dict[str, Any] = {
    "elicitation": {"form": {}, "url": {}},
    "sampling": {},
    "roots": {},
}


async def ignore(_: Message) -> None:
    """A sink for exchanges whose notifications nobody wants."""
    return None


class ProvenModern(BackendProtocolError):
    """`initialize` was answered with an error only a modern server sends."""

    def __init__(self, name: str, reply: Message) -> None:
        super().__init__(name, f"initialize failed: {error_words(reply)}")
        self.reply = reply


def error_words(reply: Message) -> str:
    """An error reply as a log line shows it: its code and message, not a dict's repr."""
    error = reply.get("error")
    if not isinstance(error, dict):
        return "no result and no error"
    message = error.get("message")
    return f"error {error.get('code')}" + (f" ({message})" if isinstance(message, str) else "")


def is_modern_answer(reply: Message) -> bool:
    """A DiscoverResult, or an error only a modern server sends."""
    return discovery.is_discover_result(reply) or discovery.is_modern_error(reply)


async def probe(link: Link, channel: bool, within: float) -> tuple[str, list[str] | None]:
    """ "modern" or "legacy", and for a modern backend that answered with a modern error
    instead of a DiscoverResult, the versions it named (else None); BackendUnavailable when
    the backend was not reached at all."""
    msg: Message = {
        "jsonrpc": "2.0",
        "id": "gateway-probe",
        "method": "server/discover",
        "params": {"_meta": meta.gateway_meta(GATEWAY_INFO)},
    }
    try:
        reply = await link.exchange(msg, ignore, within)
    except (BackendTimeout, BackendProtocolError):
        return "legacy", None
    except BackendUnavailable as exc:
        if channel or not link.up or isinstance(exc, BackendLoginNeeded):
            raise  # not reached at all, or refused for want of a login: nothing learnt
        return "legacy", None  # an HTTP refusal without a modern error
    if discovery.is_modern_error(reply):
        return "modern", discovery.supported_versions(reply) or []
    return ("modern" if discovery.is_discover_result(reply) else "legacy"), None


async def handshake(link: Link, within: float) -> LegacySession:
    """`initialize` and `notifications/initialized`: the link then takes the server's requests."""
    # (HTTP: the session is the transport's, begun before `initialize` and told the version.)
    session_link = link if isinstance(link, SessionLink) else None
    if session_link is not None:
        session_link.begin_session()
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
        if discovery.is_modern_error(reply):
            raise ProvenModern(link.name, reply)
        raise BackendProtocolError(link.name, f"initialize failed: {error_words(reply)}")
    version = result.get("protocolVersion")
    if version not in meta.LEGACY_VERSIONS:
        raise BackendProtocolError(link.name, f"initialize answered version {version!r}")
    session = session_from(result)
    if session_link is not None:
        session_link.agreed(session.version)
    await link.send({"jsonrpc": "2.0", "method": "notifications/initialized"}, GATEWAY_CALL)
    link.takes_requests = True
    return session
