"""A backend's `auth:` section: how the gateway logs in to an HTTP backend as an OAuth 2.1
client (basic/authorization, the client's half)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.config import keys
from gateway.config.auth import _SCOPE, url_problem
from gateway.config.credentials import (
    BACKEND_AUTH_TYPES,
    CLIENT_ASSERTION_ALGORITHMS,
    CLIENT_AUTH_METHODS,
    BackendAuth,
)
from gateway.config.reader import _Check

Path_ = tuple[str, ...]
SECTION = "backend_auth"


def backend_auth(c: _Check, raw: Any, path: Path_, base: Path, kind: str) -> BackendAuth | None:
    if raw is None:
        return None
    if kind == "stdio":
        # basic/authorization: a stdio server takes its credentials from its environment.
        c.r.problem(path, "is for http and sse backends (give a stdio server env instead)")
        return None
    body = c.mapping(raw, path, keys.names(SECTION))
    values = c.scalars(body, path, BackendAuth)
    kind_ = values["type"]
    if not kind_:
        c.r.problem(path + ("type",), "is required")
        return None
    for name, choices in (
        ("type", BACKEND_AUTH_TYPES),
        ("token_endpoint_auth_method", CLIENT_AUTH_METHODS),
        ("signing_algorithm", CLIENT_ASSERTION_ALGORITHMS),
    ):
        if values[name] is not None and values[name] not in choices:
            c.r.problem(path + (name,), f"must be one of {', '.join(choices)}")
            return None
    for i, scope in enumerate(values["scopes"]):
        if not _SCOPE.fullmatch(scope):
            c.r.problem(
                path + ("scopes", str(i)), "is not a scope token (visible ASCII, no quotes)"
            )
    if values["private_key_file"]:
        where = Path(values["private_key_file"])
        where = where if where.is_absolute() else base / where
        if not where.is_file():
            c.r.problem(path + ("private_key_file",), f"no such file: {where}")
        values["private_key_file"] = str(where)
    for name in ("authorization_server",):
        if values[name] and (why := url_problem(values[name], https=True)):
            c.r.problem(path + (name,), why)
    if values["client_metadata_url"]:
        why = url_problem(values["client_metadata_url"], https=True)
        if why or not values["client_metadata_url"].startswith("https://"):
            c.r.problem(path + ("client_metadata_url",), why or "must be an https URL")
    _rules(c, path, values)
    return BackendAuth(**values)


def _rules(c: _Check, path: Path_, v: dict[str, Any]) -> None:
    """What the keys require of each other."""
    method = v["token_endpoint_auth_method"]
    if method == "private_key_jwt" and not v["private_key_file"]:
        c.r.problem(path + ("private_key_file",), "is required for private_key_jwt")
    if method in ("client_secret_basic", "client_secret_post") and not v["client_secret"]:
        c.r.problem(path + ("client_secret",), f"is required for {method}")
    if (v["client_secret"] or v["private_key_file"]) and not v["client_id"]:
        c.r.problem(path + ("client_id",), "is required with a client secret or key")
    if v["type"] in ("client_credentials", "token_exchange"):
        if not v["client_id"]:
            c.r.problem(path + ("client_id",), f"is required for {v['type']}")
        elif not (v["client_secret"] or v["private_key_file"]):
            c.r.problem(path, f"{v['type']} needs client_secret or private_key_file")
    if v["type"] == "token_exchange" and not v["authorization_server"]:
        # The callers' tokens go there: never to a server the backend names.
        c.r.problem(path + ("authorization_server",), "is required for token_exchange")
    if v["per_user"] and v["type"] != "oauth":
        c.r.problem(path + ("per_user",), "only applies to type oauth")
    if v["type"] != "token_exchange":
        for name in ("audience",):
            if v[name] is not None:
                c.r.problem(path + (name,), "only applies to type token_exchange")
