"""The dependency rules of ARCHITECTURE.md, checked on the source so a violation fails CI."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gateway"


def modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = ast.parse(path.read_text(), str(path))
    return out


MODULES = modules()


def imports(tree: ast.Module) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def ours(name: str) -> set[str]:
    return {i for i in imports(MODULES[name]) if i == "gateway" or i.startswith("gateway.")}


def in_the_composition_root(name: str) -> bool:
    """The composition root is the package `gateway/app/`: every module of it is treated alike."""
    return name == "gateway.app" or name.startswith("gateway.app.")


def in_layer(layer: str) -> list[str]:
    return [m for m in MODULES if m == f"gateway.{layer}" or m.startswith(f"gateway.{layer}.")]


@pytest.mark.parametrize("name", [m for m in MODULES if not in_the_composition_root(m)])
def test_only_the_cli_imports_the_composition_root(name: str) -> None:
    """Wiring flows one way: the command line starts the gateway, and nothing the gateway is
    built from knows how it is put together."""
    if name != "gateway.cli":
        assert not any(in_the_composition_root(i) for i in ours(name))
        assert not any(
            a.name == "app"
            for node in ast.walk(MODULES[name])
            if isinstance(node, ast.ImportFrom) and node.module == "gateway"
            for a in node.names
        )


@pytest.mark.parametrize("name", in_layer("protocol"))
def test_protocol_imports_only_itself(name: str) -> None:
    assert all(i.startswith("gateway.protocol") for i in ours(name))


@pytest.mark.parametrize("name", in_layer("routing"))
def test_routing_imports_only_protocol(name: str) -> None:
    assert all(i.startswith(("gateway.protocol", "gateway.routing")) for i in ours(name))


@pytest.mark.parametrize("name", in_layer("config"))
def test_config_is_a_leaf(name: str) -> None:
    assert all(i.startswith("gateway.config") for i in ours(name))


# The one capped read of a reply's body, shared by the HTTP clients of both directions (the
# backends, the authorization server's client, the OAuth client): none of them may import
# another, so it stands alone at the top of the package and imports nothing of it.
CAPPED = "gateway.capped"


def test_the_capped_read_imports_nothing_of_the_package() -> None:
    assert not ours(CAPPED)


# Where a client request came from (`Origin` and its kin): made by the front ends, read by every
# layer below them and by the telemetry, so it stands alone and sees only who is calling.
ORIGIN = "gateway.origin"


def test_the_origin_sees_only_the_callers_identity() -> None:
    assert ours(ORIGIN) <= {"gateway.caller_auth.identity"}


# Request state travels as arguments (the seam's `Call`, backends/base.py), never in a context
# variable that every task inherits and no signature shows. Modules allowed one, and for what:
CONTEXT_VARIABLES: dict[str, str] = {}


@pytest.mark.parametrize("name", list(MODULES))
def test_no_request_state_in_context_variables(name: str) -> None:
    if name not in CONTEXT_VARIABLES:
        assert "contextvars" not in imports(MODULES[name])


@pytest.mark.parametrize("name", in_layer("caller_auth"))
def test_caller_auth_sees_only_the_config_and_itself(name: str) -> None:
    """Checking a token needs the config and nothing of the data path (which reads only the
    Identity it yields); the front end that asks is the one that answers."""
    assert all(i.startswith(("gateway.caller_auth", "gateway.config", CAPPED)) for i in ours(name))


@pytest.mark.parametrize("name", in_layer("backend_auth"))
def test_the_oauth_client_sees_only_the_config_and_itself(name: str) -> None:
    """Logging in to a backend needs its config and nothing of the data path: the HTTP
    backend asks it for a header and tells it of a refusal."""
    allowed = ("gateway.backend_auth", "gateway.config", CAPPED)
    assert all(i == "gateway" or i.startswith(allowed) for i in ours(name))


@pytest.mark.parametrize("name", in_layer("backends") + in_layer("frontends"))
def test_transports_never_import_each_other_or_routing(name: str) -> None:
    other = "frontends" if ".backends" in name else "backends"
    assert not any(i.startswith((f"gateway.{other}", "gateway.routing")) for i in ours(name))


@pytest.mark.parametrize("name", in_layer("core"))
def test_core_sees_backends_only_through_the_protocol_class(name: str) -> None:
    everything = imports(MODULES[name])
    assert not any(
        i.startswith(("aiohttp", "subprocess", "redis", "gateway.frontends")) for i in everything
    )
    assert all(i == "gateway.backends.base" for i in ours(name) if i.startswith("gateway.backends"))


def test_core_speaks_one_era() -> None:
    """What serves legacy clients (`initialize`, sessions and their records) lives in the
    front ends' legacy wing, so the engine has no module of that era to grow back into."""
    names = {m.rsplit(".", 1)[-1] for m in in_layer("core")}
    assert not names & {"legacy", "sessions"}


