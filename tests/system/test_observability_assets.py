"""The operator-facing observability assets: Grafana provisioning and dashboard, Prometheus and
OpenTelemetry Collector configs, Dockerfile and docker-compose.yml (who can reach the stack and
the image's pins, user and health check: tests/system/test_docker.py).

Docker is not needed: the files are parsed and cross-checked (every metric the dashboard queries
is one the gateway exports, every mounted file exists, ports agree). `promtool`, where installed
(Debian package `prometheus`), checks the Prometheus config and the dashboard's PromQL syntax.
One test compares the dashboard with a live gateway's `/metrics`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from gateway.config import parse
from tests.support import BOUND, DEMO_BACKEND, META, START_BOUND, Proc, gateway_command, missing

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "grafana" / "dashboards" / "mcp-gateway.json"
DATASOURCES = ROOT / "grafana" / "provisioning" / "datasources" / "prometheus.yaml"
DASHBOARD_PROVIDERS = ROOT / "grafana" / "provisioning" / "dashboards" / "dashboards.yaml"
PROMETHEUS = ROOT / "prometheus" / "prometheus.yml"
COLLECTOR = ROOT / "otel-collector.yaml"
COMPOSE = ROOT / "docker-compose.yml"
COMPOSE_GATEWAY = ROOT / "deploy" / "compose-gateway.yaml"
DOCKERFILE = ROOT / "Dockerfile"
YAML_FILES = [DATASOURCES, DASHBOARD_PROVIDERS, PROMETHEUS, COLLECTOR, COMPOSE, COMPOSE_GATEWAY]

# The metrics the gateway exports on /metrics: name as queried -> (type, label names).
EXPORTED_METRICS: dict[str, tuple[str, frozenset[str]]] = {
    "mcp_server_operation_duration_seconds": (
        "histogram",
        frozenset({"mcp_method_name", "target", "error_type"}),
    ),
    "mcp_client_operation_duration_seconds": (
        "histogram",
        frozenset({"mcp_method_name", "target", "backend", "error_type"}),
    ),
    "mcp_gateway_requests_in_flight": ("gauge", frozenset({"frontend"})),
    "mcp_gateway_rejections_total": ("counter", frozenset({"reason"})),
    "mcp_gateway_backend_up": ("gauge", frozenset({"backend"})),
    "mcp_gateway_backend_era": ("gauge", frozenset({"backend", "era"})),
    "mcp_gateway_backend_restarts_total": ("counter", frozenset({"backend"})),
    "mcp_gateway_backend_children": ("gauge", frozenset({"backend"})),
    "mcp_gateway_fanout_failures_total": ("counter", frozenset({"backend"})),
    "mcp_gateway_catalog_refreshes_total": ("counter", frozenset({"backend"})),
    "mcp_gateway_lists_from_catalog_total": ("counter", frozenset({"backend"})),
    # The context budget (core/budget.py): each server's lists and their estimated tokens.
    "mcp_gateway_catalog_items": ("gauge", frozenset({"server", "kind"})),
    "mcp_gateway_catalog_tokens": ("gauge", frozenset({"server", "kind"})),
    "mcp_gateway_listen_streams": ("gauge", frozenset()),
    "mcp_gateway_bytes_total": ("counter", frozenset({"hop", "direction"})),
    "mcp_gateway_auth_failures_total": ("counter", frozenset({"reason"})),
    "mcp_gateway_policy_denials_total": ("counter", frozenset({"reason"})),
    "mcp_gateway_rate_limited_total": ("counter", frozenset({"limit"})),
    "mcp_gateway_overloaded_total": ("counter", frozenset({"scope", "backend"})),
    "mcp_gateway_overload_queued": ("gauge", frozenset({"scope", "backend"})),
    "mcp_gateway_redis_up": ("gauge", frozenset()),
    "mcp_gateway_rate_limit_fallbacks_total": ("counter", frozenset()),
    "mcp_gateway_redis_pubsub_up": ("gauge", frozenset()),
    "mcp_gateway_cluster_messages_total": ("counter", frozenset({"topic", "outcome"})),
    "mcp_gateway_redis_sessions_up": ("gauge", frozenset()),
    "mcp_gateway_reloads_total": ("counter", frozenset({"outcome"})),
    "mcp_gateway_reloaded_backends_total": ("counter", frozenset({"change"})),
    "mcp_gateway_backend_token_requests_total": (
        "counter",
        frozenset({"backend", "grant", "outcome"}),
    ),
    # The process, its event loop, and its backends' resources (read when scraped).
    "mcp_gateway_event_loop_lag_seconds": ("histogram", frozenset()),
    "mcp_gateway_backend_child_cpu_seconds_total": ("counter", frozenset({"backend"})),
    "mcp_gateway_backend_child_resident_memory_bytes": ("gauge", frozenset({"backend"})),
    "mcp_gateway_backend_requests_in_flight": ("gauge", frozenset({"backend"})),
    "mcp_gateway_backend_replica_requests_in_flight": (
        "gauge",
        frozenset({"backend", "replica"}),
    ),
    "mcp_gateway_backend_replica_failures_total": ("counter", frozenset({"backend", "replica"})),
    "mcp_gateway_backend_pool_connections": ("gauge", frozenset({"backend", "state"})),
    "mcp_gateway_backend_breaker_state": ("gauge", frozenset({"backend", "state"})),
    "mcp_gateway_backend_breaker_opens_total": ("counter", frozenset({"backend"})),
    # prometheus_client's process (from /proc: Linux), platform and GC collectors
    "process_cpu_seconds_total": ("counter", frozenset()),
    "process_resident_memory_bytes": ("gauge", frozenset()),
    "process_open_fds": ("gauge", frozenset()),
    "process_max_fds": ("gauge", frozenset()),
    "process_start_time_seconds": ("gauge", frozenset()),
    "python_gc_collections_total": ("counter", frozenset({"generation"})),
    "python_info": (
        "gauge",
        frozenset({"implementation", "major", "minor", "patchlevel", "version"}),
    ),
}
DATASOURCE = {"type": "prometheus", "uid": "prometheus"}
SERVICES = {
    "gateway": (None, {"8080:8080", "9464:9464"}),
    "otel-collector": ("otel/opentelemetry-collector-contrib", set()),
    "prometheus": ("prom/prometheus", {"9090:9090"}),
    "grafana": ("grafana/grafana", {"3000:3000"}),
    "jaeger": ("jaegertracing/all-in-one", {"16686:16686"}),
}

# --- PromQL: metric names out of an expression ------------------------------------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
# Label lists after these keywords are label names, not metrics: `sum by (le, backend) (...)`.
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
# An identifier followed by a selector, a range or a closing parenthesis is a metric name;
# one followed by `(` is a function. Not part of a number (`5m`), a variable (`$__range`).
_METRIC = re.compile(r"(?<![\w:.$])([A-Za-z_:][\w:]*)\s*(?=[{\[)])")
_SERIES_SUFFIX = re.compile(r"_(?:bucket|sum|count)$")
_LABEL_VALUES = re.compile(r"label_values\(\s*([A-Za-z_:][\w:]*)")


def metric_names(expr: str) -> set[str]:
    """The metrics a PromQL expression reads, histogram series folded into their family."""
    bare = _LABEL_LIST.sub(" ", _STRING.sub('""', expr))
    return {_SERIES_SUFFIX.sub("", name) for name in _METRIC.findall(bare)}


def load_dashboard() -> dict[str, Any]:
    value = orjson.loads(DASHBOARD.read_bytes())
    assert isinstance(value, dict)
    return value


def all_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # panels inside collapsed rows


def panel_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) for every query target of every panel."""
    return [
        (panel["title"], target["expr"])
        for panel in all_panels(dashboard)
        for target in panel.get("targets", [])
    ]


