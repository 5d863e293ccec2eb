"""The gateway's span exporter (telemetry/otlp.py) against a collector of our own on 127.0.0.1:
what arrives, in which batches, retried when and how often, with which headers, compressed,
over TLS; what is dropped when the buffer is full; and that shutdown flushes without hanging."""

from __future__ import annotations

import datetime
import ipaddress
import logging
import ssl
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
import yaml
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind
from opentelemetry.util.types import AttributeValue
from prometheus_client import generate_latest

from gateway.app import Gateway
from gateway.config import parse
from gateway.origin import STDIO_ORIGIN
from gateway.telemetry.otlp import ENCODE_CHUNK, OtlpSpanProcessor
from gateway.telemetry.otlp_settings import Settings, UnsupportedProtocol
from tests.servers.forward_proxy import ForwardProxy
from tests.support import BOUND, PYTHON, START_BOUND, call, serve_http, stdio_backend, until

pytestmark = pytest.mark.anyio

# (status, headers) the collector answers, in order; None: it never answers.
Answer = tuple[int | None, dict[str, str]]


class Collector:
    """Records every export it is sent; answers from `answers`, then 200."""

    def __init__(self, answers: list[Answer] | None = None) -> None:
        self.answers = list(answers or [])
        self.headers: list[dict[str, str]] = []
        self.exports: list[ExportTraceServiceRequest] = []
        self.times: list[float] = []
        self._arrived = anyio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()  # (aiohttp's server undoes a Content-Encoding)
        self.headers.append(dict(request.headers))
        self.exports.append(ExportTraceServiceRequest.FromString(body))
        self.times.append(time.monotonic())
        self._arrived.set()
        self._arrived = anyio.Event()
        status, headers = self.answers.pop(0) if self.answers else (200, {})
        if status is None:
            await anyio.sleep_forever()
        return web.Response(status=status or 200, headers=headers)

    async def wait_for(self, requests: int) -> None:
        with anyio.fail_after(BOUND):
            while len(self.exports) < requests:
                await self._arrived.wait()

    def spans(self, index: int | None = None) -> list[ProtoSpan]:
        exports = self.exports if index is None else [self.exports[index]]
        return [
            span
            for export in exports
            for resource in export.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]


@asynccontextmanager
async def collecting(answers: list[Answer] | None = None) -> AsyncIterator[tuple[Collector, str]]:
    collector = Collector(answers)
    async with serve_http(collector.handle, "/v1/traces") as base:
        yield collector, f"{base}/v1/traces"


def settings(url: str, **env: str) -> Settings:
    made = Settings.from_env(url, env)
    assert made is not None
    return made


@asynccontextmanager
async def exporting(
    setup: Settings, run: bool = True
) -> AsyncIterator[tuple[OtlpSpanProcessor, TracerProvider]]:
    """A processor on a provider of its own, its export task running (`run`) until the block
    ends, then closed as the gateway closes it."""
    processor = OtlpSpanProcessor(setup)
    provider = TracerProvider(
        resource=Resource.create({"service.name": "otlp-test"}), shutdown_on_exit=False
    )
    provider.add_span_processor(processor)
    try:
        async with anyio.create_task_group() as tg:
            if run:
                tg.start_soon(processor.run)
            yield processor, provider
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await processor.close()


def end_spans(provider: TracerProvider, count: int, prefix: str = "span") -> None:
    tracer = provider.get_tracer("test", "1.0")
    for n in range(count):
        attributes: dict[str, AttributeValue] = {"mcp.method.name": "tools/call", "n": n}
        tracer.start_span(f"{prefix} {n}", kind=SpanKind.CLIENT, attributes=attributes).end()


