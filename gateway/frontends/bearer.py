"""The HTTP front end's bearer-token gate (basic/authorization, Access Token Usage and Error
Handling; RFC 6750; RFC 9728): every request on the MCP endpoint carries `Authorization:
Bearer`, checked before anything MCP is read; a missing or bad token is 401, a token without
the required scopes 403, each with a `WWW-Authenticate` challenge naming the protected
resource metadata, which is served here without a token. The identity found goes on the
request (IDENTITY) for `Origin`."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import hdrs, web

from gateway import errors
from gateway.caller_auth import challenge
from gateway.caller_auth.identity import Identity
from gateway.caller_auth.outage import Unavailable
from gateway.caller_auth.tokens import Rejected
from gateway.origin import Origin
from gateway.protocol import codes, jsonrpc
from gateway.protocol.jsonrpc import Message
from gateway.telemetry.api import Stats

if TYPE_CHECKING:
    # (a type only: the authenticator is made, and PyJWT loaded, only under `auth:`)
    from gateway.caller_auth.authenticator import Authenticator

log = logging.getLogger("gateway.http")

# Where the request's identity is kept on the aiohttp request (read by `origin_of`).
IDENTITY = web.RequestKey("gateway.identity", Identity)
JSON = "application/json"
# RFC 6750 2.3 names the query parameter; basic/authorization forbids tokens in the URI.
_QUERY_TOKEN = "access_token"


class Bearer:
    def __init__(self, authenticator: Authenticator, endpoint_path: str, stats: Stats) -> None:
        auth = authenticator.config
        self._auth = authenticator
        self._stats = stats
        self.metadata_url = challenge.metadata_url(auth.resource)
        self.paths = challenge.metadata_paths(auth.resource, endpoint_path)
        self._document = orjson.dumps(challenge.metadata_document(auth))
        self._scope = challenge.challenge_scope(auth)
        self._required = frozenset(auth.required_scopes)

    def routes(self) -> dict[str, Any]:
        return dict.fromkeys(self.paths, self.metadata)

    async def metadata(self, request: web.BaseRequest) -> web.StreamResponse:
        """The protected resource metadata (RFC 9728 3.2): no token needed, so a client can
        learn where to get one."""
        if request.method not in ("GET", "HEAD"):
            return web.Response(status=405, headers={"Allow": "GET, HEAD"})
        return web.Response(body=self._document, content_type=JSON)

    def _refuse(
        self,
        reason: str,
        status: int,
        message: str,
        *,
        error: str | None = None,
        code: int = codes.INVALID_REQUEST,
        data: Any = None,
    ) -> web.Response:
        self._stats.auth_failures[reason] += 1
        scope = self._scope
        if error == challenge.INSUFFICIENT_SCOPE:
            scope = challenge.scope_value(self._required)
        header = challenge.bearer(self.metadata_url, scope=scope, error=error)
        body = jsonrpc.encode(jsonrpc.error(None, code, message, data))
        return web.Response(
            status=status, body=body, content_type=JSON, headers={"WWW-Authenticate": header}
        )

    async def check(self, request: web.BaseRequest) -> web.Response | None:
        """None when the request may go on, its identity stored under IDENTITY; else the
        refusal to send."""
        if request.query_string and _QUERY_TOKEN in request.query:
            # (never read: a token in a URL ends up in logs and histories)
            message = "Access tokens go in the Authorization header, not the URL"
            return self._refuse("token_in_query", 400, message, error=challenge.INVALID_REQUEST)
        values = request.headers.getall(hdrs.AUTHORIZATION, ())
        if len(values) > 1:
            message = "One Authorization header, please"
            return self._refuse("invalid_request", 400, message, error=challenge.INVALID_REQUEST)
        scheme, _, token = values[0].partition(" ") if values else ("", "", "")
        if scheme.lower() != "bearer":
            # No credentials of ours: no error code (RFC 6750 3.1), just where to get some.
            return self._refuse("missing_token", 401, "Authorization required")
        try:
            identity = await self._auth.authenticate(token.strip(" "))
        except Rejected as exc:
            log.debug("bearer token refused: %s", exc.reason)
            message = "The access token is not valid"
            return self._refuse(exc.reason, 401, message, error=challenge.INVALID_TOKEN)
        except Unavailable as exc:
            return self._unavailable(exc)
        if not identity.has_scopes(self._required):
            refusal = errors.InsufficientScope(self._required, "The token lacks required scopes")
            return self._refuse(
                "insufficient_scope",
                403,
                str(refusal),
                error=challenge.INSUFFICIENT_SCOPE,
                code=refusal.code,
                data=refusal.data(),
            )
        request[IDENTITY] = identity
        return None

    def _unavailable(self, exc: Unavailable) -> web.Response:
        self._stats.auth_failures["unavailable"] += 1
        message = "The authorization server cannot be reached; try again later"
        body = jsonrpc.encode(jsonrpc.error(None, codes.BACKEND_UNAVAILABLE, message))
        retry = str(max(1, int(exc.retry_after)))
        return web.Response(
            status=503, body=body, content_type=JSON, headers={"Retry-After": retry}
        )

    def reply_headers(self, reply: Message) -> dict[str, str] | None:
        """The challenge for a reply refusing the caller for want of scopes (-31007: the policy
        allows the request only with scopes the token lacks), so a client can step up."""
        error = reply.get("error")
        if not isinstance(error, dict) or error.get("code") != codes.INSUFFICIENT_SCOPE:
            return None
        data = error.get("data")
        wanted = data.get("scope") if isinstance(data, dict) else None
        scope = challenge.scope_value(wanted) if isinstance(wanted, str) else None
        header = challenge.bearer(
            self.metadata_url, scope=scope, error=challenge.INSUFFICIENT_SCOPE
        )
        return {"WWW-Authenticate": header}


def identity_of(request: web.BaseRequest) -> Identity | None:
    return request.get(IDENTITY)


def origin_of(request: web.BaseRequest) -> Origin:
    """The request's `Origin`, as both eras of the HTTP endpoint hand it to the dispatcher."""
    return Origin("http", request.remote, request.headers, identity=identity_of(request))
