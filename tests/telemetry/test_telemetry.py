"""Traces, metrics, health and the access log, observed on an in-process gateway with the OTel
in-memory exporter and the gateway's own Prometheus registry (via /metrics)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import orjson
import pytest
import yaml
from aiohttp import web
from opentelemetry import propagate
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import Gateway
from gateway.config import parse
from tests.support import (
    BOUND,
    PYTHON,
    RUDE_SERVER,
    START_BOUND,
    call,
    http_backend,
    mirrored_headers,
    request,
    sdk_stdio_command,
    serve_http,
    start_sdk_http,
    stdio_backend,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"


@pytest.fixture(scope="module")
def beta_url() -> Iterator[str]:
    proc, url = start_sdk_http()
    yield url
    proc.stop()


async def post(session: aiohttp.ClientSession, url: str, msg: dict[str, Any]) -> dict[str, Any]:
    with anyio.fail_after(START_BOUND):
        async with session.post(url, data=orjson.dumps(msg), headers=mirrored_headers(msg)) as resp:
            body = await resp.read()
    if resp.content_type == "text/event-stream":
        body = body.strip().rsplit(b"data: ", 1)[1]
    reply: dict[str, Any] = orjson.loads(body)
    return reply


def traced(msg: dict[str, Any]) -> dict[str, Any]:
    msg["params"]["_meta"] = {**msg["params"]["_meta"], "traceparent": TRACEPARENT}
    return msg


@asynccontextmanager
async def running(
    backends: dict[str, Any], exporter: InMemorySpanExporter | None = None, **top: Any
) -> AsyncIterator[tuple[Gateway, aiohttp.ClientSession, str]]:
    provider = None
    if exporter is not None:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    listen = {"http": {"host": "127.0.0.1", "port": 0}}
    text = yaml.safe_dump({"listen": listen, "backends": backends, **top})
    with anyio.fail_after(START_BOUND):
        async with Gateway(parse(text), tracing=provider) as gw, aiohttp.ClientSession() as s:
            assert gw.http_url is not None
            await gw.catalogs_loaded.wait()  # (the listener serves before they are loaded)
            yield gw, s, gw.http_url


def by_kind(spans: tuple[ReadableSpan, ...], kind: SpanKind) -> list[ReadableSpan]:
    return [s for s in spans if s.kind == kind]


BACKEND_SPANS = {"telemetry": {"backend_spans": True}}


async def test_spans_follow_the_mcp_conventions_and_link_across_hops(beta_url: str) -> None:
    exporter = InMemorySpanExporter()
    backends = {"alpha": stdio_backend(sdk_stdio_command()), "beta": http_backend(beta_url)}
    async with running(backends, exporter, **BACKEND_SPANS) as (_, session, url):
        exporter.clear()  # catalog loads at start-up are spans of their own
        reply = await post(session, url, traced(call(7, "alpha_echo", text="hi")))
        assert reply["result"]["content"][0]["text"] == "hi"
        await post(session, url, traced(call(8, "beta_echo", text="hi")))
    spans = exporter.get_finished_spans()
    servers, clients = by_kind(spans, SpanKind.SERVER), by_kind(spans, SpanKind.CLIENT)
    server = next(s for s in servers if s.attributes and s.attributes["jsonrpc.request.id"] == "7")
    assert server.name == "tools/call alpha_echo"
    assert server.context.trace_id == int(TRACE_ID, 16)  # parented on the client's traceparent
    assert server.attributes is not None
    assert server.attributes["mcp.method.name"] == "tools/call"
    assert server.attributes["gen_ai.tool.name"] == "alpha_echo"
    assert server.attributes["mcp.protocol.version"] == "2026-07-28"
    assert server.attributes["network.transport"] == "tcp"
    assert server.attributes["mcp_gateway.backend"] == "alpha"
    request = {"mcp.method.name", "jsonrpc.request.id", "mcp.protocol.version", "gen_ai.tool.name"}
    # Exactly these: each attribute is paid for on every span (SDK copy, OTLP encoding).
    assert set(server.attributes) == request | {"network.transport", "mcp_gateway.backend"}
    client = next(c for c in clients if c.parent and c.parent.span_id == server.context.span_id)
    assert client.name == "tools/call echo"  # the backend's own name on the CLIENT span
    assert client.attributes is not None
    assert set(client.attributes) == request | {
        "network.transport",
        "mcp_gateway.backend",
        "mcp_gateway.transport",
    }
    assert client.attributes["network.transport"] == "pipe"
    assert client.attributes["mcp_gateway.transport"] == "stdio"
    http_client = next(
        c
        for c in clients
        if c.attributes
        and c.attributes.get("mcp_gateway.backend") == "beta"
        and c.name == "tools/call echo"
    )
    assert http_client.attributes is not None
    assert http_client.attributes["server.address"] == "127.0.0.1"
    assert http_client.context.trace_id == int(TRACE_ID, 16)


def continued(spans: tuple[ReadableSpan, ...], name: str, backend_spans: bool) -> ReadableSpan:
    """The span whose context a routed `tools/call name` carried to its backend: its CLIENT
    span with `backend_spans`, else the client request's SERVER span (and there is no CLIENT
    span for it)."""
    clients = [c for c in by_kind(spans, SpanKind.CLIENT) if c.name == f"tools/call {name}"]
    if backend_spans:
        (client,) = clients
        return client
    assert clients == []
    (server,) = [s for s in by_kind(spans, SpanKind.SERVER) if s.name == f"tools/call {name}"]
    return server


async def test_a_routed_request_is_one_span_the_backend_continues(beta_url: str) -> None:
    """The default (`backend_spans` off): a request routed to one backend is its SERVER span
    alone, naming the backend; the gateway's own requests (catalog loads) stay CLIENT spans."""
    exporter = InMemorySpanExporter()
    backends = {"alpha": stdio_backend(sdk_stdio_command()), "beta": http_backend(beta_url)}
    async with running(backends, exporter) as (_, session, url):
        own = by_kind(exporter.get_finished_spans(), SpanKind.CLIENT)
        assert {c.name for c in own} >= {"tools/list"}
        assert all(c.parent is None for c in own)
        exporter.clear()
        await post(session, url, traced(call(7, "alpha_echo", text="hi")))
        await post(session, url, traced(call(8, "beta_echo", text="hi")))
    spans = exporter.get_finished_spans()
    assert by_kind(spans, SpanKind.CLIENT) == []
    by_id = {s.attributes["jsonrpc.request.id"]: s for s in spans if s.attributes}
    assert {
        k: (s.kind, s.attributes and s.attributes["mcp_gateway.backend"]) for k, s in by_id.items()
    } == {
        "7": (SpanKind.SERVER, "alpha"),
        "8": (SpanKind.SERVER, "beta"),
    }
    assert {s.context.trace_id for s in spans} == {int(TRACE_ID, 16)}


