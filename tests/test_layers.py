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
    """Wiring flows one way: the command line (the package `gateway/cli/`) starts the gateway,
    and nothing the gateway is built from knows how it is put together."""
    if name != "gateway.cli" and not name.startswith("gateway.cli."):
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
    # (and the collector, a leaf: a legacy session's end asks for a full collection)
    assert ours(ORIGIN) <= {"gateway.caller_auth.identity", "gateway.collector"}
    assert ours("gateway.collector") == set()


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


def test_the_http_front_end_enters_the_legacy_wing_at_its_session_endpoint() -> None:
    """The modern endpoint hands a legacy request to the wing's session endpoint with one call
    and names the record store it is given; sessions, their stores and the legacy front are
    the session endpoint's business."""
    http = "gateway.frontends.http"
    wing = {i for i in ours(http) if i.startswith("gateway.frontends.legacy")}
    assert wing <= {"gateway.frontends.legacy.endpoint", "gateway.frontends.legacy.records"}


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


# Heavy optional features are imported where they are wired, so a config that does not use one
# never loads it (docs/decisions/0064-lazy-imports.md): the one function that makes each, on a
# set-up path, never per request. Exact: (module, function) -> what it imports.
LAZY_IMPORTS: dict[tuple[str, str], set[str]] = {
    # cluster.redis: the Redis adapters, with redis-py and cryptography under them.
    ("gateway.app.cluster", "shared_buckets"): {"gateway.cluster.buckets"},
    ("gateway.app.cluster", "cluster_bus"): {"gateway.cluster.bus"},
    ("gateway.app.cluster", "session_records"): {"gateway.cluster.sessions"},
    ("gateway.app.cluster", "shared_logins"): {"gateway.cluster.logins"},
    ("gateway.app.cluster", "shared_pins"): {"gateway.cluster.pins"},
    ("gateway.app.cluster", "share_pins"): {"gateway.cluster.bus"},
    # auth: the callers' token checks, with PyJWT (and cryptography) under them.
    ("gateway.app.wiring", "make_authenticator"): {"gateway.caller_auth.authenticator"},
    # Tracing (an OTLP endpoint): the OpenTelemetry SDK and the span exporter built on it.
    ("gateway.app.observe", "tracer_provider"): {
        "opentelemetry.sdk.resources",
        "opentelemetry.sdk.trace",
        "gateway.telemetry.otlp",
    },
    # private_key_jwt: PyJWT signs the client assertion, once per token request.
    ("gateway.backend_auth.grants", "assertion"): {"jwt"},
    # The metrics' Prometheus side (prometheus_client): an admin listener, or a caller asking.
    ("gateway.app.gateway", "exposition"): {"gateway.telemetry.metrics"},
    # Tracing: the OpenTelemetry API's spans, for a telemetry with a tracer; `check-config
    # --catalogs` turns tracing off with the API's no-op provider.
    ("gateway.telemetry.otel", "__init__"): {"gateway.telemetry.spans"},
    ("gateway.app.inventory", "inventory"): {"opentelemetry"},
    ("gateway.app.inventory", "definitions"): {"opentelemetry"},
    # A backend's `auth:`: the OAuth client (its authorizer; per-user logins' desk).
    ("gateway.backend_auth.setup", "authorizer"): {
        "gateway.backend_auth.authorizer",
        "gateway.backend_auth.fetch",
        "gateway.backend_auth.store",
    },
    # `connect` answered 401 at start: whether a login can begin (the OAuth client's discovery).
    ("gateway.cli.startup", "login_problem"): {
        "gateway.backend_auth.discovery",
        "gateway.backend_auth.fetch",
    },
    # tool_search: the index and its meta-tools, for a server that searches.
    ("gateway.core.dispatcher", "_search_with"): {"gateway.core.toolsearch"},
    # hooks: the runner and its loader, for a backend with hooks; each built-in by its hooks.
    ("gateway.app.wiring", "hooked"): {"gateway.hooks.load", "gateway.hooks.runner"},
    ("gateway.app.wiring", "check_hooks"): {"gateway.hooks.load"},
    # pins: a description's unified diff, for `pins diff` and a change's log line.
    ("gateway.core.pins", "explain"): {"difflib"},
    ("gateway.hooks.load", "load"): {"gateway.hooks.redact", "gateway.hooks.limit"},
    ("gateway.app.wiring", "login_desk"): {
        "gateway.backend_auth.caller_check",
        "gateway.backend_auth.desk",
        "gateway.backend_auth.fetch",
    },
}


