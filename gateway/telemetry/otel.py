"""Traces per the OpenTelemetry MCP semantic conventions, durations into Prometheus histograms,
one access-log line per client request, and its audit line (audit.py). Uses only the
OpenTelemetry API, through spans.py and only with a tracer: the SDK (exporter, sampler) is set
up by `gateway/app/`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from gateway.origin import TRACE_HEADERS, HeaderFields, Origin
from gateway.protocol import jsonrpc, meta
from gateway.telemetry.api import (
    CANCELLED,
    LONG_LIVED,
    Message,
    Observation,
    Stats,
    error_type,
)
from gateway.telemetry.audit import AuditLog
from gateway.telemetry.logs import utc_now
from gateway.telemetry.recorder import OTHER, Recorder
from gateway.telemetry.status import StatusBoard
from gateway.telemetry.tap import Tap

if TYPE_CHECKING:
    from opentelemetry import trace

    from gateway.telemetry.spans import Spans

log = logging.getLogger("gateway.telemetry")

# Our own attributes, under our own prefix. Every attribute costs on each span it is on (the
# SDK copies and checks it, the OTLP encoder builds two protobuf messages for it: ~3 us a span),
# so none repeats what another says: the front end is `network.transport` of the SERVER span
# (tcp: HTTP, pipe: stdio), and there is no era attribute (it could only ever say "modern").
ATTR_BACKEND = "mcp_gateway.backend"
ATTR_TRANSPORT = "mcp_gateway.transport"
NETWORK_TRANSPORT = {"stdio": "pipe", "http": "tcp"}
_NAME_ATTR = {"tools/call": "gen_ai.tool.name", "prompts/get": "gen_ai.prompt.name"}


def _request_attributes(msg: Message, params: dict[str, Any], attrs: dict[str, Any]) -> str:
    """The conventions' request attributes, added to `attrs`: one dict per span, handed to the
    SDK at start (which copies it once) rather than merged from several or set one by one. The
    span's name: `{method} {tool or prompt name}`, or the method alone (a resource URI is not in
    it: the conventions keep span names of low cardinality by default)."""
    method = msg.get("method", "")
    attrs["mcp.method.name"] = method
    attrs["jsonrpc.request.id"] = str(msg.get("id"))
    meta_ = params.get("_meta")
    version = meta_.get(meta.PROTOCOL_VERSION) if isinstance(meta_, dict) else None
    if isinstance(version, str):
        attrs["mcp.protocol.version"] = version
    name_attr = _NAME_ATTR.get(method)
    if name_attr:
        name = params.get("name")
        if isinstance(name, str):
            attrs[name_attr] = name
            return f"{method} {name}"
    elif method == "resources/read" and isinstance(params.get("uri"), str):
        attrs["mcp.resource.uri"] = params["uri"]
    return str(method)


def _error_type(reply: Message | None) -> str:
    """`error_type`, a plain result decided here (the common case, twice a request)."""
    if reply is not None and "error" not in reply:
        result = reply.get("result")
        if type(result) is dict and result.get("isError") is not True:
            return ""
    return error_type(reply)


def _span_target(msg: Message) -> str:
    params = msg.get("params")  # (jsonrpc.params inlined: on every request)
    if not isinstance(params, dict):
        return ""
    value = params.get("name") if "name" in params else params.get("uri")
    return value if isinstance(value, str) else ""


class _Observed:
    __slots__ = (
        "backend",
        "cancelled",
        "msg",
        "ref",
        "reply",
        "span",
        "started",
        "target",
        "telemetry",
    )
    telemetry: GatewayTelemetry
    msg: Message
    span: trace.Span | None
    target: str | None
    backend: str | None
    reply: Message | None
    cancelled: bool
    started: float
    ref: tuple[str, bool] | None

    def __init__(self, telemetry: GatewayTelemetry, msg: Message, span: trace.Span | None) -> None:
        self.telemetry = telemetry
        self.msg = msg
        self.span = span
        self.target = None
        self.backend = None
        self.reply = None
        self.cancelled = False
        self.ref = None
        self.started = time.perf_counter()

    def annotate(self, *, target: str | None = None, backend: str | None = None) -> None:
        if target is not None:
            self.target = target
        if backend is not None:
            self.backend = backend
            if self.span is not None:
                self.span.set_attribute(ATTR_BACKEND, backend)

    def route(self, msg: Message, backend: str) -> Observation | None:
        return None  # (only a client request's observation keeps its routed request's)

    def carrier(self) -> dict[str, str]:
        if self.span is None:
            return _NO_CARRIER
        spans = self.telemetry.spans
        assert spans is not None  # (a span was started by them)
        return spans.inject(self.span)

    def end_span(self, error: str, reply: Message | None) -> tuple[str, bool]:
        """End the span; its trace id (for the logs), and whether the trace was sampled (an
        exemplar names only a trace that was recorded: a link to any other leads nowhere)."""
        span = self.span
        assert span is not None
        if error:
            span.set_attribute("error.type", error)
            code = jsonrpc.error_code(reply) if reply is not None else None
            if code is not None:
                span.set_attribute("rpc.response.status_code", str(code))
            if error != CANCELLED and (spans := self.telemetry.spans) is not None:
                spans.failed(span)  # (a cancel is the client's choice, not a failure)
        span.end()
        return self.trace_ref()

    def trace_ref(self) -> tuple[str, bool]:
        """The span's trace id and whether it is sampled, worked out once (a request routed
        under its SERVER span asks for them twice: for each duration histogram's exemplar)."""
        ref = self.ref
        if ref is None:
            ref = _NONE
            if self.span is not None:
                ctx = self.span.get_span_context()
                if ctx.is_valid:
                    ref = (format(ctx.trace_id, "032x"), ctx.trace_flags.sampled)
            self.ref = ref
        return ref


