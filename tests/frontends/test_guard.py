"""The DNS-rebinding guard's parsing (gateway/frontends/guard.py): pure functions over Host,
Origin and request-target values (streamable-http, Security & Endpoint; RFC 9110 7.2; RFC 9112
3.2.2; RFC 6454 7)."""

from __future__ import annotations

import functools

import pytest

from gateway.config import HttpListen
from gateway.frontends import guard, http

ACCEPT = "application/json, text/event-stream"


@pytest.mark.parametrize(
    ("value", "host"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("127.0.0.1:8080", "127.0.0.1"),
        ("127.0.0.1:", "127.0.0.1"),  # an empty port is allowed by the grammar
        ("LocalHost:80", "localhost"),
        ("gw.example", "gw.example"),
        ("[::1]", "::1"),
        ("[::1]:8080", "::1"),
        ("[0:0:0:0:0:0:0:1]:1", "::1"),
        ("xn--bcher-kva.example", "xn--bcher-kva.example"),
    ],
)
def test_a_host_value_names_its_host(value: str, host: str) -> None:
    assert guard.authority_host(value) == host


@pytest.mark.parametrize(
    "value",
    [
        "",
        "evil.example@127.0.0.1",  # userinfo is not part of Host (RFC 9110 7.2)
        "127.0.0.1@evil.example",
        "user:pass@127.0.0.1",
        "::1",  # an IPv6 literal must be bracketed
        "[::1",
        "[::1]x",
        "[::1]:80:80",
        "[not-ipv6]",
        "127.0.0.1:80:80",
        "127.0.0.1:http",
        "127.0.0.1/path",
        "127.0.0.1 evil.example",
        "evil.example\t",
        ":8080",
    ],
)
def test_an_invalid_host_value_names_no_host(value: str) -> None:
    assert guard.authority_host(value) is None


@pytest.mark.parametrize(
    ("target", "host"),
    [
        ("/mcp", None),
        ("/mcp?x=http://evil.example", None),
        ("http://evil.example/mcp", "evil.example"),
        ("HTTP://Evil.Example:80/mcp", "evil.example"),
        ("http://127.0.0.1:8080", "127.0.0.1"),
        ("http://[::1]:8080/mcp?q", "::1"),
        ("http://user@127.0.0.1/mcp", ""),
        ("http://evil.example@127.0.0.1/mcp", ""),
        ("example.com:443", ""),  # authority-form (CONNECT)
        ("*", ""),  # asterisk-form
    ],
)
def test_the_host_of_a_request_target(target: str, host: str | None) -> None:
    """RFC 9112 3.2: origin-form names no host (None); absolute-form names one, or "" when it
    does not properly (which no allowed list contains)."""
    assert guard.target_authority(target) == host


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("http://localhost:1234", True),
        ("http://127.0.0.1", True),
        ("http://[::1]:3000", True),
        ("https://app.example", True),
        ("HTTPS://APP.EXAMPLE", True),
        ("https://app.example/", True),
        ("http://app.example", False),  # another scheme is another origin
        ("https://app.example.evil", False),
        ("http://evil.example", False),
        ("http://localhost@evil.example", False),
        ("null", False),
        ("", False),
    ],
)
def test_origins(origin: str, allowed: bool) -> None:
    assert guard.origin_allowed(origin, ("https://app.example",)) is allowed


def verdict(
    origin: str | None = None, host: str = "127.0.0.1", target: str = "/mcp", loopback: bool = True
) -> str | None:
    return guard.refusal(
        origin,
        host,
        guard.target_authority(target),
        allowed_origins=("https://app.example",),
        allowed_hosts=("gw.example",),
        check_host=loopback,
    )


def test_the_verdict_of_a_request() -> None:
    assert verdict() is None
    assert verdict(host="gw.example:8443") is None
    assert verdict(host="GW.example") is None
    assert verdict(host="evil.example") == "host"
    assert verdict(host="evil.example@127.0.0.1") == "host"
    assert verdict(host="") == "host"
    assert verdict(origin="http://evil.example") == "origin"
    # absolute-form: the target's host is checked, the Host field is not
    assert verdict(host="127.0.0.1", target="http://evil.example/mcp") == "host"
    assert verdict(host="evil.example", target="http://127.0.0.1:1/mcp") is None
    # a listener off loopback checks no Host (a rebound name cannot reach it as loopback)
    assert verdict(host="evil.example", loopback=False) is None
    assert verdict(origin="http://evil.example", loopback=False) == "origin"


def test_a_listener_off_loopback_checks_host_once_allowed_hosts_are_named() -> None:
    """A listener on all interfaces (a container's) is reachable on loopback too, so a rebound
    name reaches it from the same machine's browser: with `allowed_hosts` it answers only those
    and loopback names (streamable-http, Security: validate Host against DNS rebinding)."""
    assert not guard.checks_host("0.0.0.0", ())
    assert guard.checks_host("0.0.0.0", ("mcp.example.com",))
    assert guard.checks_host("127.0.0.1", ())
    listen = HttpListen(host="0.0.0.0", allowed_hosts=("mcp.example.com",))
    screen = functools.partial(http._screen, listen, None, target_host=None)
    ok = screen("mcp.example.com", content_type="application/json", accept=ACCEPT)
    rebound = screen("evil.example", content_type="application/json", accept=ACCEPT)
    assert ok[0] is None and ok[1] is None
    assert rebound[0] is not None