def function_imports(name: str) -> dict[tuple[str, str], set[str]]:
    found: dict[tuple[str, str], set[str]] = {}
    for node in ast.walk(MODULES[name]):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for n in ast.walk(node):
                if isinstance(n, ast.Import):
                    found.setdefault((name, node.name), set()).update(a.name for a in n.names)
                elif isinstance(n, ast.ImportFrom) and n.module:
                    found.setdefault((name, node.name), set()).add(n.module)
    return found


@pytest.mark.parametrize("name", list(MODULES))
def test_no_imports_inside_functions_but_the_lazy_ones(name: str) -> None:
    listed = {k: v for k, v in LAZY_IMPORTS.items() if k[0] == name}
    assert function_imports(name) == listed


# The modules that speak HTTP: everything else sees requests and replies as MCP messages.
HTTP_MODULES = {
    "gateway.frontends.http",
    "gateway.frontends.replies",
    "gateway.frontends.legacy.endpoint",
    "gateway.frontends.listener",
    "gateway.frontends.ops",
    "gateway.backends.http",
    "gateway.backends.http_exchange",
    "gateway.backends.era.http_session",
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


# The era-neutral backend modules that still reach into the wing, and for what: the channels
# answer a legacy server's own questions; per-client children each get an era layer. Shrink it.
# (HTTP's legacy session is the wing's own, era/http_session.py: the backend sees it only as the
# `Session` the era layer hands it, http_exchange.py.)
ERA_TIES = {
    "gateway.backends.channel": {f"{ERA}.questions"},
    "gateway.backends.isolated": {f"{ERA}.layer"},
}


@pytest.mark.parametrize("name", [m for m in in_layer("backends") if not m.startswith(ERA)])
def test_the_other_backend_modules_reach_into_the_era_wing_only_where_listed(name: str) -> None:
    assert era_modules(name) <= ERA_TIES.get(name, set())


# --- one concurrency idiom per layer (ARCHITECTURE.md, rule 11) ------------------------------


def asyncio_names(name: str) -> set[str]:
    """What of asyncio a module uses: its `asyncio.X` attributes and `from asyncio import X`."""
    found: set[str] = set()
    for node in ast.walk(MODULES[name]):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "asyncio"
        ):
            found.add(node.attr)
        elif isinstance(node, ast.ImportFrom) and node.module == "asyncio":
            found.update(a.name for a in node.names)
    return found


def uses_asyncio(name: str) -> bool:
    return any(i == "asyncio" or i.startswith("asyncio.") for i in imports(MODULES[name]))


PURE = in_layer("protocol") + in_layer("routing") + in_layer("config") + ["gateway.errors"]


@pytest.mark.parametrize("name", PURE)
def test_the_pure_layers_never_wait(name: str) -> None:
    assert not any(i.split(".")[0] in ("asyncio", "anyio") for i in imports(MODULES[name]))


# The layers that speak anyio alone (task groups, cancel scopes and deadlines, anyio's Event and
# Lock, memory streams, threads): the engine, the composition root, the cluster's adapters (redis-py
# is imported as `redis.asyncio`, its objects awaited like any), telemetry and the package's own
# top-level modules. The transports and the two auth clients use the loop's objects too.
TOP_LEVEL = ["gateway"] + [
    f"gateway.{p.stem}" for p in PACKAGE.glob("*.py") if p.stem != "__init__"
]
ANYIO_ONLY = TOP_LEVEL + [
    m for layer in ("core", "app", "cluster", "telemetry", "demo", "hooks") for m in in_layer(layer)
]

