"""The config's frozen objects for `listen:`: the front ends and the admin listener (with
model.py, a leaf of the package)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.config.key import PEM, key

DEFAULT_HTTP_HOST = "127.0.0.1"
DEFAULT_HTTP_PORT = 8080
DEFAULT_HTTP_PATH = "/mcp"
# 4 MiB holds any realistic tool call; larger bodies are far more likely abuse than use.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
# The listener's limits (listen.http.limits). Each bounds what one client can make the gateway
# hold; the defaults leave room for any well-behaved MCP client.
# Open client connections; more are closed as they arrive (a team gateway sees tens).
DEFAULT_MAX_CONNECTIONS = 1024
# Requests served on one keep-alive connection before it is closed (the client reconnects),
# so one connection cannot hold a worker's attention forever.
DEFAULT_MAX_REQUESTS_PER_CONNECTION = 10_000
# One header line (and the request line); aiohttp's own default, as most servers use.
DEFAULT_MAX_HEADER_BYTES = 8190
# Header (and trailer) fields per request; MCP requests carry a dozen or so.
DEFAULT_MAX_HEADERS = 100
# A keep-alive connection with no request is closed after this long (seconds).
DEFAULT_IDLE_TIMEOUT = 75.0
# A new connection must deliver its first request head within this long (slow-header abuse).
DEFAULT_HEADER_TIMEOUT = 10.0
# A request body must arrive within this long once its head has.
DEFAULT_BODY_TIMEOUT = 30.0
# A legacy client's HTTP session ends after this long without a request (seconds).
DEFAULT_SESSION_IDLE_TIMEOUT = 1800.0
# The admin listener (/metrics, health) defaults to the port OpenTelemetry's Prometheus exporter
# uses by convention, so scrape configs written for it need no change.
DEFAULT_ADMIN_PORT = 9464


@dataclass(frozen=True)
class ListenerLimits:
    """Everything one client may make an HTTP listener hold, in one place."""

    max_body_bytes: int = key(
        "count",
        "A larger request body (after decoding) gets 413.",
        DEFAULT_MAX_BODY_BYTES,
        minimum=1,
    )
    max_header_bytes: int = key(
        "count", "One header line, or the request line.", DEFAULT_MAX_HEADER_BYTES, minimum=256
    )
    max_headers: int = key(
        "count", "Header fields per request (trailers count too).", DEFAULT_MAX_HEADERS, minimum=8
    )
    max_connections: int = key(
        "count", "Open client connections; more are closed.", DEFAULT_MAX_CONNECTIONS, minimum=1
    )
    max_requests_per_connection: int = key(
        "count",
        "Requests on one keep-alive connection.",
        DEFAULT_MAX_REQUESTS_PER_CONNECTION,
        minimum=1,
    )
    idle_timeout: float = key(
        "number", "Seconds a keep-alive connection may sit without a request.", DEFAULT_IDLE_TIMEOUT
    )
    header_timeout: float = key(
        "number", "Seconds for a new connection's first request head.", DEFAULT_HEADER_TIMEOUT
    )
    body_timeout: float = key(
        "number", "Seconds for a request body once its head has arrived.", DEFAULT_BODY_TIMEOUT
    )


@dataclass(frozen=True)
class ServerTls:
    """The listener's certificate chain and key (PEM files)."""

    cert_file: str = key("string", PEM, required=True)
    key_file: str = key("string", PEM, required=True)


@dataclass(frozen=True)
class HttpListen:
    host: str = key("string", "Address to bind; loopback checks Host headers.", DEFAULT_HTTP_HOST)
    port: int = key("port", "0 picks a free port.", DEFAULT_HTTP_PORT)
    path: str = key("string", "The MCP endpoint's path.", DEFAULT_HTTP_PATH, pattern="^/")
    allowed_origins: tuple[str, ...] = key(
        "strings", "Browser Origins allowed besides loopback ones.", ()
    )
    allowed_hosts: tuple[str, ...] = key(
        "strings", "Extra Host names accepted while bound to loopback.", ()
    )
    session_idle_timeout: float = key(
        "number",
        "Seconds a legacy client's session may sit unused.",
        DEFAULT_SESSION_IDLE_TIMEOUT,
    )
    limits: ListenerLimits = key(
        "section",
        "What one client may make the listener hold.",
        ListenerLimits(),
        section="listener_limits",
    )
    tls: ServerTls | None = key("section", "Serve https.", None, section="server_tls")

    @property
    def max_body_bytes(self) -> int:
        return self.limits.max_body_bytes

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"


@dataclass(frozen=True)
class AdminListen:
    """A separate HTTP listener for /metrics and health, so a stdio-only gateway can be scraped."""

    host: str = key("string", "Address to bind.", DEFAULT_HTTP_HOST)
    port: int = key(
        "port", "Must differ from listen.http.port on the same interface.", DEFAULT_ADMIN_PORT
    )


@dataclass(frozen=True)
class ConfiguredIdentity:
    """Who the stdio front end's caller is (`listen.stdio.identity`): stdio has no credentials
    (its caller is the parent process), so the policy judges this identity instead."""

    subject: str = key("string", "The caller's subject (as a token's `sub`).", required=True)
    client_id: str | None = key("string", "The caller's client id.", None)
    scopes: tuple[str, ...] = key("strings", "The scopes the caller holds.", ())
    claims: Mapping[str, str] = key("string_map", "Claims, for rules on claims.", factory=dict)


@dataclass(frozen=True)
class Listen:
    http: HttpListen | None = key(
        "section", "The Streamable HTTP front end.", None, section="listen_http"
    )
    stdio: bool = key(
        "switch",
        "Serve MCP on stdin/stdout: true, or a mapping naming the caller's identity.",
        False,
        section="listen_stdio",
    )
    admin: AdminListen | None = key(  # not a front end: it serves no MCP
        "section", "/metrics and health on a port of their own (no MCP).", None, section="admin"
    )
    # None: the stdio caller is anonymous.
    stdio_identity: ConfiguredIdentity | None = key(
        "section",
        "Who the stdio caller is, for the policy.",
        None,
        section="stdio_identity",
        at="listen_stdio.identity",
    )
