"""The gateway's OTLP encoder (telemetry/otlp_wire.py) held to the SDK's own: real SDK spans of
every shape, encoded both ways, must decode to the same ExportTraceServiceRequest."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
from opentelemetry import context, trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)
from opentelemetry.util.types import AttributeValue

from gateway.telemetry import otlp_wire

REMOTE = SpanContext(
    trace_id=0x0AF7651916CD43DD8448EB211C80319C,
    span_id=0xB7AD6B7169203331,
    is_remote=True,
    trace_flags=TraceFlags(TraceFlags.SAMPLED),
    trace_state=TraceState([("vendor", "v1"), ("other", "x-y")]),
)
LINKED = SpanContext(
    trace_id=0x11112222333344445555666677778888,
    span_id=0x1234567890ABCDEF,
    is_remote=False,
    trace_flags=TraceFlags(TraceFlags.SAMPLED),
)
EVERY_TYPE: dict[str, AttributeValue] = {
    "text": "plain",
    "unicode": "héllo ☃ 日本語 🚀",
    "long": "x" * 300,  # (a length of two varint bytes)
    "empty": "",
    "yes": True,
    "no": False,
    "zero": 0,
    "small": 7,
    "negative": -1,
    "int64_max": 2**63 - 1,
    "int64_min": -(2**63),
    "big": 2**62 + 12345,
    "float": 1.5,
    "negative_float": -2.25e-300,
    "float_whole": 3.0,
    "bytes": b"\x00\xff\x80raw",
    "strings": ["a", "b", "ç"],
    "ints": [1, -2, 2**40],
    "floats": [0.5, -1.0],
    "bools": [True, False],
    "nothing": [],
}


def finished(provider: TracerProvider, exporter: InMemorySpanExporter) -> tuple[ReadableSpan, ...]:
    provider.force_flush()
    return exporter.get_finished_spans()


def make_provider(
    resource: Resource, limits: SpanLimits | None = None
) -> tuple[TracerProvider, InMemorySpanExporter]:
    provider = TracerProvider(resource=resource, span_limits=limits, shutdown_on_exit=False)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def groups(
    spans: Sequence[ReadableSpan], encoder: otlp_wire.Encoder
) -> list[tuple[Resource, list[tuple[InstrumentationScope | None, list[bytes]]]]]:
    """The spans encoded and grouped as the SDK groups them (by resource, then scope, in order
    of first appearance)."""
    out: dict[Resource, dict[InstrumentationScope | None, list[bytes]]] = {}
    for span in spans:
        scopes = out.setdefault(span.resource, {})
        scopes.setdefault(span.instrumentation_scope, []).append(encoder.span(span))
    return [(resource, list(scopes.items())) for resource, scopes in out.items()]


def ours(spans: Sequence[ReadableSpan], encoder: otlp_wire.Encoder | None = None) -> bytes:
    return otlp_wire.request(groups(spans, encoder or otlp_wire.Encoder()))


def assert_same(spans: Sequence[ReadableSpan], encoder: otlp_wire.Encoder | None = None) -> None:
    assert spans
    decoded = ExportTraceServiceRequest.FromString(ours(spans, encoder))
    reference = encode_spans(spans)
    assert decoded == reference
    # (equal messages serialise alike: nothing of ours is an unknown field protobuf kept aside)
    assert decoded.SerializeToString() == reference.SerializeToString()


@pytest.fixture
def plain() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    resource = Resource.create(
        {"service.name": "mcp-gateway", "deployment.environment": "test", "pid": 42},
        schema_url="https://opentelemetry.io/schemas/1.26.0",
    )
    provider, exporter = make_provider(resource)
    yield provider, exporter
    provider.shutdown()


def test_server_and_client_spans_with_remote_and_local_parents(
    plain: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = plain
    tracer = provider.get_tracer("mcp-gateway", "1.2.3", schema_url="https://example.com/s/1")
    parent = trace.set_span_in_context(NonRecordingSpan(REMOTE))
    server = tracer.start_span(
        "tools/call github_search",
        parent,
        SpanKind.SERVER,
        attributes={"mcp.method.name": "tools/call", "jsonrpc.request.id": "7"},
    )
    token = context.attach(trace.set_span_in_context(server))
    try:
        client = tracer.start_span(
            "tools/call search",
            kind=SpanKind.CLIENT,
            attributes={"mcp_gateway.backend": "github", "network.transport": "tcp"},
        )
        client.end()
    finally:
        context.detach(token)
    server.end()
    root = tracer.start_span("root", kind=SpanKind.SERVER)  # no parent, no trace state
    root.end()
    spans = finished(provider, exporter)
    assert [s.parent is not None and s.parent.is_remote for s in spans] == [False, True, False]
    assert_same(spans)


def test_every_attribute_type(plain: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = plain
    tracer = provider.get_tracer("types")
    with tracer.start_as_current_span("attributes", attributes=EVERY_TYPE) as span:
        span.set_attribute("set.later", "after start")
        span.add_event("event", attributes=EVERY_TYPE)
    spans = finished(provider, exporter)
    assert dict(spans[0].attributes or {}).keys() == {*EVERY_TYPE, "set.later"}
    assert_same(spans)


def test_events_links_and_statuses(plain: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = plain
    tracer = provider.get_tracer("events", "0.1")
    links = [
        Link(REMOTE, {"link.kind": "caller", "n": 2}),
        Link(LINKED),
    ]
    for kind in SpanKind:
        span = tracer.start_span(f"kind {kind.name}", kind=kind, links=links)
        span.add_event("started")
        span.add_event("with attributes", {"a": 1, "b": ["x"], "c": "ü"}, timestamp=123)
        span.end()
    statuses = [
        Status(StatusCode.ERROR, "backend down: ünreachable"),
        Status(StatusCode.ERROR),
        Status(StatusCode.OK),
        Status(StatusCode.UNSET),
    ]
    for n, status in enumerate(statuses):
        span = tracer.start_span(f"status {n}" + "·" * 100)  # (a long name, too)
        span.set_status(status)
        span.end()
    with (
        pytest.raises(ValueError, match="boom"),
        tracer.start_as_current_span("raised", kind=SpanKind.INTERNAL),
    ):
        raise ValueError("boom")  # an exception event and an error status, as the SDK records them
    spans = finished(provider, exporter)
    assert spans[-1].status.status_code is StatusCode.ERROR and spans[-1].events
    assert_same(spans)


def test_dropped_attributes_events_and_links() -> None:
    limits = SpanLimits(
        max_span_attributes=3,
        max_event_attributes=1,
        max_link_attributes=1,
        max_events=2,
        max_links=1,
    )
    provider, exporter = make_provider(Resource.create({"service.name": "limited"}), limits)
    tracer = provider.get_tracer("limited")
    links = [Link(LINKED, {"c": 3}), Link(REMOTE, {"a": 1, "b": 2})]  # (the last ones are kept)
    with tracer.start_as_current_span("too much", attributes=EVERY_TYPE, links=links) as span:
        for n in range(4):
            span.add_event(f"e{n}", {"x": n, "y": -n})
    spans = finished(provider, exporter)
    only = spans[0]
    assert only.dropped_attributes and only.dropped_events and only.dropped_links
    assert only.events[0].dropped_attributes and only.links[0].dropped_attributes
    assert_same(spans)
    provider.shutdown()


def test_scopes_and_resources_group_like_the_sdk() -> None:
    """Two providers (resources, one with a schema URL), each with scopes that have versions,
    schema URLs and attributes, their spans interleaved."""
    first, first_spans = make_provider(
        Resource.create({"service.name": "a"}, schema_url="https://opentelemetry.io/schemas/1.21.0")
    )
    second, second_spans = make_provider(Resource.create({"service.name": "b", "n": 1}))
    tracers = [
        first.get_tracer("one", "1.0", schema_url="https://example.com/one"),
        first.get_tracer("two"),
        first.get_tracer("three", "3", attributes={"scope.attr": "x", "k": 2}),
        second.get_tracer("one", "1.0"),
    ]
    for n in range(3):
        for tracer in tracers:
            tracer.start_span(f"span {n}", kind=SpanKind.CLIENT, attributes={"n": n}).end()
    spans = finished(first, first_spans) + finished(second, second_spans)
    assert len({s.resource for s in spans}) == 2
    assert_same(spans)
    for provider in (first, second):
        provider.shutdown()


def test_the_attribute_cache_clears_at_its_bound_and_stays_right(
    plain: tuple[TracerProvider, InMemorySpanExporter], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(otlp_wire, "ATTRIBUTE_CACHE", 16)
    provider, exporter = plain
    tracer = provider.get_tracer("cache")
    for n in range(200):
        # A few attributes that repeat, one that never does, one unhashable-by-value list.
        attributes: dict[str, AttributeValue] = {
            "method": "tools/call",
            "id": str(n),
            "n": n % 5,
            "list": ["a", str(n)],
        }
        tracer.start_span(f"span {n % 30}", attributes=attributes).end()
    spans = finished(provider, exporter)
    encoder = otlp_wire.Encoder()
    once = ours(spans, encoder)
    assert len(encoder._attributes) <= 16 and len(encoder._names) <= 16
    # The same encoder, full of the last spans' encodings, writes the same bytes again.
    assert ours(spans, encoder) == once
    assert_same(spans, encoder)