# Who among them imports asyncio, and why anyio will not do there. Shrink it.
ASYNCIO_USERS = {
    # A loop future and a loop timer per queued request: the per-request bound is the hot path,
    # and anyio has no future (docs/decisions/0034-overload-protection.md).
    "gateway.core.overload",
    # The signal watcher is a plain task that outlives the gateway's task group, and is joined
    # with gather (docs/decisions/0054-signals-and-stdio-replies.md).
    "gateway.app.process",
    # The SDK calls the exporter from its own threads: it keeps the loop to hand work to it
    # (run_coroutine_threadsafe), and its Event and Lock are made on that loop.
    "gateway.telemetry.otlp",
    # `ClientSession.ended` is the legacy session's asyncio.Event (frontends/legacy/front.py).
    "gateway.origin",
    # The coarse timer wheel is one loop timer (call_later) per tick, for every lane.
    "gateway.timers",
    # One loop timer per pending full collection, armed from a synchronous `close`.
    "gateway.collector",
}


@pytest.mark.parametrize("name", ANYIO_ONLY)
def test_the_anyio_layers_import_asyncio_only_where_listed(name: str) -> None:
    assert uses_asyncio(name) == (name in ASYNCIO_USERS)


# What anyio has, asyncio is not used for, in any layer: structure (task groups, deadlines),
# sleeping, threads. asyncio's own (futures, plain tasks, loop timers, `shield` of a shared
# task, protocols and streams) stays where anyio has no word for it.
STRUCTURE = {
    "TaskGroup",
    "gather",
    "wait",
    "wait_for",
    "timeout",
    "timeout_at",
    "sleep",
    "to_thread",
    "run",
    "Semaphore",
    "BoundedSemaphore",
    "Condition",
    "Barrier",
}

# Where asyncio's structure remains, and why. Exact: a module that stops using a name leaves the
# list with it. Modules marked (*) are being restructured elsewhere in issue 32.
ASYNCIO_STRUCTURE = {
    # gather joins plain tasks it spawned (a task group's child could not outlive the request);
    # `_cut` answers after `uncancel()`, an edge-triggered cancellation a cancel scope would repeat.
    "gateway.frontends.stdio": {"gather", "timeout"},
    # Per request on the hot path (the body's deadline: one loop timer, a cancel scope costs
    # more); `close` races aiohttp's own shutdown future against a second signal.
    "gateway.frontends.listener": {"timeout", "wait", "wait_for"},
    # The GET stream's keep-alive wait (a queue read bounded by the interval) and an SSE reply's
    # keep-alive tick, both per stream and cheap as one loop timer.
    "gateway.frontends.legacy.endpoint": {"wait_for"},
    "gateway.frontends.replies": {"sleep"},
    # (*) A renewal joined with shield under a bound: the login goes on for the next request.
    "gateway.backend_auth.authorizer": {"wait_for"},
    # (*) A resumed stream raced against its reply arriving elsewhere.
    "gateway.backends.era.http_session": {"wait"},
    # The connect and ready deadlines span aiohttp and the token loop, whose clean-up awaits a
    # level-triggered cancel scope would cancel again.
    "gateway.backends.sse": {"timeout"},
    # A failure of one of the three lists is the caller's error as itself, not a group.
    "gateway.backends.era.discovery": {"gather"},
    # The handshake's deadline spans a transport's clean-up (as sse); gather joins plain tasks.
    "gateway.backends.era.dual": {"timeout", "gather"},
    "gateway.app.process": {"gather"},
}


@pytest.mark.parametrize("name", list(MODULES))
def test_structure_is_anyio_except_where_listed(name: str) -> None:
    assert asyncio_names(name) & STRUCTURE == ASYNCIO_STRUCTURE.get(name, set())