@pytest.mark.parametrize("name", in_layer("core"))
def test_core_imports_nothing_of_the_legacy_wing(name: str) -> None:
    assert not any(i.startswith("gateway.frontends.legacy") for i in ours(name))


# Who may import the legacy clients' wing: the front ends that hand a legacy client over to it,
# and the Redis adapter of its session records. Removing legacy clients is deleting the wing and
# these callers' legacy branches.
LEGACY_WING_USERS = {
    "gateway.frontends.http",
    "gateway.frontends.stdio",
    "gateway.cluster.sessions",
}


@pytest.mark.parametrize(
    "name", [m for m in MODULES if not m.startswith("gateway.frontends.legacy")]
)
def test_the_legacy_wing_is_entered_from_the_transports_only(name: str) -> None:
    if name not in LEGACY_WING_USERS:
        assert not any(i.startswith("gateway.frontends.legacy") for i in ours(name))


@pytest.mark.parametrize("name", in_layer("cluster"))
def test_the_cluster_adapters_implement_cores_protocol_and_nothing_more(name: str) -> None:
    """The Redis side of shared state sees the protocols it implements (core's
    `SharedBuckets` and its `Want`, the bus; the legacy wing's session records; the OAuth client's
    `SharedStore` in backend_auth/shared.py) and the stats, and nothing of the data path or of the
    OAuth client's workings: core, the front ends and the OAuth client call it through those
    protocols, the composition root (gateway/app/) wires it."""
    allowed = {
        "gateway.cluster",
        "gateway.core.ratelimit",
        "gateway.core.bus",
        "gateway.frontends.legacy.records",
        "gateway.backend_auth.shared",
        "gateway.telemetry.api",
    }
    assert {m for m in ours(name) if not m.startswith("gateway.cluster.")} <= allowed


@pytest.mark.parametrize("name", [m for m in MODULES if not m.startswith("gateway.cluster")])
def test_only_the_cluster_adapters_use_redis(name: str) -> None:
    """redis-py is the one way to Redis (cluster.redis), and only `gateway/cluster` holds it."""
    assert not any(i == "redis" or i.startswith("redis.") for i in imports(MODULES[name]))


# Besides the composition root, the span exporter: a span processor of the SDK's that reads its
# finished spans (docs/decisions/0050-own-span-exporter.md).
SDK_MODULES = {"gateway.telemetry.otlp", "gateway.telemetry.otlp_wire"}


@pytest.mark.parametrize(
    "name", [m for m in MODULES if m not in SDK_MODULES and not in_the_composition_root(m)]
)
def test_only_the_composition_root_touches_the_telemetry_sdk(name: str) -> None:
    assert not any(i.startswith("opentelemetry.sdk") for i in imports(MODULES[name]))


@pytest.mark.parametrize(
    "name",
    [m for m in MODULES if m != "gateway.telemetry.metrics" and not in_the_composition_root(m)],
)
def test_prometheus_client_stays_in_the_metrics_exporter(name: str) -> None:
    assert not any(i.startswith("prometheus_client") for i in imports(MODULES[name]))


@pytest.mark.parametrize("name", in_layer("core") + in_layer("backends") + in_layer("frontends"))
def test_the_data_path_sees_telemetry_only_through_its_api(name: str) -> None:
    telemetry = {i for i in ours(name) if i.startswith("gateway.telemetry")}
    assert telemetry <= {"gateway.telemetry.api"}
    assert not any(i.startswith("opentelemetry") for i in imports(MODULES[name]))


