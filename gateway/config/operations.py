"""The config's frozen objects for what surrounds the traffic: `tap:`, `rate_limits:`,
`overload:`, `shutdown:`, `audit:` and `telemetry:` (with model.py, a leaf of the package)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.config.key import URL_PATTERN, key

# A recording is for looking at, not an archive: 64 MiB per file is hours of busy traffic, and
# (1 + backups) files bound the disk it can take.
DEFAULT_TAP_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_TAP_BACKUPS = 3
# One message beyond this (a huge resource read) is recorded as its size only, so one blob cannot
# push hours of traffic out of the rotation.
DEFAULT_TAP_MAX_MESSAGE_BYTES = 1024 * 1024
DEFAULT_SERVICE_NAME = "mcp-gateway"
# Rate limits (rate_limits:): buckets are kept for at most this many callers (and caller-tool
# pairs) per limit; the least recently used goes first. A bucket idle long enough to be full
# again is forgotten anyway, so this bounds memory under a flood of new callers only.
DEFAULT_RATE_LIMIT_MAX_KEYS = 10_000
# Overload protection (overload:, and max_in_flight per backend): client requests being served at
# once, all backends together. Below the HTTP listener's 1024 connections, so that on the
# defaults a flood is shed with a 503 and Retry-After (which clients and load balancers act on)
# before connections are refused (which they see as a network failure).
DEFAULT_MAX_IN_FLIGHT = 512
# Requests past a bound wait this many at most (per bound, FIFO), each at most this long, then
# get -31004: a short queue smooths a burst without hiding an overload. One second is long
# next to a call's usual latency and short next to a client's retry with Retry-After.
DEFAULT_MAX_QUEUED = 128
DEFAULT_QUEUE_TIMEOUT = 1.0
# What a refusal's Retry-After (and data.retryAfter) tells the client, in seconds.
DEFAULT_OVERLOAD_RETRY_AFTER = 1.0
# The HTTP front end answers with plain JSON within this many seconds, then turns the reply into
# an SSE stream (gateway/frontends/replies.py JSON_WINDOW, which tests hold equal to this). A
# request still queued by then could no longer get its 503 and Retry-After (the status is
# sent), so `overload.queue_timeout` must stay below it.
JSON_WINDOW = 10.0
# Seconds between SIGTERM and the start of shutdown (`shutdown.pre_stop_delay`), /readyz 503
# and requests still served meanwhile. 0 for a plain run: Ctrl-C or a service manager's stop
# should not wait; an orchestrator's config sets it (deploy/kubernetes).
DEFAULT_PRE_STOP_DELAY = 0.0
# Seconds a stdio client may read nothing of the replies still to be written at the end
# (`shutdown.stdout_stall_timeout`): a slow reader slows the exit, one that stopped reading
# would hold it forever. A reader that takes any bytes at all within it is given more.
DEFAULT_STDOUT_STALL_TIMEOUT = 10.0
# The audit log (audit:) rotates like the tap; audit lines are small, so 64 MiB is a long time,
# and more old files are kept than of a recording: an audit trail is looked back on.
DEFAULT_AUDIT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_AUDIT_BACKUPS = 5
# Recorded arguments (include_arguments) longer than this, encoded, are recorded as their size
# only, so one large call cannot push the audit trail of many others out of the rotation.
DEFAULT_AUDIT_MAX_ARGUMENTS_BYTES = 64 * 1024
# `audit.path: stderr` writes audit lines to the gateway's stderr; any other value is a file path.
AUDIT_STDERR = "stderr"
# `telemetry.access_log: stderr` logs to the gateway's stderr; any other value is a file path.
ACCESS_LOG_STDERR = "stderr"


@dataclass(frozen=True)
class TapConfig:
    """Opt-in recording of every JSON-RPC message on both hops to a JSON-lines file."""

    # Absolute: a relative path in the file is resolved against the file's directory.
    path: str = key("string", "The JSON-lines file, relative to the config file.", required=True)
    redact: tuple[str, ...] = key(
        "strings", "Dotted paths into a message (`*` matches one level).", ()
    )
    # Besides Authorization and Cookie, always redacted.
    redact_headers: tuple[str, ...] = key(
        "strings", "Headers redacted besides Authorization and Cookie.", ()
    )
    max_bytes: int = key("count", "A file rotates at this size.", DEFAULT_TAP_MAX_BYTES, minimum=1)
    backups: int = key("count", "Old files kept.", DEFAULT_TAP_BACKUPS, minimum=0)
    max_message_bytes: int = key(
        "count",
        "A larger message is recorded as its size only.",
        DEFAULT_TAP_MAX_MESSAGE_BYTES,
        minimum=1,
    )
    # The redact hook's table (gateway/sensitive.py) over every string recorded, as well as the
    # paths above: a recording of results that may hold credentials or personal data.
    redact_secrets: bool = key(
        "boolean",
        "Also replace secrets and personal data found in any string (the redact hook's "
        "patterns: docs/trusting-tools/hooks.md).",
        False,
    )


@dataclass(frozen=True)
class Rate:
    """A token bucket: `rate` requests a second on average, `burst` at once."""

    rate: float = key("number", "Requests per second, on average.", required=True)
    burst: int = key("count", "Requests at once (default: rate, rounded up).", minimum=1)


@dataclass(frozen=True)
class RateLimits:
    """Token buckets a client request must find a token in (absent: no limit of that kind)."""

    per_identity: Rate | None = key("section", "Each caller's bucket.", None, section="rate")
    per_tool: Rate | None = key(
        "section", "Each caller's bucket per tool (tools/call).", None, section="rate"
    )
    overall: Rate | None = key(
        "section", "One bucket for all callers together.", None, section="rate"
    )
    tools: Mapping[str, Rate] = key(
        "sections",
        "per_tool for these tools (names as clients see them).",
        factory=dict,
        section="rate",
    )
    max_keys: int = key(
        "count",
        "Buckets kept per limit; the least recently used is dropped first.",
        DEFAULT_RATE_LIMIT_MAX_KEYS,
        minimum=1,
    )


@dataclass(frozen=True)
class Overload:
    """Bounds on client requests in flight (`overload:`): overall here, per backend on each
    backend (`max_in_flight`); past one, a short FIFO queue, then -31004 (HTTP 503 with
    Retry-After). Listen streams are not counted (they last as long as their client)."""

    max_in_flight: int = key(
        "count",
        "Client requests served at once (listen streams aside).",
        DEFAULT_MAX_IN_FLIGHT,
        minimum=1,
    )
    max_queued: int = key(
        "count",
        "Requests past a bound that wait for a slot (per bound); more get -31004 at once.",
        DEFAULT_MAX_QUEUED,
        minimum=0,
    )
    queue_timeout: float = key(
        "number",
        f"Seconds a queued request waits before -31004 (below {JSON_WINDOW:g}: an HTTP reply "
        "turns into a stream then, too late for a 503).",
        DEFAULT_QUEUE_TIMEOUT,
    )
    retry_after: float = key(
        "number",
        "Seconds a refusal tells the client to wait (Retry-After, data.retryAfter).",
        DEFAULT_OVERLOAD_RETRY_AFTER,
    )


@dataclass(frozen=True)
class Shutdown:
    """How the process stops (`shutdown:`)."""

    # Unready at once, still serving for this long, then the drain: the time a load balancer
    # (a Kubernetes Service's endpoints) takes to stop sending to this replica.
    pre_stop_delay: float = key(
        "number",
        "Seconds after SIGTERM with /readyz 503 and requests still served, before the drain "
        "(the time a load balancer takes to stop sending; 0: none).",
        DEFAULT_PRE_STOP_DELAY,
        minimum=0,
    )
    # The stdio front end's last replies: given up on (exit 1) once the client has read nothing
    # of them for this long.
    stdout_stall_timeout: float = key(
        "number",
        "Seconds the stdio client may read nothing of the last replies at shutdown before "
        "the gateway gives up on it (exit 1).",
        DEFAULT_STDOUT_STALL_TIMEOUT,
    )


@dataclass(frozen=True)
class AuditConfig:
    """One JSON line per client request: who asked what, where it went and how it ended."""

    # "stderr", or absolute: a relative path is resolved against the file's directory.
    path: str = key(
        "string",
        f"{AUDIT_STDERR!r} or a JSON-lines file, relative to the config file.",
        required=True,
    )
    include_arguments: bool = key(
        "boolean", "Record tools/call and prompts/get arguments (after redact).", False
    )
    redact: tuple[str, ...] = key(
        "strings", "Dotted paths into a request, as the tap's (`*`: one level).", ()
    )
    max_arguments_bytes: int = key(
        "count",
        "Longer arguments (encoded) are recorded as their size only.",
        DEFAULT_AUDIT_MAX_ARGUMENTS_BYTES,
        minimum=1,
    )
    max_bytes: int = key(
        "count", "A file rotates at this size.", DEFAULT_AUDIT_MAX_BYTES, minimum=1
    )
    backups: int = key("count", "Old files kept.", DEFAULT_AUDIT_BACKUPS, minimum=0)


@dataclass(frozen=True)
class TelemetryConfig:
    service_name: str = key("string", "service.name on traces and metrics.", DEFAULT_SERVICE_NAME)
    otlp_endpoint: str | None = key(  # None: no traces are exported
        "string", "OTLP/HTTP endpoint for traces (off when absent).", None, pattern=URL_PATTERN
    )
    record_payloads: bool = key(
        "boolean", "Put message bodies on spans (they may hold secrets).", False
    )
    # False: a request routed to one backend gets one span, the SERVER span, whose context the
    # backend continues (as proxies such as Envoy and nginx trace); True adds its CLIENT span.
    backend_spans: bool = key(
        "boolean",
        "A CLIENT span for each request forwarded to a backend, beside the client's SERVER"
        " span (off: the SERVER span stands for the whole pass through the gateway).",
        False,
    )
    access_log: str | None = key(  # None: off; "stderr"; or an absolute file path
        "string", f"{ACCESS_LOG_STDERR!r} or a file path (off when absent).", None
    )
