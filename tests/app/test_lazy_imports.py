"""What a config does not use is not imported (issue 34; docs/decisions/0064-lazy-imports.md):
a plain gateway (an HTTP listener, one backend, no `telemetry:`, `auth:`, `cluster:` or admin
listener, no backend with `auth:`) loads neither Redis nor PyJWT, cryptography, the OpenTelemetry
SDK, the span exporter or the API's spans, prometheus_client or the OAuth client of the backends,
and a config that uses one of them loads it, so the laziness never costs a feature.

Each case is a fresh interpreter (`python -c`): what `python -m gateway` imports (the command
line), then the gateway built from the config, and entered (listener bound, backends started)
where nothing it needs is missing; its `sys.modules` is the answer.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import orjson
import pytest
import yaml

from tests.support import BOUND, ROOT

# A module of each optional feature, and what stands for its heavy dependencies.
CLUSTER = {"redis", "gateway.cluster", "cryptography"}
CALLER_AUTH = {"jwt", "gateway.caller_auth.authenticator"}
TRACING = {"opentelemetry.sdk", "gateway.telemetry.otlp", "gateway.telemetry.spans"}
# The OpenTelemetry API's spans (only `opentelemetry.util`, for the OTLP settings, is loaded
# without tracing).
OTEL_API = {"opentelemetry.trace", "opentelemetry.propagate", "opentelemetry.context"}
METRICS = {"prometheus_client", "gateway.telemetry.metrics"}
OAUTH_CLIENT = {"gateway.backend_auth.authorizer", "gateway.backend_auth.desk"}
TOOL_SEARCH = {"gateway.core.toolsearch", "gateway.routing.search"}
# The stdlib's exact decimals: the numbers scan compares decimal texts itself.
DECIMAL = {"decimal", "_decimal", "_pydecimal"}
# hooks: the runner and its loader, the built-ins (the redaction table, gateway/sensitive.py,
# is the tap's too: small, its patterns compiled only when used).
HOOKS = {"gateway.hooks"}
HEAVY = (
    CLUSTER | CALLER_AUTH | TRACING | OTEL_API | METRICS | OAUTH_CLIENT | TOOL_SEARCH | DECIMAL
) | HOOKS

HTTP_LISTENER = {"http": {"host": "127.0.0.1", "port": 0, "path": "/mcp"}}
# Nothing listens on port 9: the backend is marked down, which does not stop the start.
HTTP_BACKEND = {"http": {"url": "http://127.0.0.1:9/mcp"}, "connect_timeout": 0.5}
STDIO_BACKEND = {"stdio": {"command": sys.executable, "args": ["-c", "pass"]}}
SECRET = "lazy-imports-secret-N3q8Vw5Lz2Kp7Rx"
ISSUER = "https://issuer.invalid"

# Run in the child: the modules loaded once the gateway is built (and entered, if asked).
PROBE = """
import sys

import anyio
import orjson

import gateway.cli  # (what `python -m gateway` imports)
from gateway.app import Gateway
from gateway.config import parse

config = parse(sys.stdin.read())


async def build(enter: bool) -> None:
    gateway = Gateway(config)
    if enter:
        async with gateway:
            pass