async def test_spans_arrive_and_decode() -> None:
    async with (
        collecting() as (collector, url),
        exporting(settings(url, OTEL_BSP_SCHEDULE_DELAY="50")) as (processor, provider),
    ):
        end_spans(provider, 3)
        await collector.wait_for(1)
    assert processor.spans == {"exported": 3, "dropped": 0, "failed": 0}
    assert len(collector.exports) == 1 and processor.queued == 0
    export = collector.exports[0]
    resource = export.resource_spans[0].resource
    assert {kv.key: kv.value.string_value for kv in resource.attributes}["service.name"] == (
        "otlp-test"
    )
    scope = export.resource_spans[0].scope_spans[0].scope
    assert (scope.name, scope.version) == ("test", "1.0")
    assert [s.name for s in collector.spans()] == ["span 0", "span 1", "span 2"]
    assert all(s.kind == ProtoSpan.SPAN_KIND_CLIENT for s in collector.spans())
    assert collector.headers[0]["Content-Type"] == "application/x-protobuf"


async def test_unsampled_spans_are_not_exported() -> None:
    async with collecting() as (collector, url):
        async with exporting(settings(url)) as (processor, provider):
            tracer = provider.get_tracer("test")
            with tracer.start_as_current_span("sampled"):
                pass
            unsampled = TracerProvider(shutdown_on_exit=False, sampler=ALWAYS_OFF)
            unsampled.add_span_processor(processor)
            unsampled.get_tracer("test").start_span("not sampled").end()
        await collector.wait_for(1)
    assert [s.name for s in collector.spans()] == ["sampled"]


async def test_batches_hold_at_most_the_batch_size() -> None:
    """Full batches leave at once (the schedule delay is long); the rest at shutdown."""
    async with collecting() as (collector, url):
        setup = settings(url, OTEL_BSP_MAX_EXPORT_BATCH_SIZE="4", OTEL_BSP_SCHEDULE_DELAY="60000")
        async with exporting(setup) as (processor, provider):
            end_spans(provider, 10)
            await collector.wait_for(2)
            assert processor.queued == 2  # (not a full batch: it waits)
        await collector.wait_for(3)
    assert [len(collector.spans(i)) for i in range(3)] == [4, 4, 2]
    assert [s.name for s in collector.spans()] == [f"span {n}" for n in range(10)]
    assert processor.spans == {"exported": 10, "dropped": 0, "failed": 0}


async def test_ended_spans_are_encoded_a_chunk_at_a_time_not_held_for_their_batch() -> None:
    """Spans wait for their batch (and its delay) encoded, not as the SDK's span objects: every
    ENCODE_CHUNK ended spans wake the export task to encode them."""
    async with collecting() as (collector, url):
        setup = settings(url, OTEL_BSP_SCHEDULE_DELAY="60000")
        async with exporting(setup) as (processor, provider):
            end_spans(provider, ENCODE_CHUNK)
            await until(lambda: not processor.unencoded)
            assert processor.queued == ENCODE_CHUNK and not collector.exports
            end_spans(provider, 3, "more")
            assert processor.unencoded == 3  # (less than a chunk waits for the next one)
        await collector.wait_for(1)
    assert len(collector.spans()) == ENCODE_CHUNK + 3


async def test_a_503_is_retried_and_the_batch_arrives_once() -> None:
    async with collecting([(503, {})]) as (collector, url):
        async with exporting(settings(url, OTEL_BSP_SCHEDULE_DELAY="50")) as (processor, provider):
            end_spans(provider, 3)
            await collector.wait_for(2)
        assert len(collector.exports) == 2  # the refused one and its retry, no more
    # The retry waited for a backoff (about a second, jittered), not at once.
    assert collector.times[1] - collector.times[0] >= 0.7
    assert processor.spans == {"exported": 3, "dropped": 0, "failed": 0}


async def test_retry_after_is_honoured() -> None:
    answers: list[Answer] = [(429, {"Retry-After": "0.4"}), (502, {"Retry-After": "0"})]
    async with (
        collecting(answers) as (collector, url),
        exporting(settings(url, OTEL_BSP_SCHEDULE_DELAY="50")) as (processor, provider),
    ):
        end_spans(provider, 2)
        await collector.wait_for(3)
    first, second = (b - a for a, b in zip(collector.times, collector.times[1:], strict=False))
    assert 0.4 <= first < 0.75  # (the backoff would have waited 0.8 s at least)
    assert second < 0.4
    assert processor.spans["exported"] == 2 and len(collector.exports) == 3


