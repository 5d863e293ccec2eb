"""A real Prometheus scrapes a real gateway: the exposition is one Prometheus accepts, and a
stdio-only gateway is reachable for scraping and health checks through its admin listener.

Needs the `prometheus` binary (Debian package `prometheus`, which `.ci/run` installs); without it
these tests skip. Prometheus has no event to wait on, so its query API is polled, each poll short
and the whole wait bounded.
"""

from __future__ import annotations

import re
import shutil
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support import BOUND, PYTHON, START_BOUND, Proc, call, gateway_command, missing

pytestmark = [pytest.mark.slow]

T = TypeVar("T")
# (sample name, labels) -> value, out of a text exposition
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
# Prometheus scrapes every second; the first scrape of a fresh server can take a few intervals.
SCRAPE_BOUND = 30.0
POLL = 0.2
JOB = "mcp-gateway"
DEMO_ARGS = ["-m", "gateway.demo.server"]
# A histogram series as one tools/call of the demo's `echo` leaves it.
ECHO_COUNT = (
    "mcp_server_operation_duration_seconds_count",
    {"error_type": "", "mcp_method_name": "tools/call", "target": "echo"},
)


def _prometheus() -> str:
    path = shutil.which("prometheus")
    if path is None:
        missing("prometheus", "Debian: apt-get install prometheus; .ci/run does")
    return path


