"""What the gateway's traces take from the OpenTelemetry API: a request's span started under the
trace context it came with, a backend request's under its client request's, the context a span
passes on, an error status. `GatewayTelemetry` (otel.py) loads this only when it has a tracer
(docs/decisions/0064-lazy-imports.md): with tracing off the API is never imported, and trace
context passes through as the client's own headers."""

from __future__ import annotations

import os
from typing import Any

from opentelemetry import context, propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

# OTEL_PROPAGATORS settings whose injection of a span's context is exactly the W3C traceparent
# (and tracestate): the gateway's current context never holds baggage (a client's is extracted
# only into its span's parent), so the baggage propagator adds nothing. With these the header is
# formatted here, without the propagators' pass (~3 us a request); any other setting runs them.
_W3C_ONLY = {"tracecontext,baggage", "baggage,tracecontext", "tracecontext"}
# What `inject` gives for a span without a valid context: shared, and never changed by callers.
NO_CARRIER: dict[str, str] = {}
# The parent of a request that carries no trace context: none (what extracting nothing gives).
_ROOT = context.Context()


def _w3c_only() -> bool:
    setting = os.environ.get("OTEL_PROPAGATORS", "tracecontext,baggage")
    return setting.replace(" ", "").lower() in _W3C_ONLY


class Spans:
    __slots__ = ("_tracer", "_w3c")

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer
        self._w3c = _w3c_only()

    def server(self, name: str, headers: dict[str, str], attrs: dict[str, Any]) -> trace.Span:
        """A client request's span, continuing the trace context of its `headers`."""
        # Nothing to extract: a root span, without a pass through the propagators.
        parent = propagate.extract(headers) if headers else _ROOT
        return self._tracer.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attrs)

    def client(self, name: str, parent: trace.Span | None, attrs: dict[str, Any]) -> trace.Span:
        """A backend request's span, under its client request's (None: a root span)."""
        under = trace.set_span_in_context(parent) if parent is not None else _ROOT
        return self._tracer.start_span(name, context=under, kind=SpanKind.CLIENT, attributes=attrs)

    def inject(self, span: trace.Span) -> dict[str, str]:
        if not self._w3c:
            out: dict[str, str] = {}
            propagate.inject(out, context=trace.set_span_in_context(span))
            return out
        ctx = span.get_span_context()
        if not ctx.is_valid:
            return NO_CARRIER
        out = {"traceparent": f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"}
        if ctx.trace_state:
            out["tracestate"] = ctx.trace_state.to_header()
        return out

    @staticmethod
    def failed(span: trace.Span) -> None:
        span.set_status(Status(StatusCode.ERROR))
