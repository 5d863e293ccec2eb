"""Finished SDK spans written straight into OTLP's protobuf wire format (opentelemetry-proto's
trace.proto and trace_service.proto, field by field): pure functions, no I/O.

Why not the OTLP exporter's encoder: it builds a protobuf object per span, attribute and value
in Python (~30 us a span, more than the whole gateway spends on a request's spans otherwise);
this writes the bytes at once and keeps each attribute's encoding, since most repeat from span
to span (method, tool, transport, backend). The output decodes to the very message the
exporter's `encode_spans` builds (tests/telemetry/test_otlp_wire.py holds it to that).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanKind

# Encodings kept by (key, value) before the table starts again: attributes with values of
# their own per span (request ids) pass through it, the few dozen that repeat stay.
ATTRIBUTE_CACHE = 4096

_ONE_BYTE = [bytes((n,)) for n in range(128)]
_DOUBLE = struct.Struct("<d")
# Span.flags: the SDK's encoder tells only whether the parent is remote.
_HAS_IS_REMOTE = 0x100
_IS_REMOTE = 0x200
_FLAGS_LOCAL = b"\x85\x01" + _HAS_IS_REMOTE.to_bytes(4, "little")
_FLAGS_REMOTE = b"\x85\x01" + (_HAS_IS_REMOTE | _IS_REMOTE).to_bytes(4, "little")
_KIND = {kind: b"\x30" + _ONE_BYTE[kind.value + 1] for kind in SpanKind}
_STATUS_UNSET = b"\x7a\x00"


def varint(n: int) -> bytes:
    if 0 <= n < 128:
        return _ONE_BYTE[n]
    if n < 0:
        n += 1 << 64  # int64 is ten bytes of two's complement on the wire
    out = bytearray()
    while n > 127:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, data: bytes) -> bytes:
    n = len(data)
    return tag + (_ONE_BYTE[n] if n < 128 else varint(n)) + data


def _text(tag: bytes, text: str) -> bytes:
    return _field(tag, text.encode("utf-8", "surrogatepass"))


def any_value(value: Any) -> bytes:
    """An AnyValue message's body (its fields, without tag and length)."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _text(b"\x0a", value)
    if isinstance(value, int):
        return b"\x18" + varint(value)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    if isinstance(value, Sequence):
        return _field(b"\x2a", b"".join(_field(b"\x0a", any_value(v)) for v in value))
    if isinstance(value, Mapping):
        return _field(
            b"\x32", b"".join(_field(b"\x0a", key_value(str(k), v)) for k, v in value.items())
        )
    raise TypeError(f"an attribute value of type {type(value).__name__} has no OTLP form")


def key_value(key: str, value: Any) -> bytes:
    """A KeyValue message's body."""
    return _text(b"\x0a", key) + _field(b"\x12", any_value(value))


