"""The gateway's exceptions and the one place where they become wire errors.

    GatewayError
    ├── Refused                  answered by the gateway itself (unknown name, bad cursor, ...)
    │   ├── InsufficientScope    the caller's token lacks scopes the request needs (HTTP 403)
    │   ├── RateLimited          the caller is over a rate limit (HTTP 429)
    │   ├── Overloaded           too many requests in flight, and the queue full or waited out
    │   │                        (HTTP 503)
    │   └── SessionsUnavailable  (frontends/legacy/records.py) the replicas' shared store of legacy
    │                            sessions does not answer (HTTP 503)
    └── BackendError             a backend could not answer a request
        ├── BackendUnavailable   not running, crashed mid-call, connection refused
        │   └── BackendDown      known to be unreachable: failed at once, retried in the background
        ├── BackendConnectionLost  an HTTP connection broke after the request went out
        ├── BackendTimeout       no answer within the configured time
        ├── BackendProtocolError answered with something that is not MCP
        └── BackendOverloaded    too many requests in flight to it, or no room for another
                                 child (isolation: per_session) (HTTP 503)

Every request the dispatcher handles ends as a JSON-RPC message: `to_wire` is where an
exception becomes one, and `http_status` is the one table from error code to HTTP status.
(Config problems are `config.ConfigInvalid`: they stop the process, they never reach the wire.)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from gateway.protocol import codes, jsonrpc
from gateway.protocol.jsonrpc import Message, RequestId

log = logging.getLogger("gateway")


class GatewayError(Exception):
    code: int = codes.INTERNAL_ERROR

    def data(self) -> dict[str, Any] | None:
        """The wire error's `data` member, for errors that tell the client how to act."""
        return None