# What `end_span` gives without a valid span context: no trace id, not sampled.
_NONE = ("", False)
# What `carrier` gives without a span: shared, and never changed by callers.
_NO_CARRIER: dict[str, str] = {}


class _ServerObserved(_Observed):
    """A client request. Its span is not attached as OpenTelemetry's current context: the
    gateway's CLIENT spans are handed it as their parent (the backend request's `Call` carries
    it down the stack), which saves an attach and a detach a request."""

    __slots__ = ("done", "forwarded", "origin", "routed")

    def __init__(
        self, telemetry: GatewayTelemetry, msg: Message, span: trace.Span | None, origin: Origin
    ) -> None:
        self.origin = origin
        self.forwarded = False  # its routed backend request was sent (under this span)
        self.routed: _Routed | None = None  # that request's observation, where this keeps it
        self.done = False  # ended (or cancelled)
        # (`_Observed.__init__`'s, in this frame: one is made per request)
        self.telemetry = telemetry
        self.msg = msg
        self.span = span
        self.target = None
        self.backend = None
        self.reply = None
        self.cancelled = False
        self.ref = None
        self.started = time.perf_counter()

    def route(self, msg: Message, backend: str) -> Observation | None:
        """The CLIENT observation of the backend request `msg` this request was routed to, kept
        here and recorded with this one's end; None where it needs one of its own (a second
        backend request: a fan-out, the gateway's own; a CLIENT span: `backend_spans`, or a
        backend other than the one the SERVER span names)."""
        if self.forwarded:
            return None
        telemetry = self.telemetry
        if self.span is not None:
            if telemetry._backend_spans or self.backend != backend:
                return None
        elif telemetry.spans is not None:
            return None
        self.forwarded = True
        routed = self.routed = _Routed()  # (no `__init__` of its own: no frame)
        routed.server = self
        routed.msg = msg
        routed.backend = backend
        routed.reply = None
        routed.cancelled = False
        routed.ended = False
        routed.started = time.perf_counter()
        return routed

    def end(self, reply: Message | None) -> None:
        self.reply = reply
        self.telemetry._end_server(self)

    def cancel(self) -> None:
        self.cancelled = True
        self.telemetry._end_server(self)


