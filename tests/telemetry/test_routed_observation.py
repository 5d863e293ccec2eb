"""One observation a routed request (issue 34): a client request's SERVER observation keeps the
CLIENT observation of the backend request it was routed to (`Observation.route`) and records
both durations at its end. Each case runs the same requests through that path and through the
general one (`Telemetry.client`, a CLIENT observation of its own) and asserts the same metrics:
histogram series and counts, exemplars, the status page's series and errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.origin import Origin
from gateway.telemetry.api import NO_OBSERVATION, Observation
from gateway.telemetry.otel import GatewayTelemetry
from gateway.telemetry.recorder import DurationHistogram, Recorder
from gateway.telemetry.status import StatusBoard
from tests.telemetry.test_observation_shortcuts import REPLIES

pytestmark = pytest.mark.fast

ORIGIN = Origin("http", peer="127.0.0.1")


def request(method: str = "tools/call", name: str = "b__echo") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 7, "method": method, "params": {"name": name}}


def sent(method: str = "tools/call") -> dict[str, Any]:
    """The request as the backend gets it: its own name for the tool."""
    return {"jsonrpc": "2.0", "id": 7, "method": method, "params": {"name": "echo"}}


def telemetry(tracer: Any = None, **kwargs: Any) -> GatewayTelemetry:
    out = GatewayTelemetry(tracer, Recorder(), **kwargs)
    out.status = StatusBoard(lambda: 1_000_000.0, wall=lambda: 1_700_000_000.0)
    return out


def general(observed: Observation, tel: GatewayTelemetry, msg: dict[str, Any]) -> Observation:
    return tel.client(msg, "b", "stdio", None, observed)


def routed(observed: Observation, tel: GatewayTelemetry, msg: dict[str, Any]) -> Observation:
    got = observed.route(msg, "b")
    assert got is not None
    return got


Begin = Callable[[Observation, GatewayTelemetry, dict[str, Any]], Observation]


def histograms(tel: GatewayTelemetry) -> list[tuple[str, tuple[str, ...], list[int], bool]]:
    """Each series: its histogram, labels, bucket counts (the durations of one request fall in
    the first bucket or two: compared as a total) and whether it holds an exemplar."""
    recorder = tel._recorder
    assert recorder is not None
    out = []
    histogram: DurationHistogram
    for histogram in (recorder.server_duration, recorder.client_duration):
        for labels, series in sorted(histogram.by_labels.items()):
            exemplars = [e for e in series.exemplars if e is not None]
            out.append((histogram.name, labels, [sum(series.counts)], bool(exemplars)))
    return out


def status(tel: GatewayTelemetry) -> list[tuple[str, str, str]]:
    assert tel.status is not None
    return [(e.backend, e.method, e.code) for e in tel.status.errors]


def run(begin: Begin, scenario: str, reply: Any, tel: GatewayTelemetry) -> None:
    method = "subscriptions/listen" if scenario == "listen" else "tools/call"
    server = tel.server(request(method), ORIGIN)
    server.annotate(target=None if scenario == "unlisted" else "b__echo", backend="b")
    client = begin(server, tel, sent(method))
    if scenario == "late":  # the client request ends first (the routed one is recorded later)
        server.end(reply)
        client.end(reply)
        return
    if scenario == "client-cancelled":
        client.cancel()
    else:
        client.end(reply)
    if scenario == "server-cancelled":
        server.cancel()
    elif scenario == "another-reply":
        server.end({"jsonrpc": "2.0", "id": 7, "result": {}})
    else:
        server.end(reply)


SCENARIOS = [
    "plain",
    "late",
    "client-cancelled",
    "server-cancelled",
    "another-reply",
    "unlisted",
    "listen",
]


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("reply", REPLIES)
def test_a_routed_request_records_what_its_own_observation_would(scenario: str, reply: Any) -> None:
    """Metrics and the status page are the same either way (server/utilities: the gateway's
    durations; what a scrape shows)."""
    one, two = telemetry(), telemetry()
    run(routed, scenario, reply, one)
    run(general, scenario, reply, two)
    assert histograms(one) == histograms(two)
    assert status(one) == status(two)
    assert one.stats.in_flight == two.stats.in_flight


def test_only_the_first_backend_request_is_kept_by_the_client_request() -> None:
    """A second backend request (a fan-out's, the gateway's own catalog load) gets its own."""
    tel = telemetry()
    server = tel.server(request(), ORIGIN)
    assert server.route(sent(), "b") is not None
    assert server.route(sent(), "b") is None
    assert NO_OBSERVATION.route(sent(), "b") is None


def traced(backend_spans: bool = False) -> tuple[GatewayTelemetry, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return telemetry(provider.get_tracer("test"), backend_spans=backend_spans), exporter


def test_traced_the_routed_request_carries_the_server_span_and_its_exemplars() -> None:
    """Its trace context is the SERVER span's (one span a routed request), and both histograms'
    exemplars name that span's trace."""
    tel, exporter = traced()
    server = tel.server(request(), ORIGIN)
    server.annotate(target="b__echo", backend="b")
    client = server.route(sent(), "b")
    assert client is not None
    assert client.carrier() == server.carrier() != {}
    client.end(REPLIES[1])
    server.end(REPLIES[1])
    (span,) = exporter.get_finished_spans()
    assert span.context is not None
    trace_id = format(span.context.trace_id, "032x")
    recorder = tel._recorder
    assert recorder is not None
    for histogram in (recorder.server_duration, recorder.client_duration):
        (series,) = histogram.by_labels.values()
        assert [e[0] for e in series.exemplars if e is not None] == [trace_id]


def test_traced_a_backend_other_than_the_routed_one_or_backend_spans_get_their_own() -> None:
    """With `telemetry.backend_spans`, or for a backend the SERVER span does not name, the
    request gets a CLIENT span of its own, as before."""
    tel, _ = traced(backend_spans=True)
    server = tel.server(request(), ORIGIN)
    server.annotate(backend="b")
    assert server.route(sent(), "b") is None
    tel, _ = traced()
    server = tel.server(request(), ORIGIN)
    server.annotate(backend="a")
    assert server.route(sent(), "b") is None
