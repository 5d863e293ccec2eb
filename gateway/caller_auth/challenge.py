"""What the gateway tells clients about its protection (pure): the protected resource metadata
document (RFC 9728), where it is served, and the `WWW-Authenticate: Bearer` challenge (RFC 6750
section 3; basic/authorization, Scope Selection Strategy and Scope Challenge Handling)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from gateway.config import AuthConfig

WELL_KNOWN = "/.well-known/oauth-protected-resource"
# What may sit in a quoted challenge value as is; anything else (from a backend's error data,
# say) is left out rather than escaped, so a challenge is always one well-formed header.
_SCOPE_TOKEN = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]+")

# RFC 6750 3.1 error codes.
INVALID_TOKEN = "invalid_token"
INVALID_REQUEST = "invalid_request"
INSUFFICIENT_SCOPE = "insufficient_scope"


def metadata_paths(resource: str, endpoint_path: str) -> tuple[str, ...]:
    """The paths the metadata is served at: the root form, and the path-inserted forms of the
    resource's path and of the listener's own (RFC 9728 3.1; the same unless a proxy rewrites
    paths), which clients try first (authorization-server-discovery, Protected Resource
    Metadata Discovery Requirements)."""
    paths = [WELL_KNOWN]
    for path in (urlsplit(resource).path, endpoint_path):
        trimmed = path.rstrip("/")
        if trimmed and WELL_KNOWN + trimmed not in paths:
            paths.append(WELL_KNOWN + trimmed)
    return tuple(paths)


def metadata_url(resource: str) -> str:
    """The metadata's URL for `resource`: its origin, the well-known prefix, then its path."""
    parts = urlsplit(resource)
    return f"{parts.scheme}://{parts.netloc}{WELL_KNOWN}{parts.path.rstrip('/')}"


def metadata_document(auth: AuthConfig) -> dict[str, Any]:
    doc: dict[str, Any] = {"resource": auth.resource}
    if auth.issuer is not None:
        doc["authorization_servers"] = [auth.issuer]
    if auth.scopes_supported:
        doc["scopes_supported"] = list(auth.scopes_supported)
    doc["bearer_methods_supported"] = ["header"]  # never a query string or a form body
    return doc


def scope_value(scopes: str | tuple[str, ...] | frozenset[str]) -> str | None:
    """A challenge's scope value: space-separated scope tokens, None if none is well-formed."""
    items = scopes.split() if isinstance(scopes, str) else sorted(scopes)
    good = [s for s in items if _SCOPE_TOKEN.fullmatch(s)]
    return " ".join(good) if good else None


def bearer(
    resource_metadata: str,
    *,
    scope: str | None = None,
    error: str | None = None,
    description: str | None = None,
) -> str:
    """`Bearer k="v", ...` with the error first (as RFC 6750's examples have it). Values are
    ours (fixed texts, URLs from the config, checked scope tokens): nothing needs escaping,
    but quotes and backslashes are escaped anyway."""
    params = [("error", error), ("error_description", description)]
    params += [("scope", scope), ("resource_metadata", resource_metadata)]
    return "Bearer " + ", ".join(f'{k}="{_quoted(v)}"' for k, v in params if v is not None)


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def challenge_scope(auth: AuthConfig) -> str | None:
    """What a 401 tells a client to ask for: the required scopes, else the supported ones."""
    return scope_value(auth.required_scopes or auth.scopes_supported)
