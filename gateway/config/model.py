"""The config's frozen objects, its defaults and its one exception (with access.py,
credentials.py, listeners.py and operations.py, a leaf of the package)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.config.access import PolicyConfig
from gateway.config.credentials import AuthConfig, BackendAuth, ClusterConfig
from gateway.config.hooks import HookConfig
from gateway.config.key import NAME_PATTERN, PEM, URL_PATTERN, key
from gateway.config.listeners import (
    DEFAULT_MAX_HEADER_BYTES,
    DEFAULT_MAX_HEADERS,
    DEFAULT_SESSION_IDLE_TIMEOUT,
    Listen,
)
from gateway.config.operations import (
    AuditConfig,
    Overload,
    RateLimits,
    Shutdown,
    TapConfig,
    TelemetryConfig,
)
from gateway.config.pins import BackendPins, PinsConfig
from gateway.config.search import ToolSearchConfig
from gateway.config.virtual import ServerConfig

# A backend's limits (backends.NAME.http.limits / .sse.limits).
# Open connections per backend; more concurrent calls wait for one.
DEFAULT_BACKEND_MAX_CONNECTIONS = 100
# An idle pooled connection is closed after this long: below the 5 s keep-alive of uvicorn,
# hypercorn and Node, so the gateway, not the backend, closes it, and a reused connection is
# never one the backend is closing.
DEFAULT_BACKEND_IDLE_TIMEOUT = 4.0
# A JSON reply, and all the events of one SSE reply together.
DEFAULT_MAX_REPLY_BYTES = 64 * 1024 * 1024
# One SSE event from a backend.
DEFAULT_MAX_EVENT_BYTES = 16 * 1024 * 1024
# A legacy reply stream that drops is resumed (GET with Last-Event-ID): at most this many
# reconnections in a row that bring nothing, each after the server's `retry` capped at this.
DEFAULT_MAX_RESUMPTIONS = 3
DEFAULT_MAX_RESUME_DELAY = 30.0
# How long a backend may take to accept a connection (HTTP), or to answer its first message
# (the era probe: stdio, and HTTP too). A stdio child gets longer: a first `npx`/`uvx` run
# downloads the server, and a loaded machine starts an interpreter slowly.
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_STDIO_CONNECT_TIMEOUT = 30.0
# A stdio child's whole opening (the era probe, then a legacy server's `initialize`) from its
# start: past it, the child is stopped and down (-31001) instead of holding requests for the
# opening's own bounds (connect_timeout + request_timeout). Twice the stdio connect_timeout, so a
# legacy server that stays silent on the probe still has as long again for `initialize`.
DEFAULT_START_TIMEOUT = 60.0
# Under fail_open, how long a merged list, discovery or listen acknowledgement waits for the
# backends still out once another has answered (fan_out.grace): a silent one costs this much.
DEFAULT_FAN_OUT_GRACE = 0.1
# How long after a backend began starting a merged list or listen waits for its first catalog
# (fan_out.start_wait): a list made at start-up shows every backend that starts this quickly.
DEFAULT_FAN_OUT_START_WAIT = 5.0
# Whole-request bound; long tool calls are normal in MCP, so this is generous.
DEFAULT_REQUEST_TIMEOUT = 300.0
# An HTTP backend's replica that failed (cannot connect, 502/503/504) is skipped this long while
# another replica remains (backends/replicas.py).
DEFAULT_EJECT_FOR = 10.0
# How an HTTP backend with several `urls` picks one for a request.
BALANCE_MODES = ("round_robin", "least_in_flight")
# `isolation: per_session` (a stdio child per client): a child whose client has sent nothing for
# this long is stopped. The same as a legacy HTTP session's default, so that a child does not
# lose a live session's state before the session itself would end.
DEFAULT_CHILD_IDLE_TIMEOUT = DEFAULT_SESSION_IDLE_TIMEOUT
# Children of one per-session backend at most (besides the one for the gateway's own requests):
# each is a process, and every new client would otherwise start one more.
DEFAULT_MAX_CHILDREN = 64
# Requests one backend is sent at once. Above an HTTP backend's pool (100 connections), so the
# pool is used in full, while one slow backend cannot take more than a quarter of the overall
# bound: the others are still served.
DEFAULT_BACKEND_MAX_IN_FLIGHT = 128

# Addresses that bind every interface, and so clash with any other host on the same port.
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# A redaction rule: dot-separated keys (or `*`, or a list index), none empty.
_REDACT_PATH = re.compile(r"[^.\s]+(?:\.[^.\s]+)*")
# An HTTP field name (RFC 9110 token).
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class ConfigInvalid(Exception):
    """The config cannot be used; `problems` lists every reason, each with its line."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class StdioTarget:
    command: str = key("string", "The program, looked up on PATH.", required=True)
    args: tuple[str, ...] = key("strings", "Its arguments.", ())
    env: Mapping[str, str] = key("string_map", "Variables set for the child.", factory=dict)
    cwd: str | None = key("string", "Its working directory.", None)
    # The child gets the gateway's whole environment (then `env`) instead of a short safe list
    # (PATH, HOME, ...) plus `env`. Off for config files: a team gateway's own secrets must not
    # leak into every child; ad hoc commands (`expose`) turn it on, as a shell would.
    inherit_env: bool = key(
        "boolean", "Pass the gateway's whole environment, not a safe short list.", False
    )


