"""Finding a backend's authorization server: its protected resource metadata (RFC 9728), then
the server's own metadata (RFC 8414 / OpenID Connect Discovery), each checked as
basic/authorization/authorization-server-discovery requires."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.backend_auth.fetch import FetchFailed, OAuthHttp
from gateway.backend_auth.wire import (
    Challenge,
    canonical_resource,
    metadata_urls,
    outbound_problem,
    prm_urls,
    resource_covers,
)


class DiscoveryFailed(Exception):
    """The backend's authorization server could not be found or trusted; the message says
    which document and why. `no_issuer`: nothing names one (pinning one would do); `detail`:
    the message without what to do about it."""

    def __init__(self, message: str, *, no_issuer: bool = False, detail: str = "") -> None:
        super().__init__(message)
        self.no_issuer = no_issuer
        self.detail = detail or message


@dataclass(frozen=True)
class ServerInfo:
    resource: str  # the resource indicator sent on every authorization and token request
    issuer: str
    metadata: dict[str, Any]
    scopes_supported: list[str] | None  # the PRM's

    def endpoint(self, name: str) -> str | None:
        value = self.metadata.get(name)
        return value if isinstance(value, str) and value else None

    def strings(self, name: str) -> list[str] | None:
        value = self.metadata.get(name)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
        return None

    @property
    def supports_cimd(self) -> bool:
        return self.metadata.get("client_id_metadata_document_supported") is True

    @property
    def sends_iss(self) -> bool:
        return self.metadata.get("authorization_response_iss_parameter_supported") is True


async def protected_resource(
    http: OAuthHttp, backend: str, challenge: Challenge | None
) -> tuple[str, dict[str, Any]] | None:
    """The PRM and where it was found: from the challenge's `resource_metadata` when there is
    one, else the well-known locations in order; None when none answers with a document."""
    urls = prm_urls(backend)
    if challenge is not None and challenge.resource_metadata:
        urls = [challenge.resource_metadata, *urls]
    for url in urls:
        try:
            reply = await http.get(url)
        except FetchFailed:
            continue
        if reply.status == 200 and isinstance(reply.body, dict):
            return url, reply.body
    return None


async def server_metadata(http: OAuthHttp, issuer: str) -> dict[str, Any]:
    """The first metadata document, in the spec's order, whose `issuer` is exactly the one
    the URL was built from; one that names another issuer is never used (RFC 8414 3.3)."""
    if (why := outbound_problem(issuer)) is not None:
        raise DiscoveryFailed(f"authorization server {issuer}: {why}")
    mismatched = False
    for url in metadata_urls(issuer):
        try:
            reply = await http.get(url)
        except FetchFailed:
            continue
        if reply.status != 200 or not isinstance(reply.body, dict):
            continue
        if reply.body.get("issuer") != issuer:
            mismatched = True
            continue
        return reply.body
    if mismatched:
        raise DiscoveryFailed(f"the metadata of {issuer} names another issuer; not used")
    raise DiscoveryFailed(f"no authorization server metadata found for {issuer}")


async def discover(
    http: OAuthHttp, backend: str, challenge: Challenge | None, configured_issuer: str | None
) -> ServerInfo:
    found = await protected_resource(http, backend, challenge)
    resource = canonical_resource(backend)
    supported: list[str] | None = None
    issuer = configured_issuer
    # Why no issuer is known, should none be: the metadata's absence, or its silence.
    missing = "no protected resource metadata found"
    if found is not None:
        where, prm = found
        missing = f"its protected resource metadata ({where}) lists no authorization_servers"
        advertised = prm.get("resource")
        if not isinstance(advertised, str) or not resource_covers(advertised, backend):
            raise DiscoveryFailed(
                f"the protected resource metadata is for {advertised!r}, not {backend}"
            )
        resource = advertised
        servers = prm.get("authorization_servers")
        named = [s for s in servers if isinstance(s, str)] if isinstance(servers, list) else []
        if configured_issuer is not None:
            # Pinned: the backend may not send the gateway's credentials (or its callers'
            # tokens, to exchange) to a server of its choosing.
            if named and configured_issuer not in named:
                raise DiscoveryFailed(
                    f"{backend} names authorization servers {', '.join(named)}, not the "
                    f"configured {configured_issuer}"
                )
        elif named:
            # RFC 9728 7.6: the choice is the client's; the first is the server's preference.
            issuer = named[0]
        scopes = prm.get("scopes_supported")
        if isinstance(scopes, list) and all(isinstance(s, str) for s in scopes):
            supported = scopes
    if issuer is None:
        # (connect's users pin it with a flag, a config's with its key: both are named)
        detail = f"{backend} names no authorization server ({missing})"
        raise DiscoveryFailed(
            f"{detail}; pin one with auth.authorization_server (connect: --authorization-server)",
            no_issuer=True,
            detail=detail,
        )
    metadata = await server_metadata(http, issuer)
    return ServerInfo(resource, issuer, metadata, supported)
