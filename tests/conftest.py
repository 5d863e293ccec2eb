"""Shared fixtures: real backends and gateways, started once per module where they are costly.

The parity matrix: every `target` is a way to reach the same SDK test server, directly or
through the gateway, so each parity test proves the gateway transparent on every pairing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from mcp import StdioServerParameters

from tests import fast
from tests.fast import _guard_fast  # noqa: F401  (autouse: fast tests start nothing)
from tests.support import (
    PYTHON,
    SDK_SERVER,
    Proc,
    gateway_command,
    http_backend,
    sdk_stdio_command,
    start_gateway_http,
    start_sdk_http,
    stdio_backend,
    write_config,
)


@dataclass(frozen=True)
class Target:
    pairing: str
    server: StdioServerParameters | str

    @property
    def through_gateway(self) -> bool:
        return "_to_" in self.pairing

    @property
    def legacy_backend(self) -> bool:
        return "_to_legacy" in self.pairing or self.pairing.endswith("_to_sse")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def sdk_http() -> Iterator[str]:
    proc, url = start_sdk_http()
    yield url
    proc.stop()


@pytest.fixture(scope="session")
def config_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("configs")


def _stdio_params(command: list[str]) -> StdioServerParameters:
    return StdioServerParameters(command=command[0], args=command[1:])


PAIRINGS = [
    "direct_stdio",
    "direct_http",
    "stdio_to_stdio",
    "stdio_to_http",
    "http_to_stdio",
    "http_to_http",
    # The same server made legacy-only (an `initialize` handshake and nothing modern), and on
    # the 2024-11-05 HTTP+SSE transport: the gateway bridges the eras (basic/versioning).
    "stdio_to_legacy_stdio",
    "stdio_to_legacy_http",
    "http_to_legacy_stdio",
    "http_to_legacy_http",
    "http_to_sse",
]


@pytest.fixture(scope="session")
def sdk_legacy_http() -> Iterator[str]:
    proc, url = start_sdk_http("--legacy-only")
    yield url
    proc.stop()


@pytest.fixture(scope="session")
def sdk_sse() -> Iterator[str]:
    proc = Proc([PYTHON, SDK_SERVER, "sse", "--port", "0"])
    port = proc.wait_for(r"READY (\d+)", stream="stdout").group(1)
    yield f"http://127.0.0.1:{port}/sse"
    proc.stop()


def _backend(back: str, request: pytest.FixtureRequest) -> dict[str, object]:
    if back == "stdio":
        return stdio_backend(sdk_stdio_command())
    if back == "legacy_stdio":
        return stdio_backend(sdk_stdio_command("--legacy-only"))
    if back == "http":
        return http_backend(request.getfixturevalue("sdk_http"))
    if back == "legacy_http":
        return http_backend(request.getfixturevalue("sdk_legacy_http"))
    return {"sse": {"url": request.getfixturevalue("sdk_sse")}}


@pytest.fixture(scope="session", params=PAIRINGS)
def target(request: pytest.FixtureRequest, config_dir: Path) -> Iterator[Target]:
    """How a client reaches the SDK test server: directly, or through the gateway."""
    pairing: str = request.param
    if pairing == "direct_stdio":
        yield Target(pairing, _stdio_params(sdk_stdio_command()))
        return
    if pairing == "direct_http":
        yield Target(pairing, request.getfixturevalue("sdk_http"))
        return
    front, _, back = pairing.partition("_to_")
    backend = _backend(back, request)
    config = write_config(
        config_dir, {"sdk": backend}, http=front == "http", stdio=front == "stdio"
    )
    if front == "stdio":
        yield Target(pairing, _stdio_params(gateway_command(config)))
        return
    proc, url = start_gateway_http(config)
    yield Target(pairing, url)
    proc.stop()


# Every test has pyproject's `timeout` (10 s); a `slow` one, and all of tests/system/ (whole
# gateways, clusters, builds), this much: a bound that still ends a hung test within a minute.
SLOW_TIMEOUT = 60.0
SYSTEM = Path(__file__).resolve().parent / "system"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks `fast` the tests that start no process and no server (`make test-fast`); marks
    `slow` the tests of tests/system/ and gives every `slow` test SLOW_TIMEOUT, unless it names
    its own timeout."""
    fast.mark(items)
    for item in items:
        if item.path.is_relative_to(SYSTEM):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT))
