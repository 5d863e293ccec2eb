"""DNS-rebinding protection (streamable-http, Security & Endpoint): which Origin and Host a
listener answers. Pure functions over header values, so the front end can cache their verdicts.

A browser tricked by DNS rebinding sends the attacker's name in Host (and its page's origin in
Origin) to a server on loopback. So a loopback listener answers only loopback names and the
configured `allowed_hosts` (any listener with `allowed_hosts` does so too), and any listener
refuses an Origin that is neither loopback nor in `allowed_origins`. Host values are parsed as
RFC 9110 7.2 defines them (`uri-host [":" port]`, no userinfo), so `evil.example@127.0.0.1` is
not taken for 127.0.0.1; an absolute-form request target (RFC 9112 3.2.2) names the host itself
and is checked instead of the Host field.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Collection, Sequence

LOOPBACK_NAMES = frozenset({"localhost"})
# RFC 3986 3.2.2 reg-name (unreserved / pct-encoded / sub-delims): anything else in a host,
# such as "@", "/", spaces or controls, makes the value invalid, never a different host.
_REG_NAME = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=%]*")
_PORT = re.compile(r"[0-9]*")
# What separates the origins of a list: no single origin contains either.
_LIST = re.compile(r"[ ,]")
# scheme "://" authority, as in an Origin (RFC 6454 7) or an absolute-form target
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+\-.]*)://")


def authority_host(authority: str) -> str | None:
    """The host an authority (`host[:port]`, IPv6 in brackets) names, lowercased; None when the
    value is not a valid Host: userinfo, a bad port, characters no host may contain."""
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            return None
        literal, rest = authority[1:end], authority[end + 1 :]
        try:
            host = str(ipaddress.IPv6Address(literal))
        except ValueError:
            return None
        if rest and not (rest.startswith(":") and _PORT.fullmatch(rest[1:])):
            return None
        return host
    host, colon, port = authority.partition(":")
    if not host or _REG_NAME.fullmatch(host) is None:
        return None
    if colon and _PORT.fullmatch(port) is None:
        return None  # a second colon (an unbracketed IPv6 address) lands here too
    return host.lower()


def url_host(url: str) -> tuple[str, str] | None:
    """(scheme, host) of `scheme://authority[/...]` (an Origin, an absolute-form target); None
    when it is not of that form or its authority is not a valid host."""
    match = _SCHEME.match(url)
    if match is None:
        return None
    rest = url[match.end() :]
    for end in "/?#":
        rest = rest.split(end, 1)[0]
    host = authority_host(rest)
    if host is None:
        return None
    return match.group(1).lower(), host


def target_authority(target: str) -> str | None:
    """The host named by an absolute-form request target (`http://host/path`), or "" when the
    target names none properly; None for the usual origin-form (`/path`)."""
    if target.startswith("/"):
        return None
    found = url_host(target)
    return "" if found is None else found[1]


@functools.lru_cache(maxsize=256)
def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def one_field(values: Sequence[str]) -> str:
    """A field's lines as one value (RFC 9110 5.3: joined by commas); an Origin so joined from
    several lines is no serialized origin, and is refused."""
    return values[0] if len(values) == 1 else ", ".join(values)


def origin_allowed(origin: str, allowed: Collection[str]) -> bool:
    """An Origin from a loopback page, or one of `allowed` (compared without regard to the case
    of scheme and host, as origins are). A list of origins (RFC 6454 7.1 allows one, spaces
    between; or several fields joined) is none of them."""
    if _LIST.search(origin):
        return False
    found = url_host(origin)
    if found is not None and is_loopback(found[1]):
        return True
    return origin.lower().rstrip("/") in {a.lower().rstrip("/") for a in allowed}


def host_allowed(host: str, allowed: Collection[str]) -> bool:
    """A host (already parsed) that a loopback listener answers: loopback, or in `allowed`."""
    return is_loopback(host) or host in {a.lower() for a in allowed}


def checks_host(bind_host: str, allowed_hosts: Collection[str]) -> bool:
    """Whether a listener checks Host: on loopback always (a rebound name reaches it as its
    own); elsewhere when the operator named the hosts it answers (`allowed_hosts`), since a
    listener bound to all interfaces is also reachable on loopback, from the same machine's
    browser (a container's published port)."""
    return is_loopback(bind_host) or bool(allowed_hosts)


def refusal(
    origin: str | None,
    host_field: str,
    target_host: str | None,
    *,
    allowed_origins: Collection[str],
    allowed_hosts: Collection[str],
    check_host: bool,
) -> str | None:
    """Why a request is refused ("origin" or "host"), or None. `target_host` is what
    `target_authority` found in the request target; `check_host` is whether the listener is on
    loopback (only then can a rebound name reach it)."""
    if origin is not None and not origin_allowed(origin, allowed_origins):
        return "origin"
    if check_host:
        host = authority_host(host_field) if target_host is None else target_host
        if not host or not host_allowed(host, allowed_hosts):
            return "host"
    return None
