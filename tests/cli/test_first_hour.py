"""What a newcomer meets when `run`, `connect` and `expose` cannot start (issue 36;
docs/guides/first-hour-cli.md): each case is one line on stderr that names what to do, in the
flags the user typed, and exit status 2, told as soon as the answer is definite. Real processes
throughout: the gateway's CLI against small HTTP servers on 127.0.0.1 (a 404, a 401 with
protected resource metadata, a closed port) and stdio commands that exit at once.

`--wait` keeps the old way: the gateway starts anyway and retries in the background."""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import orjson
import pytest
import yaml
from aiohttp import web

from gateway.config.model import DEFAULT_CONNECT_TIMEOUT
from tests.support import (
    BOUND,
    DEMO_BACKEND,
    PYTHON,
    START_BOUND,
    Proc,
    dead_url,
    one_line,
    run_cli,
)
from tests.support.conformance import npm_server
from tests.support.probe import post

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

# A definite answer is told at once: well before the connect timeout the old start waited out.
PROMPT = DEFAULT_CONNECT_TIMEOUT - 1
EXITS_AT_ONCE = (
    "import sys; sys.stderr.write('starting\\nboom: API_KEY is not set\\n'); sys.exit(3)"
)
META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}


def served(url: str) -> None:
    """The gateway at `url` answers (and so, its start over, holds its signals)."""
    ask = {"jsonrpc": "2.0", "id": 0, "method": "server/discover", "params": {"_meta": META}}
    status, reply = post(url, ask)
    assert status == 200 and reply["id"] == 0, reply