class _Routed:
    """The CLIENT observation of the one backend request a client request was routed to
    (`_ServerObserved.route`): its SERVER observation keeps it and records both durations at
    its own end, in one call (bench/README, issue 34). Its span, if any, is the SERVER span,
    whose context the backend continues. Recorded here instead only if it ends after the client
    request did."""

    __slots__ = ("backend", "cancelled", "ended", "msg", "reply", "seconds", "server", "started")
    server: _ServerObserved
    msg: Message
    backend: str
    reply: Message | None
    cancelled: bool
    ended: bool
    started: float
    seconds: float

    def annotate(self, *, target: str | None = None, backend: str | None = None) -> None:
        return None  # (a CLIENT observation's labels are its request's and backend's)

    def route(self, msg: Message, backend: str) -> Observation | None:
        return None

    def carrier(self) -> dict[str, str]:
        server = self.server
        return _NO_CARRIER if server.span is None else server.carrier()

    def end(self, reply: Message | None) -> None:
        self.seconds = time.perf_counter() - self.started
        self.reply = reply
        self.ended = True
        server = self.server
        telemetry = server.telemetry
        if telemetry.status is not None:
            method = self.msg.get("method", "")
            telemetry.status.client(
                self.backend, self.msg, reply, self.seconds, timed=method not in LONG_LIVED
            )
        if server.done:
            telemetry._end_routed(self)

    def cancel(self) -> None:
        self.seconds = time.perf_counter() - self.started
        self.cancelled = True
        self.ended = True
        if self.server.done:
            self.server.telemetry._end_routed(self)


class _ClientObserved(_Observed):
    __slots__ = ("backend_name", "serving", "via")

    def __init__(
        self,
        telemetry: GatewayTelemetry,
        msg: Message,
        span: trace.Span | None,
        backend: str,
        serving: Observation,
        via: _ServerObserved | None = None,
    ) -> None:
        # (`_Observed.__init__`'s, in this frame: one is made per backend request)
        self.telemetry = telemetry
        self.msg = msg
        self.span = span
        self.target = None
        self.backend = None
        self.reply = None
        self.cancelled = False
        self.ref = None
        self.started = time.perf_counter()
        self.backend_name = backend
        # The client request it was made for (NO_OBSERVATION: the gateway's own).
        self.serving = serving
        # Without a span of its own: the client request whose SERVER span the backend continues.
        self.via = via

    def carrier(self) -> dict[str, str]:
        return super().carrier() if self.via is None else self.via.carrier()

    def end(self, reply: Message | None) -> None:
        self.reply = reply
        self.telemetry._end_client(self)

    def cancel(self) -> None:
        self.cancelled = True
        self.telemetry._end_client(self)


