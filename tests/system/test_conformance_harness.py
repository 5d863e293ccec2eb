"""The pieces of the conformance harness's auth runs, without the suite: the headless browser
(tests/servers/headless_browser.py) as Python's `webbrowser` runs it, and how a scenario's
context becomes the gateway's `auth:` section and `connect` flags."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
import yaml
from aiohttp import web

from tests.servers import conformance_client as client
from tests.support import PYTHON, dead_url, serve_http

pytestmark = pytest.mark.anyio

# What the gateway does to open the browser: webbrowser.open, true when the program exited 0.
OPEN = "import sys, webbrowser; sys.exit(0 if webbrowser.open(sys.argv[1]) else 1)"


class AuthorizationServer:
    """An authorization endpoint that approves at once, redirecting to a callback that
    records the code; and a callback that refuses (a login the client rejects)."""

    def __init__(self) -> None:
        self.codes: list[str] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/authorize":
            state = request.query["state"]
            raise web.HTTPFound(f"{request.url.origin()}/callback?code=abc&state={state}")
        if request.path == "/callback":
            self.codes.append(request.query["code"])
            return web.Response(text="<p>Logged in.</p>", content_type="text/html")
        if request.path == "/refuse":
            raise web.HTTPFound(f"{request.url.origin()}/denied")
        return web.Response(status=400, text="denied")


async def test_webbrowser_runs_the_headless_browser_to_the_callback(tmp_path: Path) -> None:
    server = AuthorizationServer()
    async with serve_http(server.handle, "/{tail:.*}") as base:
        with anyio.fail_after(15):
            done = await anyio.run_process(
                [PYTHON, "-c", OPEN, f"{base}/authorize?state=s1"],
                env=client.gateway_env(tmp_path),
                check=False,
            )
    assert done.returncode == 0, done.stderr
    assert server.codes == ["abc"]


async def test_a_refused_callback_is_exit_1_with_one_line(tmp_path: Path) -> None:
    server = AuthorizationServer()
    async with serve_http(server.handle, "/{tail:.*}") as base:
        with anyio.fail_after(15):
            done = await anyio.run_process(
                [PYTHON, str(client.BROWSER), f"{base}/refuse"], check=False
            )
    assert done.returncode == 1
    assert len(done.stderr.decode().splitlines()) == 1
    assert server.codes == []


async def test_nothing_listening_is_exit_1_with_one_line() -> None:
    with anyio.fail_after(15):
        done = await anyio.run_process([PYTHON, str(client.BROWSER), dead_url()], check=False)
    assert done.returncode == 1
    assert len(done.stderr.decode().splitlines()) == 1


def test_each_gateway_gets_its_own_state_directory(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    states = {client.gateway_env(d)["XDG_STATE_HOME"] for d in (first, second)}
    assert len(states) == 2
    assert all(Path(state).is_dir() and not any(Path(state).iterdir()) for state in states)


def test_an_authorization_code_scenario_gets_discovery_and_the_cimd_url(
    tmp_path: Path,
) -> None:
    context = {"name": "auth/metadata-default"}
    settings = client.auth_settings("auth/metadata-default", context, tmp_path)
    assert settings == {"type": "oauth", "client_metadata_url": client.CIMD_URL}
    assert client.connect_flags(settings) == [
        "--auth",
        "oauth",
        "--client-metadata-url",
        client.CIMD_URL,
    ]


def test_a_pre_registered_client_gets_its_credentials_and_no_cimd_url(tmp_path: Path) -> None:
    context = {"client_id": "id", "client_secret": "secret", "issuer": "http://as"}
    settings = client.auth_settings("auth/pre-registration", context, tmp_path)
    assert settings == {"type": "oauth", "client_id": "id", "client_secret": "secret"}


def test_a_private_key_becomes_a_key_file_and_private_key_jwt(tmp_path: Path) -> None:
    pem = "-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----\n"
    context = {"client_id": "id", "private_key_pem": pem, "signing_algorithm": "ES256"}
    settings = client.auth_settings("auth/client-credentials-jwt", context, tmp_path)
    assert settings is not None
    key_file = Path(settings.pop("private_key_file"))
    assert key_file.read_text() == pem
    assert key_file.stat().st_mode & 0o077 == 0
    assert settings == {
        "type": "client_credentials",
        "client_id": "id",
        "signing_algorithm": "ES256",
        "token_endpoint_auth_method": "private_key_jwt",
    }


def test_scopes_repeat_the_scope_flag() -> None:
    flags = client.connect_flags({"type": "oauth", "scopes": ["a", "b"]})
    assert flags == ["--auth", "oauth", "--scope", "a", "--scope", "b"]


def test_other_scenarios_get_no_auth(tmp_path: Path) -> None:
    assert client.auth_settings("tools_call", {}, tmp_path) is None


def test_the_http_gateway_config_carries_the_auth_section(tmp_path: Path) -> None:
    """The backend's `auth:` sits next to its `http:` in the config the gateway is run with."""
    auth = {"type": "oauth", "client_metadata_url": client.CIMD_URL}
    # The gateway is not started: writing the config is the part under test.
    config = client.write_gateway_config("http://127.0.0.1:1/mcp", auth, tmp_path)
    backend = yaml.safe_load(config.read_text())["backends"]["mock"]
    assert backend == {"http": {"url": "http://127.0.0.1:1/mcp"}, "auth": auth}