async def cli(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """`python -m gateway ARGS` to its end (off the loop that serves the test's server), and
    how long it took."""
    began = time.monotonic()
    done = await anyio.to_thread.run_sync(functools.partial(run_cli, *args))
    return done, time.monotonic() - began


@asynccontextmanager
async def site(routes: list[web.RouteDef]) -> AsyncIterator[str]:
    """An HTTP server on 127.0.0.1 with `routes`; yields its origin."""
    app = web.Application()
    app.add_routes(routes)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        with anyio.CancelScope(shield=True):
            await runner.cleanup()


async def not_found(_: web.Request) -> web.Response:
    return web.Response(status=404, text="Not Found")


def protected(with_issuer: bool) -> list[web.RouteDef]:
    """A resource server that wants a token: 401 with a challenge naming its protected
    resource metadata (basic/authorization, Protected Resource Metadata Discovery), which
    names an authorization server or, as a gateway protected by API keys does, none."""

    async def challenge(request: web.Request) -> web.Response:
        where = f"{request.url.origin()}/.well-known/oauth-protected-resource/mcp"
        header = f'Bearer error="invalid_token", resource_metadata="{where}"'
        return web.Response(status=401, headers={"WWW-Authenticate": header})

    async def metadata(request: web.Request) -> web.Response:
        origin = str(request.url.origin())
        doc: dict[str, object] = {"resource": f"{origin}/mcp"}
        if with_issuer:
            doc["authorization_servers"] = [origin]
        return web.json_response(doc)

    return [
        web.route("*", "/mcp", challenge),
        web.get("/.well-known/oauth-protected-resource/mcp", metadata),
    ]


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- run --host/--port ---------------------------------------------------------------------


def test_run_port_serves_the_demo_on_the_port_given() -> None:
    port = free_port()
    proc = Proc([PYTHON, "-m", "gateway", "run", "--host", "127.0.0.1", "--port", str(port)])
    try:
        proc.wait_for(rf"listening on http://127\.0\.0\.1:{port}/mcp")
        served(f"http://127.0.0.1:{port}/mcp")
    finally:
        assert proc.stop() == 0, proc.output()


def test_run_port_overrides_the_listener_of_an_mcp_json(tmp_path: Path) -> None:
    hosts = tmp_path / "mcp.json"
    demo = {"command": PYTHON, "args": ["-m", "gateway.demo.server"]}
    hosts.write_bytes(orjson.dumps({"mcpServers": {"demo": demo}}))
    port = free_port()
    proc = Proc([PYTHON, "-m", "gateway", "run", "--mcp-json", str(hosts), "--port", str(port)])
    try:
        proc.wait_for(rf"listening on http://127\.0\.0\.1:{port}/mcp")
        served(f"http://127.0.0.1:{port}/mcp")
    finally:
        assert proc.stop() == 0, proc.output()


async def test_run_port_in_use_names_the_flag(taken_port: int) -> None:
    done, _ = await cli("run", "--port", str(taken_port))
    line = one_line(done)
    assert line.startswith(f"error: --port {taken_port}: 127.0.0.1:{taken_port} is already in use")
    assert "another port with --port" in line and "listen.http" not in line


async def test_a_configs_port_in_use_points_to_the_flag(tmp_path: Path, taken_port: int) -> None:
    config = tmp_path / "gateway.yaml"
    listen = {"http": {"port": taken_port}}
    config.write_text(yaml.safe_dump({"listen": listen, "backends": {"demo": DEMO_BACKEND}}))
    line = one_line((await cli("run", "--config", str(config)))[0])
    assert line.startswith(f"error: listen.http: 127.0.0.1:{taken_port} is already in use")
    assert "--port" in line


async def test_run_port_without_an_http_listener_is_a_usage_error(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    listen = {"stdio": True}
    config.write_text(yaml.safe_dump({"listen": listen, "backends": {"demo": DEMO_BACKEND}}))
    done, _ = await cli("run", "--config", str(config), "--port", "9")
    assert done.returncode == 2 and "listen.http" in done.stderr and "Traceback" not in done.stderr


# --- connect -------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["auto", "http", "sse"])
async def test_connect_to_a_wrong_path_asks_whether_the_path_is_right(transport: str) -> None:
    async with site([web.route("*", "/{tail:.*}", not_found)]) as origin:
        url = f"{origin}/mpc"
        done, took = await cli("connect", url, "--transport", transport)
    line = one_line(done)
    assert line.startswith(f"error: got HTTP 404 from {url}: is the path right?")
    assert took < PROMPT  # (it waited 10.5 s before)


async def test_connect_to_a_server_that_wants_a_token_says_to_pass_one() -> None:
    async with site(protected(with_issuer=True)) as origin:
        done, took = await cli("connect", f"{origin}/mcp", "--auth", "none")
    line = one_line(done)
    assert "the server wants a token" in line
    assert "-H 'Authorization: Bearer …'" in line and "let connect log in" in line
    assert took < PROMPT


async def test_a_token_refused_is_said_to_be_the_one_given() -> None:
    async with site(protected(with_issuer=True)) as origin:
        done, _ = await cli("connect", f"{origin}/mcp", "-H", "Authorization: Bearer wrong")
    line = one_line(done)
    assert "refused the token given with -H" in line and "wrong" not in line


async def test_metadata_naming_no_authorization_server_is_told_as_such() -> None:
    """The metadata exists but lists no authorization server: not "no protected resource
    metadata", and the flags are connect's own."""
    async with site(protected(with_issuer=False)) as origin:
        done, took = await cli("connect", f"{origin}/mcp")
    line = one_line(done)
    assert "lists no authorization_servers" in line
    assert "no protected resource metadata" not in line
    assert "-H 'Authorization: Bearer …'" in line and "--authorization-server" in line
    assert "auth.authorization_server" not in line
    assert took < PROMPT


async def test_a_login_that_cannot_be_had_uses_connects_flags() -> None:
    """The authorization server's metadata offers no registration: the login fails at once,
    and the line names connect's --client-id, not the config's key."""

    async def server_metadata(request: web.Request) -> web.Response:
        origin = str(request.url.origin())
        return web.json_response(
            {
                "issuer": origin,
                "authorization_endpoint": f"{origin}/authorize",
                "token_endpoint": f"{origin}/token",
                "code_challenge_methods_supported": ["S256"],
                "response_types_supported": ["code"],
            }
        )

    routes = [*protected(True), web.get("/.well-known/oauth-authorization-server", server_metadata)]
    async with site(routes) as origin:
        done, _ = await cli("connect", f"{origin}/mcp", "--no-browser", "--no-store")
    line = one_line(done)
    assert "--client-id" in line and "auth.client_id" not in line


async def test_connect_to_a_closed_port_says_nothing_listens() -> None:
    url = dead_url()
    done, took = await cli("connect", url)
    line = one_line(done)
    assert line.startswith(f"error: nothing listens at {url} (connection refused)")
    assert "--wait" in line and took < PROMPT


async def test_connect_to_an_unknown_host_says_so() -> None:
    done, _ = await cli("connect", "http://no-such-host.invalid/mcp")
    line = one_line(done)
    assert "cannot resolve the host 'no-such-host.invalid'" in line and "check the URL" in line


async def test_connect_with_https_to_a_plain_http_port_is_a_tls_failure() -> None:
    async with site([web.route("*", "/mcp", not_found)]) as origin:
        url = origin.replace("http://", "https://") + "/mcp"
        done, _ = await cli("connect", url)
    line = one_line(done)
    assert line.startswith(f"error: TLS with {url} failed") and "check the URL" in line


def test_connect_wait_keeps_running_and_retrying() -> None:
    proc = Proc([PYTHON, "-m", "gateway", "connect", dead_url(), "--wait"], stdin=True)
    try:
        proc.wait_for(r"backend remote: down \(.*\); retrying in the background")
        assert proc.popen.poll() is None
    finally:
        proc.stop()


def test_a_lone_backends_failed_list_is_not_a_skip_of_a_fan_out() -> None:
    """A list asked of `connect --wait` while its server is down fails with the backend's
    error; no "fan-out: backend remote skipped" line (there is no fan-out to skip it from)."""
    proc = Proc([PYTHON, "-m", "gateway", "connect", dead_url(), "--wait"], stdin=True)
    try:
        proc.wait_for(r"retrying in the background")
        assert proc.popen.stdin is not None
        ask = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": META}}
        proc.popen.stdin.write(orjson.dumps(ask) + b"\n")
        proc.popen.stdin.flush()
        reply = orjson.loads(proc.wait_for(r'"id":1[,}]', stream="stdout").string)
        assert reply["error"]["code"] == -31001, reply  # BACKEND_UNAVAILABLE
    finally:
        proc.stop()
    assert not any("fan-out" in line for line in proc.lines["stderr"]), proc.output()


# --- expose --------------------------------------------------------------------------------


@pytest.mark.parametrize("isolation", ["shared", "per_session"])
async def test_expose_of_a_server_that_exits_at_once_shows_its_stderr(isolation: str) -> None:
    done, took = await cli(
        "expose", "--port", "0", "--isolation", isolation, "--", PYTHON, "-c", EXITS_AT_ONCE
    )
    line = one_line(done)
    assert "did not start: child exited with code 3" in line
    assert "boom: API_KEY is not set" in line  # (the stderr's tail, on the same line)
    assert "check the command after --" in line and "--wait" in line
    assert took < PROMPT


async def test_expose_of_a_command_not_found_says_so() -> None:
    done, _ = await cli("expose", "--port", "0", "--", "no-such-command-here")
    line = one_line(done)
    assert "cannot start 'no-such-command-here'" in line


async def test_expose_port_in_use_names_the_flag(taken_port: int) -> None:
    done, _ = await cli("expose", "--port", str(taken_port), "--", PYTHON, "-c", "pass")
    line = one_line(done)
    assert line.startswith(f"error: --port {taken_port}: ") and "listen.http" not in line


def test_expose_wait_keeps_running_and_retrying() -> None:
    proc = Proc(
        [PYTHON, "-m", "gateway", "expose", "--port", "0", "--wait", "--", PYTHON, "-c", "pass"]
    )
    try:
        url = proc.wait_for(r"listening on (http://\S+)").group(1)
        proc.wait_for(r"down \(child exited with code 0.*\); retrying in the background")
        served(url)
        assert proc.popen.poll() is None
    finally:
        assert proc.stop() == 0, proc.output()


def counter_command() -> list[str]:
    return [PYTHON, str(Path(__file__).parents[1] / "servers" / "counter_server.py")]


def call_count(url: str, caller: str) -> dict[str, int]:
    """`count` as the caller `caller` (its Authorization header keys its child)."""
    msg = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "count", "arguments": {}, "_meta": META},
    }
    status, reply = post(url, msg, {"Authorization": f"Bearer {caller}"})
    assert status == 200, reply
    found: dict[str, int] = reply["result"]["structuredContent"]
    return found