async def test_a_400_is_not_retried(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "gateway.telemetry.otlp")
    env = {"OTEL_BSP_SCHEDULE_DELAY": "50", "OTEL_EXPORTER_OTLP_HEADERS": "api-key=s3cret"}
    async with collecting([(400, {})]) as (collector, url):
        async with exporting(settings(url, **env)) as (processor, provider):
            end_spans(provider, 3)
            await collector.wait_for(1)
        # (close() waited for the batch's delivery, retries included: there were none)
        assert len(collector.exports) == 1
    assert processor.spans == {"exported": 0, "dropped": 0, "failed": 3}
    lines = [r for r in caplog.records if r.name == "gateway.telemetry.otlp"]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING and lines[0].exc_info is None
    assert "HTTP 400" in lines[0].getMessage() and "3 spans" in lines[0].getMessage()
    assert "s3cret" not in caplog.text


async def test_gzip_compression() -> None:
    async with collecting() as (collector, url):
        setup = settings(url, OTEL_EXPORTER_OTLP_TRACES_COMPRESSION="gzip")
        async with exporting(setup, run=False) as (_, provider):
            end_spans(provider, 50)
        await collector.wait_for(1)
    assert collector.headers[0]["Content-Encoding"] == "gzip"
    assert int(collector.headers[0]["Content-Length"]) < len(
        collector.exports[0].SerializeToString()
    )
    assert len(collector.spans()) == 50


async def test_headers_from_the_environment_arrive() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_HEADERS": "api-key=s3cret,x-tenant=team%20a",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "",  # (empty: the general one applies)
    }
    async with collecting() as (collector, url):
        async with exporting(settings(url, **env), run=False) as (_, provider):
            end_spans(provider, 1)
        await collector.wait_for(1)
        env["OTEL_EXPORTER_OTLP_TRACES_HEADERS"] = "api-key=traces-only"
        async with exporting(settings(url, **env), run=False) as (_, provider):
            end_spans(provider, 1)
        await collector.wait_for(2)
    first, second = collector.headers
    assert first["api-key"] == "s3cret" and first["x-tenant"] == "team a"
    # The traces variable replaces the general one whole, as in the SDK's exporter.
    assert second["api-key"] == "traces-only" and "x-tenant" not in second


async def test_a_full_buffer_drops_and_counts() -> None:
    async with collecting() as (collector, url):
        setup = settings(url, OTEL_BSP_MAX_QUEUE_SIZE="5", OTEL_BSP_MAX_EXPORT_BATCH_SIZE="5")
        async with exporting(setup, run=False) as (processor, provider):
            end_spans(provider, 8)
            assert processor.queued == 5
            assert processor.spans["dropped"] == 3
        await collector.wait_for(1)
    assert [s.name for s in collector.spans()] == [f"span {n}" for n in range(5)]
    assert processor.spans == {"exported": 5, "dropped": 3, "failed": 0}


async def test_shutdown_flushes_what_is_buffered() -> None:
    async with collecting() as (collector, url):
        setup = settings(url, OTEL_BSP_SCHEDULE_DELAY="60000")
        async with exporting(setup) as (processor, provider):
            end_spans(provider, 3)
            assert processor.queued == 3 and not collector.exports
        await collector.wait_for(1)  # (sent by close(), before the block ended)
        assert len(collector.spans()) == 3
        end_spans(provider, 1)  # after the close: dropped, never sent
    assert processor.spans == {"exported": 3, "dropped": 1, "failed": 0}


async def test_a_collector_that_never_answers_does_not_hang_shutdown() -> None:
    env = {"OTEL_EXPORTER_OTLP_TIMEOUT": "0.2", "OTEL_BSP_EXPORT_TIMEOUT": "600"}
    async with collecting([(None, {})] * 10) as (collector, url):
        started = 0.0
        async with exporting(settings(url, **env), run=False) as (processor, provider):
            end_spans(provider, 3)
            started = time.monotonic()
        assert time.monotonic() - started < 1.5
        assert len(collector.exports) >= 1
    assert processor.spans["failed"] == 3


