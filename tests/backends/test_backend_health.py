"""Backends that start slowly, exit at once or cannot be reached (transports/stdio and
streamable-http, Backward Compatibility; basic/versioning, Backward Compatibility with
Initialization-Based Versions), over real pipes and sockets.

A slow starter is waited for up to its connect_timeout and served in its era; a child that
exits is reported with its exit code and stderr; a backend that cannot be reached is down at
once (lists skip it, calls to it fail at once with -31001), is retried in the background and
used again when it comes back, with one log line per change of state."""

from __future__ import annotations

import logging
import stat
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import orjson
import pytest
import yaml
from aiohttp import web

from gateway import config as gateway_config
from gateway.app import Gateway
from gateway.backends import health
from gateway.backends.era import discovery
from gateway.protocol import codes
from tests.backends.test_legacy_backends import post, text_of
from tests.servers.nodiscover_server import handler as nodiscover_handler
from tests.support import (
    BOUND,
    PYTHON,
    ROOT,
    START_BOUND,
    Message,
    call,
    dead_url,
    messages,
    mirrored_headers,
    request,
    serve_http,
    stdio_backend,
)

pytestmark = pytest.mark.anyio

STARTING = str(ROOT / "tests" / "servers" / "starting_server.py")
DEMO = [PYTHON, "-m", "gateway.demo.server"]


def starting(*args: str) -> list[str]:
    return [PYTHON, STARTING, *args]


@asynccontextmanager
async def gateway(backends: dict[str, Any], **top: Any) -> AsyncIterator[tuple[Gateway, str]]:
    listen = {"http": {"host": "127.0.0.1", "port": 0}}
    text = yaml.safe_dump({"listen": listen, "backends": backends, **top})
    async with Gateway(gateway_config.parse(text)) as gw:
        assert gw.http_url is not None
        yield gw, gw.http_url