def variable_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var["query"]
            out.append((var["name"], query if isinstance(query, str) else query["query"]))
    return out


def family(sample_name: str) -> str:
    """An exposition name (`x_bucket`, `x_created`, `x_total`, `x`) as EXPORTED_METRICS names it."""
    name = re.sub(r"_(?:bucket|sum|count|created)$", "", sample_name)
    if name not in EXPORTED_METRICS and f"{name}_total" in EXPORTED_METRICS:
        return f"{name}_total"
    return name


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


# --- the dashboard ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        (
            'histogram_quantile(0.99, sum by (le, backend) (rate(m_seconds_bucket{a="x)"}[5m])))',
            {"m_seconds"},
        ),
        ("sum(rate(a_total[$__rate_interval])) / sum(b) by (job)", {"a_total", "b"}),
        ("max by (backend) (up_gauge) or on() vector(0)", {"up_gauge"}),
        ("increase(r_total[$__range] offset 5m)", {"r_total"}),
    ],
)
def test_metric_names_are_extracted_from_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_dashboard_queries_only_exported_metrics() -> None:
    dashboard = load_dashboard()
    queries = panel_queries(dashboard)
    assert len(queries) >= 20
    for title, expr in queries:
        names = metric_names(expr)
        assert names, f"{title}: no metric found in {expr!r}"
        unknown = names - EXPORTED_METRICS.keys()
        assert not unknown, f"{title}: {sorted(unknown)} not exported (in {expr!r})"
    for name, query in variable_queries(dashboard):
        m = _LABEL_VALUES.match(query)
        assert m, f"variable {name}: unexpected query {query!r}"
        assert _SERIES_SUFFIX.sub("", m.group(1)) in EXPORTED_METRICS, (name, query)