def _until(check: Callable[[], T | None], timeout: float, what: str) -> T:
    """Poll `check` until it returns a value; fail naming `what` once `timeout` has passed."""
    end = time.monotonic() + timeout
    while True:
        value = check()
        if value is not None:
            return value
        if time.monotonic() >= end:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(min(POLL, max(0.0, end - time.monotonic())))


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=BOUND) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _samples(exposition: str) -> Samples:
    """Every sample of a text exposition, keyed by name and labels."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    }


def _sample(samples: Samples, name: str, labels: dict[str, str]) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# --- the gateway under test: stdio front end, admin listener, the demo backend -----------------


class StdioGateway:
    def __init__(self, directory: Path, **top: Any) -> None:
        config = directory / "gateway.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "listen": {"stdio": True, "admin": {"host": "127.0.0.1", "port": 0}},
                    "backends": {
                        "demo": {
                            "stdio": {"command": PYTHON, "args": ["-m", "gateway.demo.server"]}
                        }
                    },
                    **top,
                }
            ),
            encoding="utf-8",
        )
        # stdin stays open: closing it would end the stdio front end and so the gateway.
        self.proc = Proc(gateway_command(config), stdin=True)
        self.admin = self.proc.wait_for(r"admin listener \(metrics, health\) on (http://\S+)")[1]
        self.host_port = self.admin.removeprefix("http://")

    def get(self, path: str) -> tuple[int, bytes]:
        return _get(self.admin + path)

    def wait_ready(self) -> dict[str, Any]:
        """The admin listener starts before the backends are reached; /readyz says when they are."""

        def ready() -> dict[str, Any] | None:
            status, body = self.get("/readyz")
            if status != 200:
                return None
            answer: dict[str, Any] = orjson.loads(body)
            return answer

        return _until(ready, START_BOUND, f"/readyz 200 from {self.admin}\n{self.proc.output()}")

    def metrics(self) -> Samples:
        status, body = self.get("/metrics")
        assert status == 200, body[:500]
        return _samples(body.decode())

    def ask(self, msg: dict[str, Any]) -> dict[str, Any]:
        stdin = self.proc.popen.stdin
        assert stdin is not None
        stdin.write(orjson.dumps(msg) + b"\n")
        stdin.flush()
        rid = re.escape(orjson.dumps(msg["id"]).decode())
        line = self.proc.wait_for(f'"id":{rid}[,}}]', stream="stdout", timeout=BOUND).string
        reply: dict[str, Any] = orjson.loads(line)
        return reply


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[StdioGateway]:
    gw = StdioGateway(tmp_path)
    try:
        yield gw
    finally:
        gw.proc.stop()


# --- Prometheus ---------------------------------------------------------------------------------


class Prometheus:
    """A Prometheus server scraping `target` every second, on a free port, with its own TSDB."""

    def __init__(
        self, binary: str, directory: Path, target: str, features: tuple[str, ...] = ()
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        config = directory / "prometheus.yml"
        config.write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "scrape_configs": [
                        {
                            "job_name": JOB,
                            "scrape_interval": "1s",
                            "scrape_timeout": "1s",
                            "metrics_path": "/metrics",
                            "static_configs": [{"targets": [target]}],
                        }
                    ],
                }
            ),
            encoding="utf-8",
        )
        # The free port can be taken before Prometheus binds it: then start again on another.
        for attempt in range(3):
            port = _free_port()
            self.url = f"http://127.0.0.1:{port}"
            self.proc = Proc(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={directory / f'tsdb-{attempt}'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=info",
                    *(f"--enable-feature={feature}" for feature in features),
                ]
            )
            try:
                self.proc.wait_for(r"Server is ready to receive web requests")
                return
            except AssertionError:
                self.proc.stop()
                if "address already in use" not in self.proc.output() or attempt == 2:
                    raise

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector `promql` evaluates to now ([] while nothing is scraped yet)."""
        status, body = _get(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        assert status == 200, body[:500]
        answer = orjson.loads(body)
        assert answer["status"] == "success", answer
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def value_once(self, promql: str, expected: float) -> float | None:
        """The single value of `promql` if it is `expected` already, else None (poll again)."""
        result = self.query(promql)
        if len(result) != 1:
            return None
        value = float(result[0]["value"][1])
        return value if value == expected else None


@pytest.fixture
def prometheus_binary() -> str:
    return _prometheus()


# --- tests --------------------------------------------------------------------------------------


def test_a_real_prometheus_scrapes_the_gateway(
    prometheus_binary: str, gateway: StdioGateway, tmp_path: Path
) -> None:
    prom = Prometheus(prometheus_binary, tmp_path / "prometheus", gateway.host_port)
    try:
        up = f'up{{job="{JOB}"}}'
        _until(
            lambda: prom.value_once(up, 1.0),
            SCRAPE_BOUND,
            f"{up} == 1 on {prom.url}\n{prom.proc.output()}\n--- gateway ---\n"
            + gateway.proc.output(),
        )
        # The backend may be reached a scrape after the gateway first answers.
        backend_up = f'mcp_gateway_backend_up{{job="{JOB}",backend="demo"}}'
        _until(lambda: prom.value_once(backend_up, 1.0), SCRAPE_BOUND, f"{backend_up} == 1")
        [series] = prom.query(backend_up)
        assert series["metric"]["instance"] == gateway.host_port
        # Prometheus stored what it scraped: the target reports healthy, no scrape errors.
        status, body = _get(f"{prom.url}/api/v1/targets?state=active")
        assert status == 200
        [target] = orjson.loads(body)["data"]["activeTargets"]
        assert target["health"] == "up", target
        assert target["lastError"] == "", target
    finally:
        prom.proc.stop()


def test_the_admin_listener_serves_metrics_and_health_for_a_stdio_only_gateway(
    gateway: StdioGateway,
) -> None:
    status, body = gateway.get("/healthz")
    assert status == 200, body
    assert orjson.loads(body) == {"status": "ok"}

    ready = gateway.wait_ready()
    assert ready["status"] == "ready", ready
    assert ready["backends"] == {"demo": True}, ready

    status, body = gateway.get("/metrics")
    assert status == 200, body[:500]
    text = body.decode()
    assert 'mcp_gateway_backend_up{backend="demo"} 1.0' in text
    assert _sample(_samples(text), "mcp_gateway_backend_up", {"backend": "demo"}) == 1.0
    assert _sample(_samples(text), *ECHO_COUNT) is None  # nothing called yet

    reply = gateway.ask(call("m1", "echo", text="hi"))
    assert reply["result"]["content"][0]["text"] == "hi", reply

    # The duration is observed as the reply goes out: allow the scrape a moment to see it.
    count = _until(
        lambda: _sample(gateway.metrics(), *ECHO_COUNT),
        BOUND,
        f"{ECHO_COUNT} on {gateway.admin}/metrics",
    )
    assert count == 1.0


class _OtlpSink(BaseHTTPRequestHandler):
    """Takes OTLP/HTTP trace exports and drops them: the gateway's spans need somewhere to go."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # (quiet)
        pass


@pytest.fixture
def otlp_sink() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OtlpSink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(BOUND)


def test_prometheus_stores_the_trace_id_of_a_sampled_request_as_an_exemplar(
    prometheus_binary: str, otlp_sink: str, tmp_path: Path
) -> None:
    """Prometheus scrapes OpenMetrics (its Accept header asks for it first), which carries the
    exemplars; with exemplar storage on, the trace id of a sampled call is queryable."""
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    gw = StdioGateway(tmp_path, telemetry={"otlp_endpoint": otlp_sink})
    try:
        prom = Prometheus(
            prometheus_binary, tmp_path / "prometheus", gw.host_port, ("exemplar-storage",)
        )
        try:
            msg = call("e1", "echo", text="hi")
            msg["params"]["_meta"]["traceparent"] = f"00-{trace_id}-b7ad6b7169203331-01"
            assert gw.ask(msg)["result"]["content"][0]["text"] == "hi"

            def stored() -> dict[str, Any] | None:
                now = time.time()
                query = urllib.parse.urlencode(
                    {
                        "query": "mcp_server_operation_duration_seconds_bucket",
                        "start": now - 300,
                        "end": now + 60,
                    }
                )
                status, body = _get(f"{prom.url}/api/v1/query_exemplars?{query}")
                assert status == 200, body[:500]
                for series in orjson.loads(body)["data"]:
                    for exemplar in series["exemplars"]:
                        if exemplar["labels"].get("trace_id") == trace_id:
                            found: dict[str, Any] = series["seriesLabels"]
                            return found
                return None

            labels = _until(stored, SCRAPE_BOUND, f"an exemplar trace_id={trace_id}")
            assert labels["mcp_method_name"] == "tools/call" and labels["target"] == "echo"
        finally:
            prom.proc.stop()
    finally:
        gw.proc.stop()