@pytest.mark.parametrize("backend_spans", [False, True])
async def test_stdio_backends_get_trace_context_in_meta(
    tmp_path: Path, backend_spans: bool
) -> None:
    exporter = InMemorySpanExporter()
    notes, requests = tmp_path / "notes.jsonl", tmp_path / "requests.jsonl"
    rude = stdio_backend([PYTHON, RUDE_SERVER, str(notes), str(requests)])
    top = {"telemetry": {"backend_spans": backend_spans}}
    async with running({"rude": rude}, exporter, **top) as (_, session, url):
        reply = await post(session, url, traced(call(7, "ok")))
        assert reply["result"]["content"][0]["text"] == "ok"
    client = continued(exporter.get_finished_spans(), "ok", backend_spans)
    sent = [orjson.loads(line) for line in requests.read_bytes().splitlines()]
    hop = next(m for m in sent if m["method"] == "tools/call")
    expected = f"00-{client.context.trace_id:032x}-{client.context.span_id:016x}-01"
    assert hop["params"]["_meta"]["traceparent"] == expected
    assert client.context.trace_id == int(TRACE_ID, 16)


@pytest.mark.parametrize("backend_spans", [False, True])
async def test_http_backends_get_trace_context_in_meta_and_headers(backend_spans: bool) -> None:
    exporter = InMemorySpanExporter()
    seen: list[tuple[dict[str, str], dict[str, Any]]] = []

    async def handler(request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        seen.append((dict(request.headers), body))
        result = {
            "resultType": "complete",
            "supportedVersions": ["2026-07-28"],
            "capabilities": {"tools": {}},
            "tools": [{"name": "t", "inputSchema": {"type": "object"}}],
            "content": [],
        }
        return web.json_response({"jsonrpc": "2.0", "id": body["id"], "result": result})

    top = {"telemetry": {"backend_spans": backend_spans}}
    async with (
        serve_http(handler) as base,
        running({"b": http_backend(f"{base}/mcp")}, exporter, **top) as (_, session, url),
    ):
        exporter.clear()
        await post(session, url, traced(call(1, "t")))
    headers, body = next((h, b) for h, b in seen if b["method"] == "tools/call")
    client = continued(exporter.get_finished_spans(), "t", backend_spans)
    expected = f"00-{client.context.trace_id:032x}-{client.context.span_id:016x}-01"
    assert body["params"]["_meta"]["traceparent"] == expected
    assert headers["traceparent"] == expected


async def test_a_traceparent_header_parents_the_span_when_meta_has_none() -> None:
    """Trace context from the HTTP request's headers (any case) when `_meta` carries none."""
    exporter = InMemorySpanExporter()
    demo = stdio_backend([PYTHON, "-m", "gateway.demo.server"])
    async with running({"demo": demo}, exporter) as (_, session, url):
        exporter.clear()
        msg = call(4, "echo", text="x")
        headers = {**mirrored_headers(msg), "TraceParent": TRACEPARENT}
        with anyio.fail_after(START_BOUND):
            async with session.post(url, data=orjson.dumps(msg), headers=headers) as resp:
                assert resp.status == 200
                await resp.read()
    (server,) = by_kind(exporter.get_finished_spans(), SpanKind.SERVER)
    assert server.context.trace_id == int(TRACE_ID, 16)
    assert server.parent is not None and server.parent.span_id == int(TRACEPARENT[36:52], 16)


async def test_other_propagators_carry_the_context_their_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The traceparent is formatted directly only under the default OTEL_PROPAGATORS; another
    setting's propagators do the injecting (here baggage alone: no traceparent at all)."""
    monkeypatch.setenv("OTEL_PROPAGATORS", "baggage")
    before = propagate.get_global_textmap()
    propagate.set_global_textmap(W3CBaggagePropagator())
    seen: list[dict[str, str]] = []

    async def handler(request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        seen.append(dict(request.headers))
        result = {"resultType": "complete", "content": [], "tools": [], "capabilities": {}}
        return web.json_response({"jsonrpc": "2.0", "id": body["id"], "result": result})

    try:
        async with (
            serve_http(handler) as base,
            running({"b": http_backend(f"{base}/mcp")}, InMemorySpanExporter()) as (_, s, url),
        ):
            seen.clear()
            await post(s, url, traced(call(1, "t")))
    finally:
        propagate.set_global_textmap(before)
    assert seen and all("traceparent" not in h for h in seen)


async def test_a_resource_uri_is_an_attribute_not_part_of_the_span_name() -> None:
    """MCP conventions, span name: `{method} {target}` with a tool or prompt name as target; a
    resource URI (unbounded) only as `mcp.resource.uri`."""
    exporter = InMemorySpanExporter()
    demo = stdio_backend([PYTHON, "-m", "gateway.demo.server"])
    async with running({"demo": demo}, exporter) as (_, session, url):
        exporter.clear()
        msg = request(3, "resources/read", {"uri": "demo://echo/hello"})
        reply = await post(session, url, msg)
        assert reply["result"]["contents"][0]["text"] == "hello"
    (server,) = by_kind(exporter.get_finished_spans(), SpanKind.SERVER)
    assert server.name == "resources/read"
    assert server.attributes is not None
    assert server.attributes["mcp.resource.uri"] == "demo://echo/hello"


async def test_errors_are_recorded_on_spans() -> None:
    exporter = InMemorySpanExporter()
    async with running(
        {"demo": stdio_backend([PYTHON, "-m", "gateway.demo.server"])}, exporter
    ) as (_, session, url):
        exporter.clear()
        reply = await post(session, url, call(1, "no_such_tool"))
    assert reply["error"]["code"] == -32602
    (server,) = by_kind(exporter.get_finished_spans(), SpanKind.SERVER)
    assert server.attributes is not None
    assert server.attributes["error.type"] == "-32602"
    assert server.attributes["rpc.response.status_code"] == "-32602"
    assert server.status.status_code == StatusCode.ERROR


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_metrics_count_known_traffic_with_bounded_labels() -> None:
    demo = stdio_backend([PYTHON, "-m", "gateway.demo.server"])
    async with running({"demo": demo}) as (_, session, url):
        for i in range(3):
            await post(session, url, call(i, "echo", text="x"))
        await post(session, url, call(9, "totally_unknown_tool"))
        bad = call(10, "echo", text="x")
        async with session.post(
            url, data=orjson.dumps(bad), headers={**mirrored_headers(bad), "Mcp-Name": "other"}
        ) as resp:
            assert resp.status == 400
        metrics_url = url.removesuffix("/mcp") + "/metrics"
        async with session.get(metrics_url) as resp:
            text = await resp.text()
        async with session.get(url.removesuffix("/mcp") + "/readyz") as ready:
            assert ready.status == 200
    got = samples(text)
    ok = (("error_type", ""), ("mcp_method_name", "tools/call"), ("target", "echo"))
    assert got[("mcp_server_operation_duration_seconds_count", ok)] == 3
    # The single unprefixed backend answers unknown names itself; they count under "_other".
    other = [
        k
        for k in got
        if k[0] == "mcp_server_operation_duration_seconds_count" and ("target", "_other") in k[1]
    ]
    assert other and "totally_unknown_tool" not in text
    client = (
        ("backend", "demo"),
        ("error_type", ""),
        ("mcp_method_name", "tools/call"),
        ("target", "echo"),
    )
    assert got[("mcp_client_operation_duration_seconds_count", client)] == 3
    assert got[("mcp_gateway_rejections_total", (("reason", "header_mismatch"),))] == 1
    assert got[("mcp_gateway_backend_up", (("backend", "demo"),))] == 1
    assert got[("mcp_gateway_backend_era", (("backend", "demo"), ("era", "modern")))] == 1
    assert got[("mcp_gateway_bytes_total", (("direction", "in"), ("hop", "frontend")))] > 0
    assert got[("mcp_gateway_catalog_refreshes_total", (("backend", "demo"),))] == 1


async def test_exemplars_carry_trace_ids_in_openmetrics() -> None:
    exporter = InMemorySpanExporter()
    async with running(
        {"demo": stdio_backend([PYTHON, "-m", "gateway.demo.server"])}, exporter
    ) as (_, session, url):
        await post(session, url, traced(call(1, "echo", text="x")))
        accept = {"Accept": "application/openmetrics-text; version=1.0.0"}
        async with session.get(url.removesuffix("/mcp") + "/metrics", headers=accept) as resp:
            text = await resp.text()
    assert f'trace_id="{TRACE_ID}"' in text
    # Both histograms: the routed request's SERVER span stands for the backend hop too.
    for histogram in (
        "mcp_server_operation_duration_seconds",
        "mcp_client_operation_duration_seconds",
    ):
        lines = [line for line in text.splitlines() if line.startswith(f"{histogram}_bucket")]
        assert any(f'# {{trace_id="{TRACE_ID}"}}' in line for line in lines), histogram


async def test_readyz_names_a_backend_that_is_down() -> None:
    down = http_backend("http://127.0.0.1:9/mcp", connect_timeout=0.5)
    demo = stdio_backend([PYTHON, "-m", "gateway.demo.server"])
    async with running({"demo": demo, "down": down}) as (_, session, url):
        base = url.removesuffix("/mcp")
        async with session.get(base + "/healthz") as health:
            assert health.status == 200
        async with session.get(base + "/readyz") as ready:
            assert ready.status == 503
            assert (await ready.json())["backends"] == {"demo": True, "down": False}


async def test_access_log_writes_one_json_line_per_request(tmp_path: Path) -> None:
    log_file = tmp_path / "access.log"
    demo = stdio_backend([PYTHON, "-m", "gateway.demo.server"])
    async with running({"demo": demo}, telemetry={"access_log": str(log_file)}) as (
        _,
        session,
        url,
    ):
        await post(session, url, call(1, "echo", text="x"))
    lines = [orjson.loads(line) for line in log_file.read_bytes().splitlines()]
    (line,) = [entry for entry in lines if entry["method"] == "tools/call"]
    assert line["name"] == "echo" and line["backend"] == "demo" and line["outcome"] == "ok"
    assert line["client"] == "127.0.0.1" and line["duration_ms"] >= 0


async def test_spans_are_exported_over_otlp_http() -> None:
    received: list[ExportTraceServiceRequest] = []
    got = anyio.Event()

    async def collector(request: web.Request) -> web.Response:
        export = ExportTraceServiceRequest()
        export.ParseFromString(await request.read())
        received.append(export)
        got.set()
        return web.Response(status=200)

    async with serve_http(collector, "/v1/traces") as endpoint:
        demo = stdio_backend([PYTHON, "-m", "gateway.demo.server"])
        telemetry = {"otlp_endpoint": endpoint}
        async with running({"demo": demo}, telemetry=telemetry) as (_, session, url):
            await post(session, url, call(1, "echo", text="x"))
        with anyio.fail_after(BOUND):
            await got.wait()
    names = {
        span.name
        for export in received
        for resource in export.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    }
    assert {"tools/call echo"} <= names


async def test_the_standard_sampler_variables_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    """The documented production setting: a parent-based ratio from OTEL_TRACES_SAMPLER(_ARG).
    At ratio 0 no root request is exported, but a client's sampled traceparent is followed, with
    its SERVER and CLIENT spans and their attributes, over the real OTLP exporter."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # (the standard variable; default 5 s)
    spans: list[ProtoSpan] = []
    both = anyio.Event()

    async def collector(request: web.Request) -> web.Response:
        export = ExportTraceServiceRequest()
        export.ParseFromString(await request.read())
        for resource in export.resource_spans:
            for scope in resource.scope_spans:
                spans.extend(scope.spans)
        if len({span.kind for span in spans}) == 2:
            both.set()
        return web.Response(status=200)

    async with serve_http(collector, "/v1/traces") as endpoint:
        demo = stdio_backend([PYTHON, "-m", "gateway.demo.server"])
        telemetry = {"otlp_endpoint": endpoint, "backend_spans": True}
        async with running({"demo": demo}, telemetry=telemetry) as (_, session, url):
            await post(session, url, call(1, "echo", text="x"))  # a root: not sampled
            await post(session, url, traced(call(2, "echo", text="y")))
            # Exported while the gateway runs: its collector shares the gateway's event loop.
            with anyio.fail_after(BOUND):
                await both.wait()
    assert spans and {span.trace_id.hex() for span in spans} == {TRACE_ID}
    attrs = {
        span.kind: {kv.key: kv.value.string_value or kv.value.int_value for kv in span.attributes}
        for span in spans
    }
    server, client = attrs[ProtoSpan.SPAN_KIND_SERVER], attrs[ProtoSpan.SPAN_KIND_CLIENT]
    assert server["jsonrpc.request.id"] == "2" and server["gen_ai.tool.name"] == "echo"
    assert server["mcp.method.name"] == "tools/call" and server["network.transport"] == "tcp"
    assert client["mcp_gateway.backend"] == "demo" and client["network.transport"] == "pipe"


async def test_the_tap_records_both_hops_with_redaction(tmp_path: Path) -> None:
    path = tmp_path / "traffic.jsonl"
    demo = stdio_backend([PYTHON, "-m", "gateway.demo.server"])
    tap = {"path": str(path), "redact": ["params.arguments.text", "result.content"]}
    async with running({"demo": demo}, tap=tap) as (_, session, url):
        msg = call("tapped", "echo", text="secret")
        headers = {**mirrored_headers(msg), "Authorization": "Bearer secret"}
        async with session.post(url, data=orjson.dumps(msg), headers=headers) as resp:
            assert resp.status == 200
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    hops = [
        (entry["hop"], entry["dir"])
        for entry in lines
        if entry["msg"].get("id") == "tapped" or entry["msg"].get("method") == "tools/call"
    ]
    assert hops[:1] == [("frontend", "in")] and ("frontend", "out") in hops
    # The backend hop as the child saw it: the stdio channel's own id, and the reply to it.
    sent = [e for e in lines if e["hop"] == "backend" and e["msg"].get("method") == "tools/call"]
    assert [e["dir"] for e in sent] == ["out"] and sent[0]["msg"]["id"] != "tapped"
    answered = [e for e in lines if e["hop"] == "backend" and e["dir"] == "in"]
    assert sent[0]["msg"]["id"] in [e["msg"].get("id") for e in answered]
    calls = [e for e in lines if e["msg"].get("method") == "tools/call"]
    assert all(e["msg"]["params"]["arguments"]["text"] == "[redacted]" for e in calls)
    first = lines[[e["msg"].get("id") for e in lines].index("tapped")]
    assert first["headers"]["Mcp-Name"] == "echo"
    assert first["headers"]["Authorization"] == "[redacted]"
    assert b"secret" not in path.read_bytes().replace(b"[redacted]", b"")
