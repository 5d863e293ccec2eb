"""Authorization server metadata discovery (authorization-server-discovery, Authorization
Server Metadata Discovery; RFC 8414 3 and 5): the URLs to try, in order, and the check that a
document speaks for the configured issuer. What the gateway needs from it: `jwks_uri` (JWT
access tokens) and `introspection_endpoint` (opaque tokens)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from gateway.caller_auth.fetch import Fetcher, FetchFailed
from gateway.config.auth import url_problem

OAUTH = "/.well-known/oauth-authorization-server"
OPENID = "/.well-known/openid-configuration"


@dataclass(frozen=True)
class ServerMetadata:
    issuer: str
    jwks_uri: str | None
    introspection_endpoint: str | None


def metadata_urls(issuer: str) -> tuple[str, ...]:
    """Where the issuer's metadata may be, in the order clients must try them (pure): with a
    path, OAuth then OpenID by path insertion, then OpenID appended to the path; without one,
    OAuth then OpenID at the root."""
    parts = urlsplit(issuer)
    origin = f"{parts.scheme}://{parts.netloc}"
    path = parts.path.rstrip("/")
    if not path:
        return (origin + OAUTH, origin + OPENID)
    return (origin + OAUTH + path, origin + OPENID + path, origin + path + OPENID)


def parse_metadata(issuer: str, doc: Any) -> ServerMetadata | str:
    """The endpoints of a document fetched for `issuer`, or why it cannot be used (pure). The
    document's `issuer` must be identical to the configured one (no normalisation), else a
    server could speak for another; the endpoints must be https (http only on loopback)."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    if doc.get("issuer") != issuer:
        return "its issuer is not the configured issuer"
    endpoints: dict[str, str | None] = {}
    for name in ("jwks_uri", "introspection_endpoint"):
        value = doc.get(name)
        if value is not None and (not isinstance(value, str) or url_problem(value, https=True)):
            return f"{name} is not an https URL"
        endpoints[name] = value
    return ServerMetadata(issuer, endpoints["jwks_uri"], endpoints["introspection_endpoint"])


async def discover(fetcher: Fetcher, issuer: str) -> ServerMetadata:
    """The first usable document of `metadata_urls`; 404 (or another error status) moves on to
    the next URL, an unreachable server or a document for another issuer ends the search."""
    last = "no metadata document found"
    for url in metadata_urls(issuer):
        try:
            doc = await fetcher.get_json(url)
        except FetchFailed as exc:
            if exc.status is None:
                raise
            last = str(exc)
            continue
        found = parse_metadata(issuer, doc)
        if isinstance(found, str):
            raise FetchFailed(url, found)
        return found
    raise FetchFailed(issuer, last)