@pytest.mark.parametrize("name", list(MODULES))
def test_no_imports_inside_functions(name: str) -> None:
    for node in ast.walk(MODULES[name]):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            nested = [n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))]
            assert not nested, f"{name}.{node.name} imports inside a function"


# The modules that speak HTTP: everything else sees requests and replies as MCP messages.
HTTP_MODULES = {
    "gateway.frontends.http",
    "gateway.frontends.listener",
    "gateway.frontends.ops",
    "gateway.backends.http",
    "gateway.backends.sse",
    "gateway.backends.web",
    "gateway.backends.fallback",
    "gateway.frontends.bearer",
    "gateway.caller_auth.fetch",
    "gateway.backend_auth.fetch",
    "gateway.capped",
    "gateway.backend_auth.redirect",
    "gateway.frontends.logins",
    "gateway.telemetry.otlp",
}


@pytest.mark.parametrize("name", list(MODULES))
def test_only_the_http_modules_use_aiohttp(name: str) -> None:
    """aiohttp is the gateway's HTTP in both directions, and only the transports that speak HTTP
    (and the composition root) touch it."""
    if name not in HTTP_MODULES and not in_the_composition_root(name):
        assert not any(i.startswith("aiohttp") for i in imports(MODULES[name]))


@pytest.mark.parametrize("name", list(MODULES))
def test_nothing_frames_http_by_hand(name: str) -> None:
    """No HTTP parser or framing of our own: no httptools, no hand-built status lines. The one
    exception is the fixed `100 Continue` interim response, which aiohttp's low-level server
    leaves to its handler (its router writes the same constant)."""
    assert not any(
        i.startswith(("httptools", "h11", "http.client")) for i in imports(MODULES[name])
    )
    framed = [
        node.value
        for node in ast.walk(MODULES[name])
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str | bytes)
        and node.value[:7] in ("HTTP/1.", b"HTTP/1.")
    ]
    allowed = [b"HTTP/1.1 100 Continue\r\n\r\n"] if name == "gateway.frontends.listener" else []
    assert framed == allowed


# --- the legacy servers' wing ---------------------------------------------------------------

ERA = "gateway.backends.era"


def era_modules(name: str) -> set[str]:
    """The modules of the era wing that `name` imports, however it names them (`from
    gateway.backends.era import probe` imports `gateway.backends.era.probe`)."""
    found: set[str] = set()
    for node in ast.walk(MODULES[name]):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith(ERA))
        elif isinstance(node, ast.ImportFrom) and node.module == ERA:
            found.update(f"{ERA}.{a.name}" for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module == "gateway.backends":
            found.update(ERA for a in node.names if a.name == "era")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(f"{ERA}."):
            found.add(str(node.module))
    return found


@pytest.mark.parametrize("name", in_layer("core"))
def test_core_imports_nothing_of_the_era_wing(name: str) -> None:
    """The engine speaks the modern era only: a legacy server is shown to it as a modern one
    by the era layer, below the Backend seam (basic/versioning, Backward Compatibility)."""
    assert not era_modules(name)


OUTSIDE_THE_BACKENDS = [
    m for m in MODULES if not m.startswith("gateway.backends.") and not in_the_composition_root(m)
]


@pytest.mark.parametrize("name", OUTSIDE_THE_BACKENDS)
def test_only_the_backends_and_the_composition_root_import_the_era_wing(name: str) -> None:
    """Removing legacy servers' support is deleting `backends/era/` and the few lines that
    wire it, not a search through the package."""
    assert not era_modules(name)


# The era-neutral backend modules that still reach into the wing, and for what: the transports
# answer a legacy server's own questions, and HTTP keeps a legacy session (SessionLink) whose
# streams it resumes (the HTTP split is to confine that); per-client children each get an era
# layer. Shrink it.
ERA_TIES = {
    "gateway.backends.channel": {f"{ERA}.questions"},
    "gateway.backends.http": {f"{ERA}.questions", f"{ERA}.resume", f"{ERA}.link"},
    "gateway.backends.isolated": {f"{ERA}.layer"},
}


@pytest.mark.parametrize("name", [m for m in in_layer("backends") if not m.startswith(ERA)])
def test_the_other_backend_modules_reach_into_the_era_wing_only_where_listed(name: str) -> None:
    assert era_modules(name) <= ERA_TIES.get(name, set())