class Refused(GatewayError):
    """A request the gateway answers with an error itself, without calling any backend.
    `reason` names it for the rejection metric when it is one operators watch."""

    def __init__(self, code: int, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason


class InsufficientScope(Refused):
    """The policy allows the request only with scopes the caller's token lacks: the wire error
    names them (`data.scope`, space-separated as in a challenge) so the HTTP front end can send
    an `insufficient_scope` challenge and a client can step up."""

    def __init__(self, scopes: frozenset[str], message: str) -> None:
        super().__init__(codes.INSUFFICIENT_SCOPE, message, "insufficient_scope")
        self.scopes = scopes

    def data(self) -> dict[str, Any]:
        return {"scope": " ".join(sorted(self.scopes))}


class RateLimited(Refused):
    """Over a rate limit: `retry_after` seconds until a retry can succeed (`data.retryAfter`;
    HTTP: Retry-After, whole seconds rounded up)."""

    def __init__(self, retry_after: float, message: str) -> None:
        super().__init__(codes.RATE_LIMITED, message, "rate_limited")
        self.retry_after = retry_after

    def data(self) -> dict[str, Any]:
        return {"retryAfter": self.retry_after}


class Overloaded(Refused):
    """More client requests in flight than `overload.max_in_flight`, and the queue full or its
    wait over: come back in `retry_after` seconds (HTTP 503 with Retry-After)."""

    def __init__(self, retry_after: float, message: str) -> None:
        super().__init__(codes.GATEWAY_OVERLOADED, message, "overloaded")
        self.retry_after = retry_after

    def data(self) -> dict[str, Any]:
        return {"retryAfter": self.retry_after}


class BackendError(GatewayError):
    def __init__(self, backend: str, detail: str) -> None:
        super().__init__(f"backend {backend!r}: {detail}")
        self.backend = backend


class BackendUnavailable(BackendError):
    code = codes.BACKEND_UNAVAILABLE


class BackendDown(BackendUnavailable):
    """The backend could not be reached on its last attempt (command not found, connection
    refused, the child exited before it served) and is being retried in the background:
    requests fail at once instead of waiting, and its outage was logged once, not per request."""


class BackendLoginNeeded(BackendUnavailable):
    """The gateway has no token the backend accepts (yet): a login is needed or under way. The
    backend was reached, but told nothing of itself, so nothing (its era) is learnt from it."""


class SessionExpired(BackendUnavailable):
    """A legacy HTTP backend no longer knows the gateway's session (404): initialise again."""


class BackendConnectionLost(BackendError):
    """The connection broke after the request's bytes may have reached the backend. It is not
    sent again (it may have run), and whether it ran cannot be known: a code of its own, so a
    client does not take it for "unavailable" (nothing was sent) and blindly retry."""

    code = codes.BACKEND_CONNECTION_LOST


class BackendTimeout(BackendError):
    code = codes.BACKEND_TIMEOUT


class BackendProtocolError(BackendError):
    code = codes.BACKEND_PROTOCOL_ERROR


class BackendOverloaded(BackendError):
    """A backend has as many requests in flight as its `max_in_flight` (and its queue is full
    or waited out), or, with a child per client, all the children it may start; a backend
    error (not a refusal) so that fan-outs skip it under fail_open like a backend that is down.
    `retry_after`: seconds after which the client may try again (HTTP: Retry-After)."""

    code = codes.GATEWAY_OVERLOADED

    def __init__(self, backend: str, detail: str, retry_after: float = 1.0) -> None:
        super().__init__(backend, detail)
        self.retry_after = retry_after

    def data(self) -> dict[str, Any]:
        return {"retryAfter": self.retry_after}


def to_wire(exc: Exception, id_: RequestId | None) -> Message:
    if isinstance(exc, GatewayError):
        return jsonrpc.error(id_, exc.code, str(exc), exc.data())
    log.exception("unexpected error while handling a request", exc_info=exc)
    return jsonrpc.error(id_, codes.INTERNAL_ERROR, "Internal gateway error")


HTTP_STATUS: Final[Mapping[int, int]] = MappingProxyType(
    {
        codes.PARSE_ERROR: 400,
        codes.INVALID_REQUEST: 400,
        codes.INVALID_PARAMS: 400,
        codes.HEADER_MISMATCH: 400,
        codes.MISSING_REQUIRED_CLIENT_CAPABILITY: 400,
        codes.UNSUPPORTED_PROTOCOL_VERSION: 400,
        codes.METHOD_NOT_FOUND: 404,
        # These carry what a client needs to act (a scope to step up to, a delay), which
        # clients and intermediaries read from the status and its header (RFC 6750, RFC 6585,
        # RFC 9110 15.6.4: a load balancer sends a 503's request to another replica).
        codes.INSUFFICIENT_SCOPE: 403,
        codes.RATE_LIMITED: 429,
        codes.GATEWAY_OVERLOADED: 503,
        codes.SHARED_STATE_UNAVAILABLE: 503,
    }
)


# The statuses a legacy session's replies keep (2025-11-25 transports): what an HTTP client or
# intermediary must act on whatever the era (a scope to step up to, when to retry). In that era
# every other JSON-RPC error travels as 200, as the servers behind us send it: a 404 there means
# "the session is gone, start a new one", and a 400 makes clients drop the error's code and data.
LEGACY_HTTP_STATUS: Final[Mapping[int, int]] = MappingProxyType(
    {
        code: status
        for code, status in HTTP_STATUS.items()
        if code
        in (
            codes.INSUFFICIENT_SCOPE,
            codes.RATE_LIMITED,
            codes.GATEWAY_OVERLOADED,
            codes.SHARED_STATE_UNAVAILABLE,
        )
    }
)


def http_status(reply: Message, table: Mapping[int, int] = HTTP_STATUS) -> int:
    """HTTP status for a reply; errors not in the table (tool failures, our backend errors)
    travel as 200 so every client reads the JSON-RPC error rather than a bare HTTP failure.
    `table`: LEGACY_HTTP_STATUS for the replies of a legacy session."""
    if "error" not in reply:
        return 200
    code = jsonrpc.error_code(reply)
    return table.get(code, 200) if code is not None else 200
