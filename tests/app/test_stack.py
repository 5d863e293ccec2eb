"""One backend's stack, as `build_stack` assembles it (gateway/app/wiring.py): the layers in
their order, and a layer left out where it would do nothing for the backend. In memory: no
backend is started (async: the stack's parts are made on the event loop)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gateway.app.wiring import build_stack
from gateway.backends.base import Backend, Layer
from gateway.backends.era.http_session import HttpSession
from gateway.backends.era.layer import EraBackend
from gateway.backends.health import Guarded
from gateway.backends.http import HttpBackend
from gateway.backends.isolated import IsolatedBackend
from gateway.backends.login_gate import LoginGate
from gateway.backends.resilience import Resilient, needed
from gateway.backends.stdio import StdioBackend
from gateway.config import parse
from gateway.config.operations import Overload
from gateway.core.fused import FusedBackend
from gateway.core.instrument import InstrumentedBackend
from gateway.core.overload import BoundedBackend
from gateway.hooks.runner import HookedBackend
from gateway.telemetry.otel import GatewayTelemetry

pytestmark = pytest.mark.anyio

HTTP = {"http": {"url": "http://127.0.0.1:9/mcp"}}
STDIO = {"stdio": {"command": "x"}}


def outer(backend: dict[str, Any], **top: Any) -> Backend:
    text = yaml.safe_dump({"listen": {"stdio": True}, "backends": {"b": backend}, **top})
    (config,) = parse(text).backends
    return build_stack(config, Overload(), GatewayTelemetry(None, None), None, None).outer


def stack(backend: dict[str, Any], **top: Any) -> list[type]:
    """The classes whose steps a request takes, top to bottom, transport last (a fused top,
    core/fused.py, takes those of the chain below it in its own frame: the chain is listed)."""
    layer = outer(backend, **top)
    if isinstance(layer, FusedBackend):
        layer = layer.inner
    found: list[type] = []
    while isinstance(layer, Layer):
        found.append(type(layer))
        layer = layer.inner
    if isinstance(layer, HttpSession):
        # (Not a layer: the era layer's handle on the HTTP transport, whose own methods it
        # hands over, so a request passes no code of it.)
        layer = layer.backend
    return [*found, type(layer)]


FULL = [BoundedBackend, InstrumentedBackend, Resilient, Guarded, EraBackend]


@pytest.mark.parametrize(("target", "transport"), [(HTTP, HttpBackend), (STDIO, StdioBackend)])
async def test_the_default_stack_has_every_layer_that_acts_in_order(
    target: dict[str, Any], transport: type
) -> None:
    """Safe retries are on by default (3 attempts), so the resilience layer is in."""
    assert stack(target) == [*FULL, transport]


async def test_a_backend_with_no_timeouts_retries_or_breaker_has_no_resilience_layer() -> None:
    assert stack({**HTTP, "retries": {"attempts": 1}}) == [
        BoundedBackend,
        InstrumentedBackend,
        Guarded,
        EraBackend,
        HttpBackend,
    ]


@pytest.mark.parametrize(
    "extra",
    [
        {"breaker": True},
        {"tools": {"build": {"timeout": 900}}},
        {"retries": {"attempts": 2}},
    ],
)
async def test_any_resilience_setting_keeps_the_layer(extra: dict[str, Any]) -> None:
    backend = {**HTTP, "retries": {"attempts": 1}, **extra}
    assert Resilient in stack(backend)
    text = yaml.safe_dump({"listen": {"stdio": True}, "backends": {"b": backend}})
    assert needed(parse(text).backends[0])


async def test_a_per_user_backend_has_a_login_gate_above_its_era_layer() -> None:
    backend = {**HTTP, "auth": {"type": "oauth", "per_user": True}}
    auth = {
        "issuer": "https://issuer.example.com",
        "resource": "http://127.0.0.1:8080/mcp",
        "login_client_id": "gateway-login",
    }
    listen = {"http": {"host": "127.0.0.1", "port": 8080, "path": "/mcp"}}
    assert stack(backend, auth=auth, listen=listen) == [
        BoundedBackend,
        InstrumentedBackend,
        Resilient,
        Guarded,
        LoginGate,
        EraBackend,
        HttpBackend,
    ]


async def test_a_backend_with_a_child_per_client_has_its_era_layers_inside_the_transport() -> None:
    assert stack({**STDIO, "isolation": "per_session"}) == [
        BoundedBackend,
        InstrumentedBackend,
        Resilient,
        Guarded,
        IsolatedBackend,
    ]


@pytest.mark.parametrize(
    ("backend", "fused"),
    [
        (HTTP, True),
        (STDIO, True),
        ({**HTTP, "retries": {"attempts": 1}}, True),
        ({**STDIO, "isolation": "per_session"}, True),
        ({**HTTP, "breaker": True}, False),
        ({**HTTP, "tools": {"build": {"timeout": 900}}}, False),
    ],
)
async def test_the_common_top_is_fused_unless_a_tool_timer_or_breaker_acts(
    backend: dict[str, Any], fused: bool
) -> None:
    """Bound, observation, resilience and guard take their steps in one frame where the
    resilience layer's first try is its inner request as it is; a breaker or a tool's own
    timeout keeps the separate layers (their frames are the chain under a fused top too)."""
    top = outer(backend)
    assert isinstance(top, FusedBackend) is fused
    assert isinstance(top.inner if isinstance(top, FusedBackend) else top, BoundedBackend)


def hooked_stack(backend: dict[str, Any], **top: Any) -> list[type]:
    """`stack` with the top-level hooks handed to `build_stack` as the gateway hands them."""
    text = yaml.safe_dump({"listen": {"stdio": True}, "backends": {"b": backend}, **top})
    config = parse(text)
    (backend_config,) = config.backends
    wired = build_stack(
        backend_config, Overload(), GatewayTelemetry(None, None), None, None, config.hooks
    )
    layer: Backend = wired.outer
    found: list[type] = []
    while isinstance(layer, Layer):
        if not isinstance(layer, FusedBackend):  # (its chain is listed: see `stack`)
            found.append(type(layer))
        layer = layer.inner
    return found


async def test_hooks_are_the_outermost_layer_only_of_a_backend_with_hooks() -> None:
    """hooks/runner.py: top-level hooks or the backend's own put the runner above the bound;
    without any, the stack is as it was (no layer, no check per request)."""
    assert hooked_stack(STDIO) == FULL
    own = {**STDIO, "hooks": [{"use": "redact"}]}
    assert hooked_stack(own) == [HookedBackend, *FULL]
    assert hooked_stack(STDIO, hooks=[{"use": "output_limit"}]) == [HookedBackend, *FULL]