@pytest.mark.parametrize(("isolation", "apart"), [("per_session", True), ("shared", False)])
def test_expose_isolation_per_session_gives_each_caller_a_child(
    isolation: str, apart: bool
) -> None:
    command = [PYTHON, "-m", "gateway", "expose", "--port", "0", "--isolation", isolation]
    proc = Proc([*command, "--", *counter_command()])
    try:
        url = proc.wait_for(r"listening on (http://\S+)").group(1)
        alice, bob = call_count(url, "alice"), call_count(url, "bob")
        assert (alice["pid"] != bob["pid"]) is apart
        assert bob["count"] == (1 if apart else 2)
    finally:
        assert proc.stop() == 0, proc.output()


def test_expose_roots_answers_a_servers_roots_list(tmp_path: Path) -> None:
    """client/roots, Listing Roots: a client without the roots capability cannot be asked, so
    the gateway answers the server with the --roots it was given, as file:// URIs."""
    (tmp_path / "a b").mkdir()
    server = str(Path(__file__).parents[1] / "servers" / "roots_server.py")
    command = [PYTHON, "-m", "gateway", "expose", "--port", "0", "--roots", str(tmp_path / "a b")]
    proc = Proc([*command, "--", PYTHON, server])
    try:
        url = proc.wait_for(r"listening on (http://\S+)").group(1)
        msg = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "startup_roots", "arguments": {}, "_meta": META},
        }
        status, reply = post(url, msg)
        assert status == 200, reply
        told = orjson.loads(reply["result"]["content"][0]["text"])
        assert told["result"]["roots"] == [{"uri": (tmp_path / "a b").resolve().as_uri()}]
    finally:
        assert proc.stop() == 0, proc.output()