anyio.run(build, sys.argv[1] == "enter")
sys.stdout.buffer.write(orjson.dumps(sorted(sys.modules)))
"""


def loaded(config: dict[str, Any], enter: bool) -> set[str]:
    # Tracing is the config's alone here: the standard variables would turn it on too.
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "enter" if enter else "build"],
        input=yaml.safe_dump(config).encode(),
        capture_output=True,
        env=env,
        cwd=ROOT,
        timeout=4 * BOUND,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return set(orjson.loads(done.stdout))


def present(modules: set[str], wanted: set[str]) -> set[str]:
    """Those of `wanted` loaded, a package counting when any module of it is."""
    return {w for w in wanted if any(m == w or m.startswith(f"{w}.") for m in modules)}


@pytest.mark.parametrize("backend", [HTTP_BACKEND, STDIO_BACKEND], ids=["http", "stdio"])
def test_a_plain_gateway_loads_no_optional_feature(backend: dict[str, Any]) -> None:
    """Started and stopped, an HTTP listener over one backend loads none of them."""
    modules = loaded({"listen": HTTP_LISTENER, "backends": {"b": backend}}, enter=True)
    assert "gateway.app.gateway" in modules  # (the probe did build a gateway)
    assert present(modules, HEAVY) == set()


def test_cluster_redis_loads_the_redis_adapters() -> None:
    config = {
        "listen": HTTP_LISTENER,
        "backends": {"b": HTTP_BACKEND},
        "cluster": {"redis": "redis://127.0.0.1:9", "secrets": [SECRET]},
        "rate_limits": {"per_identity": {"rate": 10, "burst": 10}},
    }
    modules = loaded(config, enter=False)
    assert present(modules, CLUSTER) == CLUSTER
    for adapter in ("buckets", "bus", "sessions", "logins"):
        assert f"gateway.cluster.{adapter}" in modules
    # (redis-py's own observability imports the SDK's metrics; the span exporter stays out)
    assert present(modules, CALLER_AUTH | {"gateway.telemetry.otlp"}) == set()


def test_auth_loads_the_token_checks() -> None:
    """basic/authorization: a JWT access token is verified with PyJWT."""
    config = {
        "listen": HTTP_LISTENER,
        "backends": {"b": HTTP_BACKEND},
        "auth": {"issuer": ISSUER, "resource": "http://127.0.0.1/mcp"},
    }
    modules = loaded(config, enter=False)
    assert present(modules, CALLER_AUTH) == CALLER_AUTH
    assert present(modules, TRACING | {"redis", "gateway.cluster"}) == set()


def test_an_otlp_endpoint_loads_the_sdk_and_the_exporter() -> None:
    config = {
        "listen": HTTP_LISTENER,
        "backends": {"b": HTTP_BACKEND},
        "telemetry": {"otlp_endpoint": "http://127.0.0.1:9"},
    }
    modules = loaded(config, enter=False)
    assert present(modules, TRACING | OTEL_API) == TRACING | OTEL_API
    assert present(modules, CLUSTER | CALLER_AUTH) == set()


def test_an_admin_listener_loads_the_metrics_exposition() -> None:
    """Its /metrics is served from the start; the counts are the gateway's own either way."""
    listen = {**HTTP_LISTENER, "admin": {"host": "127.0.0.1", "port": 0}}
    modules = loaded({"listen": listen, "backends": {"b": HTTP_BACKEND}}, enter=True)
    assert present(modules, METRICS) == METRICS
    assert present(modules, CLUSTER | CALLER_AUTH | TRACING) == set()


def test_tool_search_loads_its_index() -> None:
    config = {
        "listen": HTTP_LISTENER,
        "backends": {"b": HTTP_BACKEND},
        "tool_search": {"mode": "on"},
    }
    modules = loaded(config, enter=False)
    assert present(modules, TOOL_SEARCH) == TOOL_SEARCH
    assert present(modules, CLUSTER | CALLER_AUTH | TRACING) == set()


def test_a_backend_with_auth_loads_the_oauth_client() -> None:
    """basic/authorization: the gateway is an OAuth client of that backend."""
    backend = {**HTTP_BACKEND, "auth": {"type": "oauth", "client_id": "gateway"}}
    modules = loaded({"listen": HTTP_LISTENER, "backends": {"b": backend}}, enter=False)
    assert present(modules, OAUTH_CLIENT) == OAUTH_CLIENT
    assert present(modules, CLUSTER | CALLER_AUTH | TRACING) == set()


def test_the_command_line_reads_no_system_mime_types() -> None:
    """aiohttp's file responses make a MIME table at import; the gateway serves no files, so
    the system's mime.types (Debian's: 0.5 MB resident) stays unread: a type only it knows is
    unknown, and one Python knows itself is still there."""
    probe = (
        "import mimetypes, gateway.cli, aiohttp.web;"
        "print(mimetypes.guess_type('a.deb')[0], mimetypes.guess_type('a.json')[0])"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, env=env, cwd=ROOT, timeout=4 * BOUND
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.split() == [b"None", b"application/json"]


def test_hooks_load_the_runner_and_only_the_built_ins_they_use() -> None:
    """A backend's `hooks:` loads the runner and `output_limit`, not `redact`."""
    backend = {**HTTP_BACKEND, "hooks": [{"use": "output_limit"}]}
    modules = loaded({"listen": HTTP_LISTENER, "backends": {"b": backend}}, enter=False)
    assert {"gateway.hooks.runner", "gateway.hooks.limit"} <= modules
    assert "gateway.hooks.redact" not in modules
    top = {"listen": HTTP_LISTENER, "backends": {"b": HTTP_BACKEND}, "hooks": [{"use": "redact"}]}
    assert "gateway.hooks.redact" in loaded(top, enter=False)