def test_dashboard_shows_every_exported_metric() -> None:
    shown = set().union(*(metric_names(expr) for _, expr in panel_queries(load_dashboard())))
    assert shown == EXPORTED_METRICS.keys()


def test_dashboard_labels_exist_on_the_metrics_queried() -> None:
    """`by (...)` and `{...}` only name labels the queried metrics carry (plus `le`)."""
    for title, expr in panel_queries(load_dashboard()):
        labels = set().union(*(EXPORTED_METRICS[n][1] for n in metric_names(expr))) | {"le"}
        bare = _STRING.sub('""', expr)
        used = {
            label.strip()
            for group in re.findall(r"\b(?:by|without)\s*\(([^()]*)\)", bare)
            for label in group.split(",")
            if label.strip()
        }
        used |= set(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)\s*\"", bare))
        assert used <= labels, f"{title}: unknown labels {sorted(used - labels)} in {expr!r}"


def test_latency_panels_show_exemplars() -> None:
    """The duration histograms carry exemplars (a sampled request's trace id): the latency
    panels ask for them, so each dot links to its trace (test_grafana_provisioning)."""
    panels = [
        p
        for p in all_panels(load_dashboard())
        if p["type"] != "row" and "latency" in p["title"].lower()
    ]
    assert len(panels) >= 4
    for panel in panels:
        for target in panel["targets"]:
            assert target.get("exemplar") is True, (panel["title"], target["expr"])
            assert "operation_duration_seconds_bucket" in target["expr"]


def test_histogram_quantiles_aggregate_buckets_by_le() -> None:
    for title, expr in panel_queries(load_dashboard()):
        for inner in re.findall(r"histogram_quantile\(\s*[\d.]+\s*,(.*?)\[", expr):
            assert re.search(r"\bby\s*\(\s*le\b", inner), (title, expr)
            assert "_bucket" in inner and "rate(" in inner, (title, expr)


def test_dashboard_has_the_operator_views() -> None:
    exprs = [expr for _, expr in panel_queries(load_dashboard())]

    def some(*parts: str) -> bool:
        return any(all(p in e for p in parts) for e in exprs)

    server = "mcp_server_operation_duration_seconds"
    client = "mcp_client_operation_duration_seconds"
    assert some("by (mcp_method_name)", f"rate({server}_count")  # traffic by method
    # errors by type, not counting requests whose client went away
    assert some("error_type", 'error_type!~"|cancelled"')
    assert some("by (reason)", "mcp_gateway_rejections_total")
    for by in ("mcp_method_name", "target", "backend"):  # latency per method, tool, backend
        for q in ("0.5", "0.9", "0.99"):
            assert some(f"histogram_quantile({q}, sum by (le, {by})"), (by, q)
    # gateway overhead: server time minus (or over) client time in one expression
    assert some(server, client, " - ") and some(f"{client}_sum", " / ", f"{server}_sum")
    assert some("mcp_gateway_backend_up") and some("mcp_gateway_backend_restarts_total")
    assert some("by (hop, direction)", "mcp_gateway_bytes_total")
    # who was turned away: authentication, policy, rate limits, overload
    assert some("by (reason)", "mcp_gateway_auth_failures_total")
    assert some("by (reason)", "mcp_gateway_policy_denials_total")
    assert some("by (limit)", "mcp_gateway_rate_limited_total")
    assert some("by (scope, backend)", "mcp_gateway_overloaded_total")


def test_dashboard_uses_the_provisioned_datasource() -> None:
    raw = DASHBOARD.read_text(encoding="utf-8")
    assert "DS_PROMETHEUS" not in raw and "__inputs" not in raw
    dashboard = load_dashboard()
    assert dashboard["uid"] == "mcp-gateway" and dashboard["title"]
    ids = [p["id"] for p in all_panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in all_panels(dashboard):
        assert {"h", "w", "x", "y"} <= panel["gridPos"].keys(), panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
    for var in dashboard["templating"]["list"]:
        assert var["datasource"] == DATASOURCE, var["name"]
    assert load_yaml(DATASOURCES)["datasources"][0]["uid"] == DATASOURCE["uid"]


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        missing("promtool", "Debian: apt-get install prometheus; .ci/run does")
    return path


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=START_BOUND, check=False)