@dataclass(frozen=True)
class ClientTls:
    """How the gateway checks an https backend and proves itself to it (PEM files)."""

    ca_file: str | None = key("string", PEM + " Default: the system's trust store.", None)
    # A client certificate, for servers that ask for one.
    cert_file: str | None = key("string", PEM + " A client certificate.", None)
    key_file: str | None = key("string", PEM + " Its key (default: in cert_file).", None)
    # False accepts any certificate: for tests, never for production.
    verify: bool = key("boolean", "false accepts any certificate (tests only).", True)


@dataclass(frozen=True)
class BackendLimits:
    """What one HTTP backend may make the gateway hold."""

    max_connections: int = key(
        "count", "Open connections to this backend.", DEFAULT_BACKEND_MAX_CONNECTIONS, minimum=1
    )
    idle_timeout: float = key(
        "number",
        "Seconds before an idle pooled connection is closed.",
        DEFAULT_BACKEND_IDLE_TIMEOUT,
    )
    max_reply_bytes: int = key(
        "count",
        "A JSON reply, or all events of one SSE reply.",
        DEFAULT_MAX_REPLY_BYTES,
        minimum=1,
    )
    max_event_bytes: int = key("count", "One SSE event.", DEFAULT_MAX_EVENT_BYTES, minimum=1)
    max_header_bytes: int = key(
        "count", "One reply header line.", DEFAULT_MAX_HEADER_BYTES, minimum=256
    )
    max_headers: int = key("count", "Header fields per reply.", DEFAULT_MAX_HEADERS, minimum=8)
    max_resumptions: int = key(
        "count",
        "Reconnections in a row that bring nothing before a dropped legacy stream is lost.",
        DEFAULT_MAX_RESUMPTIONS,
        minimum=0,
    )
    max_resume_delay: float = key(
        "number",
        "The longest wait (seconds) before resuming a dropped legacy stream.",
        DEFAULT_MAX_RESUME_DELAY,
    )


@dataclass(frozen=True)
class HttpTarget:
    # The first replica's, with `urls`: the backend's identity (OAuth resource, logs).
    url: str = key("string", "An http:// or https:// URL.", pattern=URL_PATTERN)
    # Replicas of one server (`urls:`): every URL, the first being `url`; () with `url:` alone.
    urls: tuple[str, ...] = key(
        "strings", "Replicas of one server (http only): each an http:// or https:// URL.", ()
    )
    balance: str = key(
        "string",
        "With urls: how a replica is picked for a request.",
        "round_robin",
        choices=BALANCE_MODES,
    )
    eject_for: float = key(
        "number", "With urls: seconds a failed replica is skipped.", DEFAULT_EJECT_FOR
    )
    headers: Mapping[str, str] = key("string_map", "Headers sent with every request.", factory=dict)
    tls: ClientTls = key(
        "section", "How the backend's certificate is checked.", ClientTls(), section="client_tls"
    )
    limits: BackendLimits = key(
        "section",
        "What this backend may make the gateway hold.",
        BackendLimits(),
        section="backend_limits",
    )

    @property
    def replicas(self) -> tuple[str, ...]:
        return self.urls or (self.url,)


