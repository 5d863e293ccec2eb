"""The `roots:` of a backend: `file://` URIs (client/roots, Root: a root is a file URI in
2025-11-25 and, the feature deprecated, still in 2026-07-28), each a string or `{uri, name}`."""

from __future__ import annotations

import re
from typing import Any

from gateway.config import keys
from gateway.config.model import Root
from gateway.config.reader import _Check

ROOT_KEYS = keys.names("root")
# What RFC 3986 lets a URI hold (unreserved, reserved, and `%` of an escape); anything else,
# spaces and non-ASCII letters among them, must be percent-encoded.
_URI_CHARS = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]*")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
# Hosts a local file URI may name; another host is almost always a slash too few.
_LOCAL_HOSTS = ("", "localhost")


def uri_problem(uri: str) -> str | None:
    """Why `uri` is not a usable root URI, or None (pure)."""
    if not uri.startswith("file://"):
        return "must be a file:// URI (a directory /srv/x is file:///srv/x)"
    if not _URI_CHARS.fullmatch(uri):
        return "has a character a URI cannot hold (percent-encode it: a space is %20)"
    if _BAD_ESCAPE.search(uri):
        return "has a % that does not start a %XX escape"
    host, slash, _ = uri[len("file://") :].partition("/")
    if host not in _LOCAL_HOSTS:
        return f"names the host {host!r}: a local path needs three slashes (file:///{host}/...)"
    if not slash:
        return "has no path (file:///dir)"
    return None


def roots(c: _Check, raw: Any, path: tuple[str, ...]) -> tuple[Root, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        c.r.problem(path, "must be a list of file:// URIs or {uri, name} mappings")
        return ()
    out: list[Root] = []
    for i, item in enumerate(raw):
        where = path + (str(i),)
        name: str | None = None
        if isinstance(item, dict):
            body = c.mapping(item, where, ROOT_KEYS)
            if body.get("uri") is None:
                c.r.problem(where + ("uri",), "is required")
                continue
            uri = c.string(body["uri"], where + ("uri",))
            if uri is None:
                continue
            name = c.string(body.get("name"), where + ("name",))
            where += ("uri",)
        elif isinstance(item, str):
            uri = item
        else:
            c.r.problem(where, "must be a file:// URI or a {uri, name} mapping")
            continue
        problem = uri_problem(uri)
        if problem is not None:
            c.r.problem(where, problem)
            continue
        out.append(Root(uri, name))
    return tuple(out)