def test_dashboard_promql_parses(tmp_path: Path) -> None:
    """promtool parses each panel query, Grafana's variables replaced by plain values."""
    promtool = _promtool()
    grafana_values = {"__rate_interval": "1m", "__interval": "1m", "__range": "1h"}

    def plain(expr: str) -> str:
        return re.sub(r"\$\{?(\w+)\}?", lambda m: grafana_values.get(m.group(1), ".*"), expr)

    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query_{i}", "expr": plain(expr)}
                    for i, (_, expr) in enumerate(panel_queries(load_dashboard()))
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump(rules), encoding="utf-8")
    done = _run([promtool, "check", "rules", str(path)])
    assert done.returncode == 0, done.stdout + done.stderr


# --- Prometheus, Grafana provisioning, collector ----------------------------------------------


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_yaml_assets_parse(path: Path) -> None:
    assert isinstance(load_yaml(path), dict)


def test_promtool_checks_the_prometheus_config() -> None:
    done = _run([_promtool(), "check", "config", str(PROMETHEUS)])
    assert done.returncode == 0, done.stdout + done.stderr


def test_prometheus_scrapes_the_gateway_admin_listener_every_5s() -> None:
    config = load_yaml(PROMETHEUS)
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "mcp-gateway")
    assert job.get("scrape_interval", config["global"]["scrape_interval"]) == "5s"
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = [t for group in job["static_configs"] for t in group["targets"]]
    assert targets == ["gateway:9464"]
    admin = load_yaml(COMPOSE_GATEWAY)["listen"]["admin"]
    assert admin["port"] == 9464 and admin["host"] == "0.0.0.0"


def test_grafana_provisioning() -> None:
    source, traces = load_yaml(DATASOURCES)["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    # An exemplar's trace_id opens its trace in Jaeger (the compose stack's jaeger service).
    assert traces["type"] == "jaeger" and traces["url"] == "http://jaeger:16686"
    (link,) = source["jsonData"]["exemplarTraceIdDestinations"]
    assert link == {"name": "trace_id", "datasourceUid": traces["uid"]}
    (provider,) = load_yaml(DASHBOARD_PROVIDERS)["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"


def test_otel_collector_sends_traces_to_jaeger_and_debug() -> None:
    config = load_yaml(COLLECTOR)
    assert config["receivers"]["otlp"]["protocols"]["http"]["endpoint"] == "0.0.0.0:4318"
    exporters = config["exporters"]
    otlp = [name for name in exporters if name.split("/")[0] in ("otlp", "otlp_grpc")]
    assert len(otlp) == 1
    assert exporters[otlp[0]]["endpoint"] == "jaeger:4317"
    assert exporters[otlp[0]]["tls"]["insecure"] is True
    assert "debug" in exporters
    traces = config["service"]["pipelines"]["traces"]
    assert traces["receivers"] == ["otlp"]
    assert set(traces["exporters"]) == {otlp[0], "debug"}
    for processor in traces.get("processors", []):
        assert processor in config["processors"]


# --- Dockerfile and compose ---------------------------------------------------------------------


def test_dockerfile_installs_the_project_and_runs_mcp_gateway() -> None:
    """The rest of the image (pins, user, health check) is tests/system/test_docker.py's."""
    lines = [
        line.strip()
        for line in DOCKERFILE.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert any(line.startswith("RUN pip install .") for line in lines)
    assert 'ENTRYPOINT ["tini", "--", "mcp-transparent-gateway"]' in lines
    for line in lines:  # everything copied from the build context exists in the repository
        if line.startswith("COPY ") and "--from=" not in line:
            for source in line.split()[1:-1]:
                if not source.startswith("--"):
                    assert (ROOT / source).exists(), line


def _environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        return dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def test_compose_services_images_and_ports() -> None:
    compose = load_yaml(COMPOSE)
    services = compose["services"]
    assert services.keys() == SERVICES.keys()
    for name, (image, ports) in SERVICES.items():
        service = services[name]
        if image is not None:
            assert service["image"].split(":")[0] == image, name
        # container side only: which host address they bind is tests/system/test_docker.py's
        assert ports <= {":".join(str(p).split(":")[-2:]) for p in service.get("ports", [])}, name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):  # bind mounts name files of this repository
                assert (ROOT / source).exists(), (name, volume)
            else:
                assert source in compose.get("volumes", {}), (name, volume)

    gateway = services["gateway"]
    assert gateway["build"]["context"] == "." and gateway["build"]["dockerfile"] == "Dockerfile"
    assert gateway["command"] == ["run", "--config", "/etc/mcp-gateway/config.yaml"]
    assert "./deploy/compose-gateway.yaml:/etc/mcp-gateway/config.yaml:ro" in gateway["volumes"]
    env = _environment(gateway)
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4318"
    assert env["OTEL_SERVICE_NAME"] == "mcp-gateway"

    collector = services["otel-collector"]
    assert any(v.startswith("./otel-collector.yaml:") for v in collector["volumes"])
    assert any(
        v.startswith("./prometheus:/etc/prometheus") for v in services["prometheus"]["volumes"]
    )

    grafana = services["grafana"]
    mounts = {v.split(":")[0]: v.split(":")[1] for v in grafana["volumes"]}
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    assert mounts["./grafana/dashboards"] == "/var/lib/grafana/dashboards"
    assert _environment(grafana)["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"  # test_docker.py

    assert _environment(services["jaeger"]).get("COLLECTOR_OTLP_ENABLED", "true") == "true"


def test_compose_gateway_config_matches_the_stack() -> None:
    config = load_yaml(COMPOSE_GATEWAY)
    http = config["listen"]["http"]
    assert (http["host"], http["port"], http["path"]) == ("0.0.0.0", 8080, "/mcp")
    assert set(http["allowed_hosts"]) == {"gateway", "localhost"}
    demo = {"stdio": {"command": "python", "args": ["-m", "gateway.demo.server"]}}
    assert config["backends"] == {"demo": demo, "demo2": demo}
    assert config["telemetry"] == {"service_name": "mcp-gateway"}


def test_compose_gateway_config_is_valid() -> None:
    parse(COMPOSE_GATEWAY.read_text(encoding="utf-8"), str(COMPOSE_GATEWAY))


# --- against a live gateway ---------------------------------------------------------------------


def _http(
    url: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=BOUND) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _tools_call(url: str, name: str, arguments: dict[str, Any], mcp_name: str) -> int:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments, "_meta": META},
    }
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": META["io.modelcontextprotocol/protocolVersion"],
        "Mcp-Method": "tools/call",
        "Mcp-Name": mcp_name,
    }
    status, _ = _http(url, orjson.dumps(body), headers)
    return status


