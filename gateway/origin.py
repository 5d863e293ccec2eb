"""Where a client request came from, as the gateway's layers see it: the front end, the peer,
the headers as received, the legacy client session it belongs to, and the caller's `Identity`.

Made by the front ends, read by the engine (policy, rate limits, tasks), the backends that bind
state to a caller (held calls, per-client children, legacy lanes, per-caller tokens) and the
telemetry (audit, trace context). Imports nothing of the data path, so every layer may import it.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from gateway.caller_auth.identity import Identity
from gateway.collector import collect_soon

TRACE_HEADERS = ("traceparent", "tracestate")
# Header fields as received: a mapping, or (name, value) pairs in arrival order with repeats.
HeaderFields = Mapping[str, str] | Iterable[tuple[str, str]]


class ClientSession(Protocol):
    """A legacy client's session as the backends that keep state per client see it: a random
    key (not the session's id, which is a credential) and the event of its end."""

    key: str
    ended: asyncio.Event


class LegacyClient:
    """A legacy (initialize-based) client session, as the backends see it: who to keep a
    backend session for, and when it ends. A backend that speaks both eras serves a legacy
    client's requests in the legacy era, on a session of its own (backends/era/dual.py), so that
    the server's requests during a call reach that client."""

    __slots__ = ("_closers", "closed")

    def __init__(self) -> None:
        self._closers: list[Callable[[], None]] = []
        self.closed = False

    def on_close(self, closer: Callable[[], None]) -> None:
        """Run `closer` when the session ends (at once if it has)."""
        if self.closed:
            closer()
        else:
            self._closers.append(closer)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        closers, self._closers = self._closers, []
        for closer in closers:
            closer()
        # What the session held is mostly in cycles, in the oldest generation by now.
        collect_soon()


class Origin:
    """Where a client request came from. A plain class: one is made per request."""

    __slots__ = ("frontend", "headers", "identity", "legacy", "peer", "session")

    def __init__(
        self,
        frontend: str,
        peer: str | None = None,
        headers: HeaderFields | None = None,
        session: ClientSession | None = None,
        legacy: LegacyClient | None = None,
        identity: Identity | None = None,
    ) -> None:
        self.frontend = frontend  # "http" | "stdio" | "gateway" (its own requests)
        self.peer = peer
        # All request headers (HTTP), for the traffic tap (which redacts them) and trace context.
        self.headers = headers
        # The legacy session the request belongs to, for backends that keep a child per
        # client (None: a modern, stateless request).
        self.session = session
        # The same session as a backend speaking both eras sees it (frontends/legacy/front.py
        # marks the requests it forwards); None: a modern client, or the gateway's own request.
        self.legacy = legacy
        # Who is calling, when the front end established it (auth on HTTP, a configured
        # identity on stdio); None: no authentication configured.
        self.identity = identity

    def within(self, session: ClientSession) -> Origin:
        """The same origin, as a request of a legacy client's session."""
        return Origin(self.frontend, self.peer, self.headers, session, self.legacy, self.identity)

    def for_legacy(self, client: LegacyClient) -> Origin:
        """The same origin, marked as a request of the legacy session `client`."""
        return Origin(self.frontend, self.peer, self.headers, self.session, client, self.identity)

    def caller(self) -> str:
        """Who is asking, for binding state to them: the front end and the caller's identity
        when one was established, else a digest of the request's credentials (stdio has one
        caller, its parent process)."""
        if self.identity is not None:
            return f"{self.frontend}:{self.identity.key()}"
        return f"{self.frontend}:{credentials_digest(self.authorization())}"

    def authorization(self) -> str | None:
        """The request's Authorization header (HTTP), if it had one."""
        if self.headers is None:
            return None
        fields = self.headers.items() if isinstance(self.headers, Mapping) else self.headers
        for name, value in fields:
            if name.lower() == "authorization":
                return value
        return None

    def trace_headers(self) -> dict[str, str]:
        """W3C trace context from transport headers, used when `_meta` carries none. A mapping
        is looked up, not scanned: the HTTP front end's (aiohttp's) ignores case."""
        if self.headers is None:
            return {}
        if isinstance(self.headers, Mapping):
            return {k: v for k in TRACE_HEADERS if (v := self.headers.get(k)) is not None}
        fields = self.headers
        out: dict[str, str] = {}
        for name, value in fields:
            key = name.lower()
            if key in TRACE_HEADERS:
                out.setdefault(key, value)
        return out


def credentials_digest(authorization: str | None) -> str:
    """Whose a piece of state is: a digest of the credentials (none is an owner too), so the
    credentials themselves are never kept."""
    return hashlib.sha256((authorization or "").encode("utf-8", "surrogateescape")).hexdigest()


STDIO_ORIGIN = Origin("stdio")
# The gateway's own requests (catalog loads), whichever client's request made them necessary.
GATEWAY_ORIGIN = Origin("gateway")