def records_about(caplog: pytest.LogCaptureFixture, backend: str) -> list[logging.LogRecord]:
    """The gateway's log lines about `backend` at INFO or above."""
    return [
        r
        for r in caplog.records
        if r.levelno >= logging.INFO and f"backend {backend}:" in r.getMessage()
    ]


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retries within tens of milliseconds, so that a test sees several of them quickly."""
    monkeypatch.setattr(health, "FIRST_RETRY", 0.02)
    monkeypatch.setattr(health, "MAX_RETRY", 0.1)


class LogEvents(logging.Handler):
    """Sets an event when a matching record has been logged `times` times: a wait on the log
    instead of a poll."""

    def __init__(self, match: Callable[[logging.LogRecord], bool], times: int) -> None:
        super().__init__(logging.DEBUG)
        self.match, self.left = match, times
        self.seen = anyio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.match(record):
            self.left -= 1
            if self.left <= 0:
                self.seen.set()


@asynccontextmanager
async def watching_log(
    match: Callable[[logging.LogRecord], bool], times: int
) -> AsyncIterator[LogEvents]:
    handler = LogEvents(match, times)
    logger = logging.getLogger("gateway.backend")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


# --- a backend that cannot be reached -----------------------------------------------------


async def test_a_missing_command_is_skipped_at_once_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, quick_retries: None
) -> None:
    """Lists and discovery skip a backend that is down without waiting (fan_out: fail_open),
    while it is retried in the background: several retries, one log line."""
    caplog.set_level(logging.INFO, "gateway")
    missing = str(tmp_path / "no-such-mcp-server")
    backends = {"demo": stdio_backend(DEMO), "dead": stdio_backend([missing])}

    def retried(r: logging.LogRecord) -> bool:
        return "backend dead: still down" in r.getMessage()

    async with watching_log(retried, 3) as retries, gateway(backends) as (gw, url):
        with anyio.fail_after(START_BOUND):
            await gw.catalogs_loaded.wait()
        for rid, method in enumerate(("tools/list", "server/discover", "tools/list")):
            started = anyio.current_time()
            with anyio.fail_after(BOUND):
                reply = await post(url, request(rid, method))
            assert anyio.current_time() - started < 0.5, method
            assert "result" in reply, reply
        names = [t["name"] for t in reply["result"]["tools"]]
        assert "demo_echo" in names and not any(n.startswith("dead_") for n in names)
        with anyio.fail_after(BOUND):
            await retries.seen.wait()
        states = {h.name: h.down for h in gw.health}
        assert states == {"dead": True, "demo": False}
    (line,) = records_about(caplog, "dead")
    assert line.levelno == logging.WARNING
    assert line.backend == "dead"  # type: ignore[attr-defined]
    assert "no-such-mcp-server" in line.reason  # type: ignore[attr-defined]


async def test_a_call_to_a_backend_that_is_down_fails_at_once_naming_it(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-mcp-server")
    async with gateway({"dead": stdio_backend([missing])}) as (gw, url):
        with anyio.fail_after(BOUND):
            await gw.health[0].wait(down=True)
        started = anyio.current_time()
        with anyio.fail_after(BOUND):
            reply = await post(url, call(1, "anything"))
        assert anyio.current_time() - started < 0.5
        assert reply["error"]["code"] == codes.BACKEND_UNAVAILABLE, reply
        assert "'dead'" in reply["error"]["message"]
        async with (
            aiohttp.ClientSession() as session,
            session.get(url.removesuffix("/mcp") + "/readyz") as ready,
        ):
            assert ready.status == 503
            assert (await ready.json())["backends"] == {"dead": False}


async def test_a_stdio_backend_whose_command_appears_later_is_used_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, quick_retries: None
) -> None:
    caplog.set_level(logging.INFO, "gateway")
    command = tmp_path / "later-server"
    async with gateway({"later": stdio_backend([str(command)])}) as (gw, url):
        with anyio.fail_after(BOUND):
            await gw.health[0].wait(down=True)
            assert (await post(url, call(1, "hello")))["error"]["code"] == -31001
        command.write_text(f"#!/bin/sh\nexec {PYTHON} {STARTING} serve\n")
        command.chmod(command.stat().st_mode | stat.S_IXUSR)
        with anyio.fail_after(START_BOUND):
            await gw.health[0].wait(down=False)
            assert text_of(await post(url, call(2, "hello"))).startswith("hello from")
    changes = [r.getMessage() for r in records_about(caplog, "later") if "down" in r.getMessage()]
    assert len(changes) == 1
    assert sum("up again" in r.getMessage() for r in records_about(caplog, "later")) == 1


@asynccontextmanager
async def serve_on(port: int, handle: Any) -> AsyncIterator[None]:
    app = web.Application()
    app.router.add_route("*", "/mcp", handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", port).start()
        yield
    finally:
        with anyio.CancelScope(shield=True):
            await runner.cleanup()


async def test_an_http_backend_that_starts_listening_later_is_used_again(
    caplog: pytest.LogCaptureFixture, quick_retries: None
) -> None:
    """Connection refused: down at once, the next call fails at once; once something listens
    on the port, the background retry finds it and calls go through."""
    caplog.set_level(logging.INFO, "gateway")
    url_of_backend = dead_url()
    port = int(url_of_backend.split(":")[2].split("/")[0])
    seen: list[tuple[str, str | None]] = []
    async with gateway({"web": {"http": {"url": url_of_backend}}}) as (gw, url):
        with anyio.fail_after(BOUND):
            await gw.health[0].wait(down=True)
            started = anyio.current_time()
            assert (await post(url, call(1, "t")))["error"]["code"] == -31001
            assert anyio.current_time() - started < 0.5
        async with serve_on(port, nodiscover_handler(seen)):
            with anyio.fail_after(BOUND):
                await gw.health[0].wait(down=False)
                assert text_of(await post(url, call(2, "t"))) == "modern"
    assert len([r for r in records_about(caplog, "web") if ": down (" in r.getMessage()]) == 1


# --- slow starters -------------------------------------------------------------------------


async def test_a_slow_stdio_starter_is_waited_for_and_taken_for_modern() -> None:
    """It reads nothing for 2 s: the probe waits (connect_timeout 10 s), the verdict is modern,
    the child is neither sent `initialize` nor restarted, and a call made while it starts is
    answered once it has. The listener accepts clients meanwhile."""
    backend = stdio_backend(starting("serve", "--delay", "2"), connect_timeout=10)
    started = anyio.current_time()
    async with gateway({"slow": backend}) as (gw, url):
        assert anyio.current_time() - started < 1.5  # not held up by the slow child
        assert not gw.catalogs_loaded.is_set()
        with anyio.fail_after(START_BOUND):
            assert text_of(await post(url, call(1, "hello"))).startswith("hello from")
        assert gw.eras[0].era == "modern"
        assert gw.transports[0].restarts == 0  # type: ignore[union-attr]


async def test_slow_and_silent_backends_delay_neither_start_up_nor_the_others() -> None:
    """A child still starting and an HTTP backend that never answers: the listener serves at
    once, and a call to a ready backend's tool is answered without waiting for their catalogs."""
    never = anyio.Event()

    async def silent(request: web.Request) -> web.StreamResponse:
        await never.wait()
        raise AssertionError("unreachable")

    async with serve_http(silent) as base:
        backends = {
            "demo": stdio_backend(DEMO),
            "slow": stdio_backend(starting("serve", "--delay", "4"), connect_timeout=10),
            "silent": {"http": {"url": f"{base}/mcp"}, "connect_timeout": 10},
        }
        started = anyio.current_time()
        async with gateway(backends) as (gw, url):
            assert anyio.current_time() - started < 1.0
            with anyio.fail_after(START_BOUND):
                assert text_of(await post(url, call(1, "demo_echo", text="now"))) == "now"
            assert not gw.catalogs_loaded.is_set()  # the other two are still being waited for