@pytest.mark.slow
def test_live_metrics_match_the_dashboard(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "listen": {"http": {"host": "127.0.0.1", "port": 0, "path": "/mcp"}},
                "backends": {"demo": DEMO_BACKEND},
            }
        ),
        encoding="utf-8",
    )
    proc = Proc(gateway_command(config))
    try:
        url = proc.wait_for(r"listening on (http://\S+)").group(1)
        assert _tools_call(url, "echo", {"text": "hi"}, "echo") == 200
        _tools_call(url, "echo", {"text": "hi"}, "add")  # a header_mismatch rejection
        base = re.match(r"https?://[^/]+", url)
        assert base is not None
        status, raw = _http(base.group(0) + "/metrics")
    finally:
        proc.stop()
    assert status == 200, raw[:500]
    text = raw.decode()

    families = {family(m) for m in re.findall(r"^# TYPE (\S+) \S+", text, re.MULTILINE)}
    exported = {f for f in families if f.startswith("mcp_")}
    assert exported <= EXPORTED_METRICS.keys(), sorted(exported - EXPORTED_METRICS.keys())
    shown = set().union(*(metric_names(expr) for _, expr in panel_queries(load_dashboard())))
    assert shown <= families, sorted(shown - families)

    seen: set[str] = set()
    for name, labels in re.findall(r"^([A-Za-z_:][\w:]*)(?:\{(.*)\})? \S+", text, re.MULTILINE):
        if name.endswith("_created") or family(name) not in EXPORTED_METRICS:
            continue
        seen.add(family(name))
        keys = set(re.findall(r'(\w+)="', labels or "")) - {"le"}
        assert keys == EXPORTED_METRICS[family(name)][1], (name, labels)
    # what one tools/call must have produced
    assert {
        "mcp_server_operation_duration_seconds",
        "mcp_client_operation_duration_seconds",
        "mcp_gateway_backend_up",
        "mcp_gateway_bytes_total",
        # read when scraped: the process, its loop, the demo's child (Linux: /proc)
        "mcp_gateway_event_loop_lag_seconds",
        "mcp_gateway_backend_requests_in_flight",
        "mcp_gateway_backend_child_cpu_seconds_total",
        "mcp_gateway_backend_child_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "python_gc_collections_total",
        "python_info",
    } <= seen