async def test_the_sdk_flush_and_shutdown_do_not_block_the_loop() -> None:
    """force_flush from another thread flushes; shutdown on the loop's thread returns at once
    (it cannot wait for the loop it is blocking)."""
    async with (
        collecting() as (collector, url),
        exporting(settings(url, OTEL_BSP_SCHEDULE_DELAY="60000")) as (_, provider),
    ):
        end_spans(provider, 2)
        flushed = await anyio.to_thread.run_sync(provider.force_flush, 5000)
        assert flushed and len(collector.spans()) == 2
        assert threading.current_thread() is threading.main_thread()
        started = time.monotonic()
        provider.shutdown()
        assert time.monotonic() - started < 0.5
        end_spans(provider, 1)  # (ended after shutdown: not taken)


async def test_invalid_settings_fall_back_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "gateway.telemetry.otlp")
    env = {
        "OTEL_BSP_SCHEDULE_DELAY": "soon",
        "OTEL_BSP_MAX_QUEUE_SIZE": "-3",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "ten",
        "OTEL_EXPORTER_OTLP_COMPRESSION": "brotli",
    }
    setup = settings("http://127.0.0.1:1/v1/traces", **env)
    assert (setup.schedule_delay, setup.max_queue_size, setup.timeout) == (5.0, 2048, 10.0)
    assert setup.compression == "none" and setup.export_timeout == 30.0
    assert len(caplog.records) == 4
    assert Settings.from_env(None, {}) is None
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"}
    assert settings_url(None, endpoint) == "http://collector:4318/v1/traces"
    traces = {**endpoint, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://other/custom"}
    assert settings_url(None, traces) == "http://other/custom"
    assert settings_url("http://config/v1/traces", traces) == "http://config/v1/traces"


def settings_url(url: str | None, env: dict[str, str]) -> str:
    made = Settings.from_env(url, env)
    assert made is not None
    return made.url


# --- TLS ---


def _certificate(
    subject: str, key: ec.EllipticCurvePrivateKey, issuer: tuple[x509.Certificate, Any] | None
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer[0].subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
    )
    if issuer is None:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
    else:
        san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
        builder = builder.add_extension(san, False)
    return builder.sign(issuer[1] if issuer else key, hashes.SHA256())


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Path:
    path.with_suffix(".key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


async def test_a_tls_collector_with_a_ca_file_and_a_client_certificate(tmp_path: Path) -> None:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("test CA", ca_key, None)
    ca_file = _write(tmp_path / "ca.pem", ca, ca_key)
    server_key, client_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    server = _write(
        tmp_path / "server.pem", _certificate("collector", server_key, (ca, ca_key)), server_key
    )
    client = _write(
        tmp_path / "client.pem", _certificate("gateway", client_key, (ca, ca_key)), client_key
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ca_file))
    context.load_cert_chain(server, server.with_suffix(".key"))
    context.verify_mode = ssl.CERT_REQUIRED  # (mutual TLS: the gateway's certificate too)
    collector = Collector()
    app = web.Application()
    app.router.add_post("/v1/traces", collector.handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context).start()
        url = f"https://127.0.0.1:{runner.addresses[0][1]}/v1/traces"
        env = {
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": str(ca_file),
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": str(client),
            "OTEL_EXPORTER_OTLP_CLIENT_KEY": str(client.with_suffix(".key")),
        }
        async with exporting(settings(url, **env), run=False) as (processor, provider):
            end_spans(provider, 2)
        await collector.wait_for(1)
    finally:
        with anyio.CancelScope(shield=True):
            await runner.cleanup()
    assert len(collector.spans()) == 2 and processor.spans["exported"] == 2


# --- in the gateway ---


async def test_the_gateway_exports_counts_and_shuts_down_within_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A gateway whose collector never answers still stops promptly, and says so in its
    metrics; the spans were the request's SERVER and CLIENT spans."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "0.2")
    monkeypatch.setenv("OTEL_BSP_EXPORT_TIMEOUT", "500")
    async with collecting([(None, {})] * 10) as (collector, endpoint):
        demo = stdio_backend([PYTHON, "-m", "gateway.demo.server"])
        text = yaml.safe_dump(
            {
                "listen": {"stdio": True},
                "backends": {"demo": demo},
                "telemetry": {"otlp_endpoint": endpoint.removesuffix("/v1/traces")},
            }
        )
        with anyio.fail_after(START_BOUND):
            gateway = Gateway(parse(text))
            assert gateway.otlp is not None
            async with gateway:
                await gateway.catalogs_loaded.wait()
                msg = call(1, "echo", text="x")
                reply = await gateway.dispatcher.handle(msg, _ignore, STDIO_ORIGIN)
                assert "result" in reply
                stopping = time.monotonic()
        assert time.monotonic() - stopping < 3.0  # (backends' stop included)
        await collector.wait_for(1)
    kinds = {s.kind for s in collector.spans()}
    assert kinds == {ProtoSpan.SPAN_KIND_SERVER, ProtoSpan.SPAN_KIND_CLIENT}
    metrics = generate_latest(gateway.registry).decode()
    failed = len(collector.spans())  # (the catalog's loads have CLIENT spans too)
    assert f'mcp_gateway_trace_spans_total{{outcome="failed"}} {failed:.1f}' in metrics
    assert 'mcp_gateway_trace_spans_total{outcome="exported"} 0.0' in metrics
    assert "mcp_gateway_trace_spans_queued 0.0" in metrics


async def _ignore(notification: dict[str, Any]) -> None:
    pass


# --- a forward proxy named by the environment ---


@pytest.mark.parametrize("exempt", [False, True])
async def test_spans_go_through_the_proxy_the_environment_names(
    monkeypatch: pytest.MonkeyPatch, exempt: bool
) -> None:
    """HTTP_PROXY applies to the collector as to HTTP backends (gateway/proxies.py), and
    NO_PROXY exempts it."""
    for name in ("http_proxy", "https_proxy", "no_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    async with ForwardProxy() as proxy, collecting() as (collector, url):
        monkeypatch.setenv("http_proxy", proxy.url)
        monkeypatch.setenv("no_proxy", "127.0.0.1" if exempt else "")
        setup = settings(url, OTEL_BSP_SCHEDULE_DELAY="50")
        assert (setup.proxy is None) is exempt
        async with exporting(setup) as (processor, provider):
            end_spans(provider, 2)
            await collector.wait_for(1)
    assert processor.spans["exported"] == 2
    lines = [seen.request_line for seen in proxy.seen]
    assert lines == ([] if exempt else [f"POST {url} HTTP/1.1"])


@pytest.mark.parametrize(
    "variable", ["OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"]
)
@pytest.mark.parametrize("protocol", ["grpc", "http/json", "thrift"])
def test_a_protocol_other_than_http_protobuf_is_refused_naming_its_variable(
    variable: str, protocol: str
) -> None:
    """OTEL_EXPORTER_OTLP_PROTOCOL (the OpenTelemetry exporter spec): spans sent as HTTP to a
    gRPC port would be lost without a word, so the start is refused in one line instead."""
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", variable: protocol}
    with pytest.raises(UnsupportedProtocol) as refused:
        Settings.from_env(None, env)
    text = str(refused.value)
    assert text.startswith(f"{variable}={protocol} is not supported") and "\n" not in text
    assert "http/protobuf" in text and "4318" in text


@pytest.mark.parametrize("protocol", ["http/protobuf", "HTTP/PROTOBUF", " ", ""])
def test_http_protobuf_or_nothing_is_what_is_sent(protocol: str) -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
    }
    made = Settings.from_env(None, env)
    assert made is not None and made.url == "http://127.0.0.1:4318/v1/traces"


def test_the_traces_protocol_wins_over_the_general_one() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
    }
    assert Settings.from_env(None, env) is not None


def test_a_protocol_without_an_endpoint_changes_nothing() -> None:
    """No endpoint, no tracing: nothing is sent, so nothing is refused."""
    assert Settings.from_env(None, {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) is None