# --- telemetry -----------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["grpc", "http/json"])
def test_an_otlp_protocol_the_exporter_does_not_speak_stops_the_start(protocol: str) -> None:
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317",
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
    }
    done = subprocess.run(
        [PYTHON, "-m", "gateway", "run", "--port", "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=20,
        check=False,
    )
    line = one_line(done)
    assert line.startswith(f"error: OTEL_EXPORTER_OTLP_PROTOCOL={protocol} is not supported")
    assert "http/protobuf" in line


async def test_connect_to_a_server_that_never_answers_is_bounded_by_the_connect_timeout() -> None:
    """The bound kept on what is not a definite answer: a port that accepts connections and
    says nothing ends the start after the connect timeout, not never."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # (the kernel accepts; nobody reads or answers)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/mcp"
        done, took = await cli("connect", url)
    line = one_line(done)
    assert line.startswith(f"error: no answer from {url} within {DEFAULT_CONNECT_TIMEOUT:g}s")
    assert DEFAULT_CONNECT_TIMEOUT <= took < DEFAULT_CONNECT_TIMEOUT + 8


def test_expose_names_a_node_packages_server_after_the_package() -> None:
    """`expose -- node .../node_modules/@modelcontextprotocol/server-everything/dist/index.js`
    (issue 36: it was `node_modules`): the backend is named by the package's package.json."""
    command = [*npm_server("server-everything"), "stdio"]
    proc = Proc([PYTHON, "-m", "gateway", "expose", "--port", "0", "--", *command])
    try:
        url = proc.wait_for(r"listening on (http://\S+)").group(1)
        served(url)
        assert any("backend server-everything:" in line for line in proc.lines["stderr"])
        assert not any("node_modules" in line for line in proc.lines["stderr"]), proc.output()
    finally:
        assert proc.stop() == 0, proc.output()


def test_ctrl_c_while_connect_asks_its_url_ends_it_quietly() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        silent.settimeout(START_BOUND)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/mcp"
        proc = Proc([PYTHON, "-m", "gateway", "connect", url], stdin=True)
        try:
            conn, _ = silent.accept()  # (the question is under way)
            with conn:
                proc.popen.send_signal(signal.SIGINT)
                assert proc.popen.wait(BOUND) == 130
        finally:
            proc.stop()
    assert not any("Traceback" in line for line in proc.lines["stderr"]), proc.output()