@pytest.mark.slow
async def test_a_slow_starter_is_waited_for_only_until_start_wait_then_announced() -> None:
    """fan_out.start_wait: a list made while a child is still starting waits that long for it,
    then answers with the others (not the load's 15 s); once the child has started, an open
    listen is told the tool list changed and the next list shows its tool
    (basic/patterns/subscriptions)."""
    backends = {
        "demo": stdio_backend(DEMO),
        "slow": stdio_backend(starting("serve", "--delay", "4"), connect_timeout=10),
    }
    listen = request(9, "subscriptions/listen", {"notifications": {"toolsListChanged": True}})
    async with gateway(backends, fan_out={"start_wait": 0.3}) as (gw, url):
        with anyio.fail_after(START_BOUND):
            first = await post(url, request(1, "tools/list"))
        names = [t["name"] for t in first["result"]["tools"]]
        assert "demo_echo" in names and "slow_hello" not in names
        assert not gw.catalogs_loaded.is_set()  # the slow one is still starting
        # Only the slow one can honour the listen (the demo announces no list changes): its
        # acknowledgement waits for the slow one's, and the news follows it.
        async with (
            aiohttp.ClientSession() as http,
            http.post(url, data=orjson.dumps(listen), headers=mirrored_headers(listen)) as stream,
        ):
            notes = messages(stream)
            with anyio.fail_after(START_BOUND):
                ack = await anext(notes)
                note = await anext(notes)
        assert ack["method"] == "notifications/subscriptions/acknowledged"
        assert note["method"] == "notifications/tools/list_changed"
        assert note["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == 9
        later = await post(url, request(2, "tools/list"))
        assert "slow_hello" in [t["name"] for t in later["result"]["tools"]]


async def test_a_slow_modern_starter_past_connect_timeout_is_modern_after_initialize(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Silent past a short connect_timeout, it is taken for legacy and sent `initialize`; its
    UnsupportedProtocolVersionError proves it modern: served so, with no kill and restart."""
    caplog.set_level(logging.INFO, "gateway")
    backend = stdio_backend(starting("serve", "--delay", "1.5"), connect_timeout=0.3)
    async with gateway({"slow": backend}) as (gw, url):
        with anyio.fail_after(START_BOUND):
            assert text_of(await post(url, call(1, "hello"))).startswith("hello from")
        assert gw.eras[0].era == "modern" and gw.eras[0].session is None
        assert gw.transports[0].restarts == 0  # type: ignore[union-attr]
        with anyio.fail_after(BOUND):
            discovered = await post(url, request(2, "server/discover"))
        assert "tools" in discovered["result"]["capabilities"]
    assert not any("legacy session open" in r.getMessage() for r in caplog.records)


async def test_a_child_that_exits_at_once_is_reported_with_its_code_and_stderr(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "gateway")
    lines = [f"noise {i}" for i in range(10)] + ["fatal: API_KEY is not set"]
    backend = stdio_backend(starting("exit", "3", *lines))
    async with gateway({"crash": backend}) as (gw, url):
        with anyio.fail_after(START_BOUND):
            await gw.health[0].wait(down=True)
        with anyio.fail_after(BOUND):
            reply = await post(url, call(1, "hello"))
    assert reply["error"]["code"] == codes.BACKEND_UNAVAILABLE
    assert "code 3" in reply["error"]["message"]
    (down,) = [r for r in records_about(caplog, "crash") if ": down (" in r.getMessage()]
    assert down.exit_code == 3  # type: ignore[attr-defined]
    tail = down.stderr_tail  # type: ignore[attr-defined]
    assert tail[-1] == "fatal: API_KEY is not set"
    assert len(tail) < len(lines)  # a bounded tail, not the whole stderr
    assert not any("speaks the" in r.getMessage() for r in caplog.records)


# --- a modern HTTP server without server/discover ---------------------------------------------


async def test_a_modern_http_server_without_discover_is_served_modern() -> None:
    """streamable-http, Backward Compatibility: its -32601 to `server/discover` is not a modern
    answer, so it is sent `initialize`; the 400 body's HeaderMismatch (-32020) proves it modern.
    Its capabilities come from what its lists answer."""
    seen: list[tuple[str, str | None]] = []
    async with (
        serve_http(nodiscover_handler(seen)) as base,
        gateway({"web": {"http": {"url": f"{base}/mcp"}}}) as (gw, url),
    ):
        with anyio.fail_after(BOUND):
            assert text_of(await post(url, call(1, "t"))) == "modern"
            listed = await post(url, request(2, "tools/list"))
            discovered = await post(url, request(3, "server/discover"))
        assert [t["name"] for t in listed["result"]["tools"]] == ["t"]
        assert discovered["result"]["capabilities"] == {"tools": {}}
        assert gw.eras[0].era == "modern" and gw.eras[0].session is None
    assert ("initialize", None) in seen
    after = seen[seen.index(("initialize", None)) + 1 :]
    assert after and all(version == "2026-07-28" for _, version in after)


# --- pure parts -----------------------------------------------------------------------------


def test_retry_delays_double_to_a_ceiling_with_jitter() -> None:
    low, high = (lambda: 0.0), (lambda: 1.0)
    assert health.retry_delay(1, low) == pytest.approx(0.8)
    assert health.retry_delay(1, high) == pytest.approx(1.2)
    assert health.retry_delay(3, lambda: 0.5) == pytest.approx(4.0)
    assert health.retry_delay(10, high) == pytest.approx(72.0)
    assert health.retry_delay(10_000, lambda: 0.5) == pytest.approx(60.0)


def test_only_modern_errors_prove_a_modern_server() -> None:
    def error(code: int, data: object = None) -> Message:
        body: dict[str, Any] = {"code": code, "message": "x"}
        if data is not None:
            body["data"] = data
        return {"jsonrpc": "2.0", "id": 1, "error": body}

    assert discovery.is_modern_error(error(-32020))
    assert discovery.is_modern_error(error(-32021))
    assert discovery.is_modern_error(error(-32022, {"supported": ["2026-07-28"]}))
    assert not discovery.is_modern_error(error(-32022))  # without its versions: ambiguous
    assert not discovery.is_modern_error(error(-32601))
    assert not discovery.is_modern_error(error(-32602))
    ok: Message = {"jsonrpc": "2.0", "id": 1, "result": {"tools": []}}
    missing = error(-32601)
    caps = discovery.capabilities({"tools/list": ok, "prompts/list": missing})
    assert caps == {"tools": {}}
