"""URI normalisation (pure, RFC 3986 section 6.2.2): the form policy rules are matched against
and that is forwarded, so another spelling of a URI cannot slip past a rule written for it.

`normalize` applies the syntax-based normalisations: scheme and host to lower case,
percent-encodings in upper case, unreserved characters decoded, dot segments removed. A server
may go further and decode an encoded slash (`%2F`) or take a backslash for one before it
resolves a path; `readings` gives that reading too, so a rule is checked against both.
"""

from __future__ import annotations

import re

from gateway.routing import names
from gateway.routing.names import Naming

# RFC 3986, Appendix B: scheme, authority, path, query, fragment of any URI reference.
_PARTS = re.compile(r"^(?:([^:/?#]+):)?(?://([^/?#]*))?([^?#]*)(?:\?([^#]*))?(?:#(.*))?$", re.S)
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
# What a lenient server may take for a path separator once decoded.
_SEPARATOR = re.compile(r"%2F|%5C|\\", re.I)


def _escape(m: re.Match[str]) -> str:
    char = chr(int(m.group(1), 16))
    return char if char in _UNRESERVED else f"%{m.group(1).upper()}"


def remove_dot_segments(path: str) -> str:
    """RFC 3986, section 5.2.4."""
    out: list[str] = []
    rest = path
    while rest:
        if rest.startswith("../"):
            rest = rest[3:]
        elif rest.startswith("./") or rest.startswith("/./"):
            rest = rest[2:]
        elif rest == "/.":
            rest = "/"
        elif rest.startswith("/../"):
            rest = rest[3:]
            if out:
                out.pop()
        elif rest == "/..":
            rest = "/"
            if out:
                out.pop()
        elif rest in (".", ".."):
            rest = ""
        else:
            start = 1 if rest.startswith("/") else 0
            end = rest.find("/", start)
            end = len(rest) if end < 0 else end
            out.append(rest[:end])
            rest = rest[end:]
    return "".join(out)


def normalize(uri: str) -> str:
    """The URI in RFC 3986 normal form (section 6.2.2); a URI already in it comes back equal."""
    parts = _PARTS.match(_ESCAPE.sub(_escape, uri) if "%" in uri else uri)
    if parts is None:  # (the expression matches every string)
        return uri
    scheme, authority, path, query, fragment = parts.groups()
    out = f"{scheme.lower()}:" if scheme is not None else ""
    if authority is not None:
        userinfo, at, host = authority.rpartition("@")
        out += f"//{userinfo}{at}{host.lower()}"
    out += remove_dot_segments(path) if scheme is not None or path.startswith("/") else path
    if query is not None:
        out += f"?{query}"
    if fragment is not None:
        out += f"#{fragment}"
    return out


def normalize_client(naming: Naming, uri: str) -> str:
    """A client's URI normalised; under prefixing, the backend URI inside the gateway's own
    `mcp-gateway://` wrapper (the wrapper stays as it is: a URI naming no namespace is unknown)."""
    if naming.prefixed:
        split = names.split_client_uri(uri)
        if split is None:
            return uri
        return names.client_uri(naming, split[0], normalize(split[1]))
    return normalize(uri)


def readings(normal: str) -> tuple[str, ...]:
    """Other forms a lenient server may resolve a normalised URI to: with encoded slashes and
    backslashes taken for separators and the dot segments that makes removed (none when there
    is nothing such)."""
    if "%" not in normal and "\\" not in normal:
        return ()
    loose = normalize(_SEPARATOR.sub("/", normal))
    return (loose,) if loose != normal else ()