class Encoder:
    """Spans to OTLP bytes. Not thread-safe: one encoder per thread that ends spans."""

    __slots__ = ("_attributes", "_names")

    def __init__(self) -> None:
        self._attributes: dict[tuple[str, Any], bytes] = {}
        self._names: dict[str, bytes] = {}

    def attributes(self, tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
        """Each attribute as a repeated KeyValue field `tag` (the same key-value pair is
        encoded once per cache generation)."""
        if not attributes:
            return b""
        cache = self._attributes
        out = []
        for item in attributes.items():
            try:
                out.append(cache[item])
            except KeyError:
                # Kept without its tag: spans, events and links put the same pair under
                # different field numbers.
                encoded = _field(b"", key_value(*item))
                if len(cache) >= ATTRIBUTE_CACHE:
                    cache.clear()
                cache[item] = encoded
                out.append(encoded)
            except TypeError:  # an unhashable value (a list): encoded every time
                out.append(_field(b"", key_value(*item)))
        return tag + tag.join(out)

    def span(self, span: ReadableSpan) -> bytes:
        """One Span message, framed as a repeated `spans` field of ScopeSpans."""
        ctx = span.context
        assert ctx is not None
        name = span.name
        encoded_name = self._names.get(name)
        if encoded_name is None:
            if len(self._names) >= ATTRIBUTE_CACHE:
                self._names.clear()
            encoded_name = self._names[name] = _text(b"\x2a", name)
        parent = span.parent
        parts = [
            b"\x0a\x10",
            ctx.trace_id.to_bytes(16, "big"),
            b"\x12\x08",
            ctx.span_id.to_bytes(8, "big"),
        ]
        if ctx.trace_state:
            parts.append(_text(b"\x1a", ",".join(f"{k}={v}" for k, v in ctx.trace_state.items())))
        if parent is not None:
            parts += (b"\x22\x08", parent.span_id.to_bytes(8, "big"))
        parts += (
            encoded_name,
            _KIND[span.kind],
            b"\x39",
            (span.start_time or 0).to_bytes(8, "little"),
            b"\x41",
            (span.end_time or 0).to_bytes(8, "little"),
            self.attributes(b"\x4a", span.attributes),
        )
        if span.dropped_attributes:
            parts.append(b"\x50" + varint(span.dropped_attributes))
        for event in span.events:
            body = (
                b"\x09" + (event.timestamp or 0).to_bytes(8, "little") + _text(b"\x12", event.name)
            )
            body += self.attributes(b"\x1a", event.attributes)
            if event.dropped_attributes:
                body += b"\x20" + varint(event.dropped_attributes)
            parts.append(_field(b"\x5a", body))
        if span.dropped_events:
            parts.append(b"\x60" + varint(span.dropped_events))
        for link in span.links:
            linked = link.context
            body = b"\x0a\x10" + linked.trace_id.to_bytes(16, "big")
            body += b"\x12\x08" + linked.span_id.to_bytes(8, "big")
            body += self.attributes(b"\x22", link.attributes)
            if link.dropped_attributes:
                body += b"\x28" + varint(link.dropped_attributes)
            body += b"\x35" + _remote_flags(linked.is_remote).to_bytes(4, "little")
            parts.append(_field(b"\x6a", body))
        if span.dropped_links:
            parts.append(b"\x70" + varint(span.dropped_links))
        status = span.status
        if status.description:
            parts.append(
                _field(
                    b"\x7a",
                    _text(b"\x12", status.description) + b"\x18" + varint(status.status_code.value),
                )
            )
        elif status.status_code.value:
            parts.append(b"\x7a\x02\x18" + _ONE_BYTE[status.status_code.value])
        else:
            parts.append(_STATUS_UNSET)
        parts.append(_FLAGS_REMOTE if parent is not None and parent.is_remote else _FLAGS_LOCAL)
        return _field(b"\x12", b"".join(parts))


def _remote_flags(remote: bool) -> int:
    return _HAS_IS_REMOTE | (_IS_REMOTE if remote else 0)


def scope_head(scope: InstrumentationScope | None) -> bytes:
    """ScopeSpans' `scope` field (an empty scope when the span names none)."""
    if scope is None:
        return b"\x0a\x00"
    body = _text(b"\x0a", scope.name)
    if scope.version:
        body += _text(b"\x12", scope.version)
    body += Encoder().attributes(b"\x1a", scope.attributes)
    return _field(b"\x0a", body)


def resource_head(resource: Resource) -> bytes:
    """ResourceSpans' `resource` field."""
    return _field(b"\x0a", Encoder().attributes(b"\x0a", resource.attributes))


def request(
    groups: Iterable[tuple[Resource, Iterable[tuple[InstrumentationScope | None, list[bytes]]]]],
) -> bytes:
    """An ExportTraceServiceRequest of spans encoded by `Encoder.span`, grouped by resource
    and then by instrumentation scope."""
    out = []
    for resource, scopes in groups:
        body = [resource_head(resource)]
        for scope, spans in scopes:
            scope_body = scope_head(scope) + b"".join(spans)
            if scope is not None and scope.schema_url:
                scope_body += _text(b"\x1a", scope.schema_url)
            body.append(_field(b"\x12", scope_body))
        if resource.schema_url:
            body.append(_text(b"\x1a", resource.schema_url))
        out.append(_field(b"\x0a", b"".join(body)))
    return b"".join(out)