class GatewayTelemetry:
    def __init__(
        self,
        tracer: trace.Tracer | None,
        recorder: Recorder | None,
        access_log: logging.Logger | None = None,
        record_payloads: bool = False,
        tap: Tap | None = None,
        audit: AuditLog | None = None,
        *,
        backend_spans: bool = False,
    ) -> None:
        self.stats = Stats()
        self._backend_spans = backend_spans
        self._audit = audit
        self._tap = tap
        self.tapping = tap is not None
        # The spans' part of the OpenTelemetry API, loaded only to trace (0064).
        self.spans: Spans | None = None
        if tracer is not None:
            from gateway.telemetry.spans import Spans

            self.spans = Spans(tracer)
        self._recorder = recorder
        self._access = access_log
        self._payloads = record_payloads
        self.status: StatusBoard | None = None  # the status page's series (gateway/app/ sets it)

    def record(
        self,
        hop: str,
        direction: str,
        msg: Message,
        backend: str | None = None,
        headers: HeaderFields | None = None,
    ) -> None:
        if self._tap is None:
            return
        try:
            self._tap.record(hop, direction, msg, headers=headers, backend=backend)
        except Exception:
            # Recording is an observer: it must never fail the request it watches.
            log.exception("traffic tap: a message could not be recorded")

    @property
    def audit_events(self) -> Callable[[dict[str, Any]], None] | None:
        """Where lines of events within a request go (a hook's: gateway/hooks/runner.py):
        the audit log's, when it is on."""
        return self._audit.event if self._audit is not None else None

    def _named(self, msg: Message, attrs: dict[str, Any]) -> str:
        """The span's name; its request attributes added to `attrs`."""
        params = jsonrpc.params(msg)
        name = _request_attributes(msg, params, attrs)
        if self._payloads:
            attrs["mcp_gateway.request.params"] = jsonrpc.dumps(params).decode()
        return name

    def server(self, msg: Message, origin: Origin) -> Observation:
        span = None
        if (spans := self.spans) is not None:  # with tracing off, trace context just passes
            fields = jsonrpc.meta(msg)
            headers = (
                {k: v for k in TRACE_HEADERS if (v := fields.get(k)) is not None}
                if "traceparent" in fields or "tracestate" in fields
                else origin.trace_headers()
            )
            attrs = {"network.transport": NETWORK_TRANSPORT[origin.frontend]}
            span = spans.server(self._named(msg, attrs), headers, attrs)
        self.stats.in_flight[origin.frontend] += 1
        return _ServerObserved(self, msg, span, origin)

    def _end_server(self, observed: _ServerObserved) -> None:
        observed.done = True
        msg, origin = observed.msg, observed.origin
        self.stats.in_flight[origin.frontend] -= 1
        seconds = time.perf_counter() - observed.started
        reply = observed.reply
        error = CANCELLED if observed.cancelled else _error_type(reply)
        trace_id, sampled = _NONE
        if observed.span is not None:
            # (Its name, given at start, already holds the client-visible name the target is.)
            trace_id, sampled = observed.end_span(error, reply)
        method = str(msg.get("method", ""))
        recorder = self._recorder
        routed = observed.routed
        if routed is not None:
            observed.routed = None  # (they refer to each other: no cycle left for the collector)
        if routed is not None and routed.ended:
            # The request it was routed to ended first (as it does): both durations recorded
            # in one call. What `_end_client` records for it, worked out here.
            sent = routed.msg
            sent_method = str(sent.get("method", ""))
            if recorder is not None and sent_method not in LONG_LIVED:
                if routed.cancelled:
                    sent_error = CANCELLED
                elif routed.reply is reply and not observed.cancelled:
                    sent_error = error  # (the reply passed up as it came)
                else:
                    sent_error = _error_type(routed.reply)
                sent_target = ""
                if sent_method in _NAME_ATTR and observed.target:
                    params = sent.get("params")  # (`_span_target` inlined)
                    if isinstance(params, dict):
                        value = params.get("name") if "name" in params else params.get("uri")
                        sent_target = value if isinstance(value, str) else ""
                exemplar = trace_id if sampled else ""
                if method not in LONG_LIVED:
                    target = observed.target or ("" if method not in _NAME_ATTR else OTHER)
                    recorder.routed(
                        method,
                        target,
                        error,
                        seconds,
                        sent_method,
                        sent_target,
                        routed.backend,
                        sent_error,
                        routed.seconds,
                        exemplar,
                    )
                else:
                    recorder.client(
                        sent_method,
                        sent_target,
                        routed.backend,
                        sent_error,
                        routed.seconds,
                        exemplar,
                    )
                recorder = None  # (recorded)
        if recorder is not None and method not in LONG_LIVED:
            target = observed.target or ("" if method not in _NAME_ATTR else OTHER)
            exemplar = trace_id if sampled else ""
            recorder.server(method, target, error, seconds, exemplar)
        if self._access is not None:
            line = {
                "time": utc_now(),  # RFC 3339 with the zone, as the log and the audit log
                "method": method,
                "name": _span_target(msg) or None,
                "backend": observed.backend,
                "outcome": error or "ok",
                "duration_ms": round(seconds * 1000, 3),
                "trace_id": trace_id or None,
                "client": origin.peer,
                "frontend": origin.frontend,
            }
            self._access.info("%s", orjson.dumps(line).decode())
        if self._audit is not None:
            try:
                self._audit.record(
                    msg, origin, reply, observed.backend, seconds, trace_id, observed.target
                )
            except Exception as exc:
                # An observer: it must never fail the request it watches (one line, no trace).
                log.warning("audit log: a request could not be recorded: %r", exc)

    def _end_routed(self, routed: _Routed) -> None:
        """Record a routed request that ended after its client request did (`_end_client`'s
        recording, for a `_Routed`)."""
        msg = routed.msg
        method = str(msg.get("method", ""))
        if self._recorder is None or method in LONG_LIVED:
            return
        server = routed.server
        error = CANCELLED if routed.cancelled else _error_type(routed.reply)
        trace_id, sampled = server.trace_ref() if server.span is not None else _NONE
        target = _span_target(msg) if method in _NAME_ATTR and server.target else ""
        exemplar = trace_id if sampled else ""
        self._recorder.client(method, target, routed.backend, error, routed.seconds, exemplar)

    def client(
        self,
        msg: Message,
        backend: str,
        transport: str,
        address: tuple[str, int] | None,
        serving: Observation,
    ) -> Observation:
        span = None
        if (spans := self.spans) is not None:
            if (
                not self._backend_spans
                and isinstance(serving, _ServerObserved)
                and serving.span is not None
                and serving.backend == backend
                and not serving.forwarded
            ):
                # The request a client's request was routed to: its SERVER span (which names
                # the backend) stands for it, and the backend continues that span's context.
                # Requests of the gateway's own or of a fan-out keep a CLIENT span each.
                serving.forwarded = True
                return _ClientObserved(self, msg, None, backend, serving, serving)
            parent = serving.span if isinstance(serving, _ServerObserved) else None
            attrs: dict[str, Any] = {
                ATTR_BACKEND: backend,
                ATTR_TRANSPORT: transport,
                "network.transport": NETWORK_TRANSPORT.get(transport, transport),
            }
            if address is not None:
                attrs["server.address"], attrs["server.port"] = address
            span = spans.client(self._named(msg, attrs), parent, attrs)
        return _ClientObserved(self, msg, span, backend, serving)

    def _end_client(self, observed: _ClientObserved) -> None:
        seconds = time.perf_counter() - observed.started
        error = CANCELLED if observed.cancelled else _error_type(observed.reply)
        if observed.span is not None:
            trace_id, sampled = observed.end_span(error, observed.reply)
        elif observed.via is not None:
            trace_id, sampled = observed.via.trace_ref()
        else:
            trace_id, sampled = _NONE
        msg = observed.msg
        method = str(msg.get("method", ""))
        if self.status is not None and not observed.cancelled:
            # (a cancelled request says nothing of its backend: the client went, or the gateway
            # stopped waiting; a listen's lifetime is its client's, not a latency)
            self.status.client(
                observed.backend_name, msg, observed.reply, seconds, timed=method not in LONG_LIVED
            )
        if self._recorder is not None and method not in LONG_LIVED:
            target = ""
            if method in _NAME_ATTR:
                serving = observed.serving
                # A name becomes a label only if the client's name was a listed one (bounded).
                if not isinstance(serving, _ServerObserved) or serving.target:
                    target = _span_target(msg)
            exemplar = trace_id if sampled else ""
            self._recorder.client(method, target, observed.backend_name, error, seconds, exemplar)