@dataclass(frozen=True)
class SseTarget:
    """A server on the deprecated HTTP+SSE transport of 2024-11-05: `url` is its SSE endpoint."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    tls: ClientTls = ClientTls()
    limits: BackendLimits = BackendLimits()


Target = StdioTarget | HttpTarget | SseTarget


def default_connect_timeout(target: Target) -> float:
    if isinstance(target, StdioTarget):
        return DEFAULT_STDIO_CONNECT_TIMEOUT
    return DEFAULT_CONNECT_TIMEOUT


@dataclass(frozen=True)
class Root:
    """A root the gateway tells a backend of when no client's can be asked (client/roots): a
    `file://` URI and an optional display name, as `roots/list` returns them."""

    uri: str = key("string", "A file:// URI.", pattern="^file://", required=True)
    name: str | None = key("string", "A display name.", None)

    def as_wire(self) -> dict[str, str]:
        return {"uri": self.uri} if self.name is None else {"uri": self.uri, "name": self.name}


# `auto` probes each backend (server/discover, falling back to initialize); the others pin it.
ERAS = ("auto", "modern", "legacy")
# `shared`: one stdio child serves every client; `per_session`: a child per client (stdio only).
ISOLATIONS = ("shared", "per_session")


# Resilience per backend (docs/behaviour/backends.md, "Timeouts, retries and circuit breakers"):
# requests that cannot have effects are tried up to 3 times in all, 0.1 s apart doubling to 2 s;
# a breaker, when on, opens after 5 failures within 30 s and lets a probe through after 10 s.
DEFAULT_RETRY_ATTEMPTS = 3
DEFAULT_RETRY_BACKOFF = 0.1
DEFAULT_RETRY_MAX_BACKOFF = 2.0
DEFAULT_BREAKER_FAILURES = 5
DEFAULT_BREAKER_WINDOW = 30.0
DEFAULT_BREAKER_COOLDOWN = 10.0


@dataclass(frozen=True)
class RetrySettings:
    """`backends.NAME.retries`: only requests that cannot have effects are ever retried."""

    attempts: int = key(
        "count",
        "Tries in all of a request that cannot have effects (1: never retried).",
        DEFAULT_RETRY_ATTEMPTS,
        minimum=1,
    )
    backoff: float = key(
        "number", "Seconds before the first retry, doubling.", DEFAULT_RETRY_BACKOFF
    )
    max_backoff: float = key("number", "The longest wait between tries.", DEFAULT_RETRY_MAX_BACKOFF)


@dataclass(frozen=True)
class BreakerSettings:
    """`backends.NAME.breaker`: open after `failures` within `window` seconds; a probe after
    `cooldown` seconds open."""

    failures: int = key(
        "count", "Failures within the window that open it.", DEFAULT_BREAKER_FAILURES, minimum=1
    )
    window: float = key("number", "Seconds the failures are counted over.", DEFAULT_BREAKER_WINDOW)
    cooldown: float = key(
        "number",
        "Seconds open before one probe request is let through.",
        DEFAULT_BREAKER_COOLDOWN,
    )


@dataclass(frozen=True)
class BackendConfig:
    name: str
    target: Target
    era: str = key(
        "string", "auto probes; modern or legacy pins the protocol era.", "auto", choices=ERAS
    )
    # Legacy clients of a server that speaks both eras get legacy sessions of their own (stdio:
    # on a second process, since a stdio connection keeps the era of its first request);
    # false: they are served on the modern one, one process and one in-memory state, without
    # the server's own requests during a call (docs/guides/dual-era.md).
    legacy_lane: bool = key(
        "boolean",
        "Legacy clients of a server of both eras get legacy sessions (stdio: a second "
        "process); false: they share the modern one (one in-memory state).",
        True,
    )
    connect_timeout: float = key(
        "number",
        "Seconds to connect and answer the first message (default 30 for stdio, 10 for HTTP).",
        DEFAULT_CONNECT_TIMEOUT,
        shown=None,  # the file's default depends on the transport (default_connect_timeout)
    )
    request_timeout: float = key("number", "Seconds one request may take.", DEFAULT_REQUEST_TIMEOUT)
    start_timeout: float = key(  # stdio only
        "number",
        "stdio: seconds a child has from its start to finish its opening; then it is down.",
        DEFAULT_START_TIMEOUT,
    )
    namespace: str = key(  # empty: the backend's name
        "string",
        "Prefix of this backend's names (default: its name).",
        "",
        pattern=NAME_PATTERN,
    )
    allow_tools: tuple[str, ...] = key(
        "strings", "Only these tools (names as the backend has them).", (), at="tools.allow"
    )
    deny_tools: tuple[str, ...] = key("strings", "All but these tools.", (), at="tools.deny")
    # The retries of safe requests; the breaker (None: off).
    retries: RetrySettings = key(
        "section",
        "Retries of requests that cannot have effects.",
        RetrySettings(),
        section="retries",
    )
    breaker: BreakerSettings | None = key(
        "switch",
        "A circuit breaker: true, or a mapping of its settings (default: off).",
        None,
        shown=False,
        section="breaker",
    )
    rename_tools: Mapping[str, str] = key(
        "string_map",
        "Tool names, as the backend has them, to the names offered.",
        factory=dict,
        name="rename",
    )
    # Under a policy or rate limits, forward a name or URI missing from the catalog on a guess
    # (after checking how a lenient server may read it); without them, names are forwarded as
    # ever to a single unprefixed backend.
    forward_unknown: bool = key(
        "boolean",
        "Under a policy or rate limits, forward names and URIs missing from the catalog.",
        False,
    )
    # The first page of a merged list takes this backend's part from its catalog while the
    # backend's own hints allow (each page public, with a positive ttlMs, fresh, no list change
    # since); false: ask it on every list, for a backend whose hints are not to be trusted.
    lists_from_catalog: bool = key(
        "boolean",
        "Answer a list's first page from the catalog while this backend's ttlMs (public) "
        "says it is fresh; false asks it every time.",
        True,
    )
    isolation: str = key(
        "string", "per_session: a stdio child per client.", "shared", choices=ISOLATIONS
    )
    child_idle_timeout: float = key(
        "number", "per_session: seconds before an idle child stops.", DEFAULT_CHILD_IDLE_TIMEOUT
    )
    max_children: int = key(
        "count", "per_session: children at most.", DEFAULT_MAX_CHILDREN, minimum=1
    )
    # Requests sent to this backend at once (listen streams aside); past it, the queue of
    # `overload:`, then -31004. Catalog loads count too: they load the backend like calls.
    max_in_flight: int = key(
        "count",
        "Requests sent to this backend at once (listen streams aside); then overload's queue.",
        DEFAULT_BACKEND_MAX_IN_FLIGHT,
        minimum=1,
    )
    # The answer to a legacy backend's `roots/list` asked outside any client's request (start-up,
    # catalog refresh), for a client without the roots capability, or when it is not certain
    # whose request it is for.
    roots: tuple[Root, ...] = key(
        "roots", "Roots told to a legacy backend when no client's can be asked.", ()
    )
    # How the gateway logs in to an HTTP backend; None: it sends only the configured headers.
    auth: BackendAuth | None = key(
        "section",
        "How the gateway logs in to this HTTP backend (OAuth).",
        None,
        section="backend_auth",
    )
    # A tool's own timeout (backend's names; seconds without a reply or progress), overriding
    # request_timeout for its tools/call: each `tools.NAME.timeout`.
    tool_timeouts: Mapping[str, float] = key(
        "number",
        "Seconds its tools/call may go without a reply or a progress notification "
        "(instead of request_timeout).",
        factory=dict,
        at="tool.timeout",
    )
    # Its own pins.on_change (None: the top-level pins:'s, or not pinned without one).
    pins: BackendPins | None = key(
        "section",
        "This backend's tool-definition pinning (needs the top-level pins:).",
        None,
        section="backend_pins",
    )
    # The hooks of this backend's requests and results, after the top-level ones (hooks.md).
    hooks: tuple[HookConfig, ...] = key(
        "section_list",
        "Hooks its requests and results pass through, after the top-level ones.",
        (),
        section="hook",
    )

    @property
    def effective_namespace(self) -> str:
        return self.namespace or self.name


PREFIX_MODES = ("auto", "always", "never")
FAILURE_POLICIES = ("fail_open", "fail_closed")


@dataclass(frozen=True)
class Namespacing:
    prefix: str = key(
        "string",
        "auto prefixes names once there are two backends or more; always or never pins it.",
        "auto",
        choices=PREFIX_MODES,
    )
    separator: str = key(
        "string", "Between namespace and name.", "_", pattern=r"^[A-Za-z0-9_.-]{1,3}$"
    )
    max_name_length: int = key("number", "Longest name offered.", 64, minimum=16, maximum=128)


@dataclass(frozen=True)
class Config:
    listen: Listen = key(
        "section", "The front ends: http, stdio or both, and admin.", section="listen"
    )
    backends: tuple[BackendConfig, ...] = key(
        "sections", "The MCP servers behind the gateway, by name.", section="backend"
    )
    source: str = "<config>"
    namespacing: Namespacing = key(
        "section", "How merged names are prefixed.", Namespacing(), section="namespacing"
    )
    on_backend_failure: str = key(
        "string",
        "fail_open leaves a failed backend out of a merged list.",
        "fail_open",
        choices=FAILURE_POLICIES,
        at="fan_out.on_failure",
    )
    fan_out_grace: float = key(
        "number",
        "Under fail_open, seconds a merged list waits for the backends still out once "
        "another has answered.",
        DEFAULT_FAN_OUT_GRACE,
        at="fan_out.grace",
    )
    fan_out_start_wait: float = key(
        "number",
        "Seconds after a backend began starting that a merged list or listen waits for its "
        "first catalog; past it (or once the backend is down) it is left out, and open "
        "listens are told of the change when it arrives.",
        DEFAULT_FAN_OUT_START_WAIT,
        minimum=0,
        at="fan_out.start_wait",
    )
    tap: TapConfig | None = key(
        "section", "Record every JSON-RPC message to a JSON-lines file.", None, section="tap"
    )
    telemetry: TelemetryConfig = key(
        "section", "Traces, access log and service name.", TelemetryConfig(), section="telemetry"
    )
    policy: PolicyConfig | None = key(  # None: every caller may see and call everything
        "section",
        "Who may see and call which tools, prompts and resources.",
        None,
        section="policy",
    )
    rate_limits: RateLimits | None = key(
        "section", "Token buckets per caller, per tool and overall.", None, section="rate_limits"
    )
    overload: Overload = key(
        "section",
        "Bounds on client requests in flight; past them a short queue, then 503.",
        Overload(),
        section="overload",
    )
    shutdown: Shutdown = key("section", "How the process stops.", Shutdown(), section="shutdown")
    servers: tuple[ServerConfig, ...] = key(
        "sections",
        "Virtual servers: endpoints of their own, each a selection of the backends.",
        (),
        section="server",
    )
    audit: AuditConfig | None = key(
        "section", "One JSON line per client request.", None, section="audit"
    )
    auth: AuthConfig | None = key(  # None: no authentication (today's behaviour)
        "section",
        "Require OAuth bearer tokens (or API keys) on listen.http.",
        None,
        section="auth",
    )
    tool_search: ToolSearchConfig = key(
        "section",
        "List a few meta-tools that find, describe and call the others instead of every tool.",
        ToolSearchConfig(),
        section="tool_search",
    )
    # None: every key is the process's own (one replica).
    cluster: ClusterConfig | None = key(
        "section",
        "Identical replicas behind a load balancer: the secrets they sign with.",
        None,
        section="cluster",
    )
    # Tool-definition pinning (None: definitions are served as the backends send them).
    pins: PinsConfig | None = key(
        "section",
        "Pin each backend's tool, prompt and template definitions to a file; a changed one is "
        "blocked, warned of or allowed (on_change).",
        None,
        section="pins",
    )
    # The key file signing task ids without cluster.secrets (tasks.key_file, absolute); None:
    # the default path (gateway/taskkey.py).
    task_key_file: str | None = key(
        "string",
        "The key signing task ids without cluster.secrets, made once (mode 0600); relative "
        "to the config file. Default: $XDG_STATE_HOME/mcp-gateway/task-key.",
        None,
        at="tasks.key_file",
    )
    # Hooks every backend's requests and results pass through (each backend's own after them).
    hooks: tuple[HookConfig, ...] = key(
        "section_list",
        "Python functions that see, change or refuse requests and results "
        "(docs/trusting-tools/hooks.md).",
        (),
        section="hook",
    )

    def pin_mode(self, backend: BackendConfig) -> str | None:
        """What a changed definition of this backend gets (None: it is not pinned)."""
        if self.pins is None:
            return None
        own = backend.pins.on_change if backend.pins is not None else None
        return own or self.pins.on_change
