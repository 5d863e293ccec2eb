"""The gateway as the OAuth client of a real authorization server with a real login page, driven
headlessly (basic/authorization, the client's half).

oidc-provider (tests/support/oidc.py) is the authorization server, with its own login and
consent pages; a protected gateway (the gateway with an `auth:` section, in front of the demo
server) is the backend that answers 401; the gateway under test runs as a process of its own
(`run` with a backend `auth: {type: oauth}`, or `connect URL`), with a token store of its own
(XDG_STATE_HOME) and, as its BROWSER, the headless chromium of tests/servers/browser_login.mjs
behind a wrapper that counts how often a browser was opened. What the authorization server
did is read from its event lines (registrations, authorization responses, grants), the
tokens from the gateway's store. Each browser login takes about 2-3 s.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import jwt
import orjson
import pytest
import yaml
from mcp import Client, StdioServerParameters
from mcp_types import TextContent

from tests.support import (
    PYTHON,
    ROOT,
    START_BOUND,
    Proc,
    call,
    gateway_command,
    messages,
    mirrored_headers,
)
from tests.support.oidc import (
    LOGIN_BOUND,
    AuthServer,
    CodeClient,
    Resource,
    browser_args,
    free_ports,
    require_browser,
    start_protected_gateway,
)

# Logins through headless chromium at a real authorization server: several seconds a test.
pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SCOPE = "mcp:tools"
# The account typed into the login page: the token's `sub`.
USER = "alice"
# A public native client registered at the authorization server beforehand.
NATIVE = CodeClient("gateway-native")
# The name `connect` registers under (no flag sets it).
DEFAULT_CLIENT_NAME = "mcp-transparent-gateway"


@pytest.fixture(scope="module")
def resource() -> str:
    """The protected gateway's URL, its resource indicator."""
    (port,) = free_ports(1)
    return f"http://127.0.0.1:{port}/mcp"


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory, resource: str) -> Iterator[AuthServer]:
    require_browser()
    server = AuthServer(
        tmp_path_factory.mktemp("oidc"),
        clients=[],
        resources={resource: Resource(SCOPE)},
        code_clients=[NATIVE],
        registration=True,
        refresh_tokens="always",
    )
    with server.running():
        yield server


@pytest.fixture(scope="module")
def protected(
    tmp_path_factory: pytest.TempPathFactory, auth_server: AuthServer, resource: str
) -> Iterator[str]:
    """The backend: the demo server behind a gateway that takes only tokens of `auth_server`
    bound to `resource` with SCOPE."""
    proc = start_protected_gateway(tmp_path_factory.mktemp("gw"), auth_server, resource, [SCOPE])
    try:
        yield resource
    finally:
        proc.stop()


# --- the gateway under test and its world ------------------------------------------------------


@dataclass(frozen=True)
class Home:
    """A client gateway's surroundings, kept across its restarts: its token store and the
    browser it opens (each opening appends a line to `opened`)."""

    directory: Path

    @property
    def state(self) -> Path:
        return self.directory / "state"

    @property
    def opened(self) -> Path:
        return self.directory / "browser-opened"

    def env(self) -> dict[str, str]:
        # webbrowser runs BROWSER's command line with `%s` replaced by the URL (and splits the
        # variable at os.pathsep: nothing here has a colon).
        count = 'echo opened >> "$0" && exec "$@"'
        browser = shlex.join(["sh", "-c", count, str(self.opened), *browser_args(login=USER)])
        return {"XDG_STATE_HOME": str(self.state), "BROWSER": f"{browser} %s"}

    def browser_logins(self) -> int:
        return len(self.opened.read_text().splitlines()) if self.opened.exists() else 0

    def records(self) -> list[dict[str, Any]]:
        store = self.state / "mcp-gateway"
        files = sorted(store.glob("*.json")) if store.is_dir() else []
        return [orjson.loads(path.read_bytes()) for path in files]

    def record(self) -> dict[str, Any]:
        """The one stored login."""
        records = self.records()
        assert len(records) == 1, records
        return records[0]

    def tokens(self) -> tuple[str, str]:
        """The stored access and refresh tokens."""
        token = self.record()["token"]
        assert token["access_token"] and token["refresh_token"], token
        return token["access_token"], token["refresh_token"]

    def client_id(self) -> str:
        """The client id the stored login was made with: the registered one, if any."""
        registration = self.record()["registration"]
        if registration is None:
            client_id: str = unverified(self.tokens()[0])["client_id"]
            return client_id
        registered: str = registration["client_id"]
        return registered

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [PYTHON, "-m", "gateway", *args],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, **self.env()},
            timeout=START_BOUND,
            check=False,
        )


def client_config(home: Home, url: str, auth: dict[str, Any], *, tap: bool = False) -> Path:
    backend = {
        "http": {"url": url},
        "auth": auth,
        # How long a request waits for the login it started (the browser's bound, plus).
        "connect_timeout": LOGIN_BOUND + 5,
    }
    config: dict[str, Any] = {
        "listen": {"http": {"host": "127.0.0.1", "port": 0, "path": "/mcp"}},
        "backends": {"remote": backend},
    }
    if tap:
        config["tap"] = {"path": str(home.directory / "tap.jsonl")}
    path = home.directory / f"gateway-{len(list(home.directory.glob('gateway-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass
class Running:
    proc: Proc
    url: str


def start(home: Home, config: Path) -> Running:
    """`run --config` (debug log) in `home`; its listener URL (requests are held until the
    backend is up, i.e. logged in)."""
    proc = Proc(gateway_command(config), env=home.env())
    try:
        url = proc.wait_for(r"listening on (http://\S+)").group(1)
    except BaseException:
        proc.stop()
        raise
    return Running(proc, url)


def stop(gateway: Running) -> None:
    assert gateway.proc.stop() == 0, gateway.proc.output()


async def echo(url: str, text: str) -> str:
    """tools/call echo through the gateway at `url` (a modern request, plain HTTP)."""
    msg = call(1, "echo", text=text)
    with anyio.fail_after(LOGIN_BOUND + 10):
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=orjson.dumps(msg), headers=mirrored_headers(msg)) as resp,
        ):
            replies = [m async for m in messages(resp)]
    assert replies and "result" in replies[-1], replies
    result = replies[-1]["result"]
    assert not result.get("isError"), result
    text_out: str = result["content"][0]["text"]
    return text_out


def unverified(token: str) -> dict[str, Any]:
    """A JWT's claims as the authorization server put them (the protected gateway checked the
    signature already: the call was served)."""
    out: dict[str, Any] = jwt.decode(token, options={"verify_signature": False})
    return out


def assert_issued_by_login(token: str, server: AuthServer, resource: str, client_id: str) -> None:
    claims = unverified(token)
    assert claims["iss"] == server.issuer
    assert claims["aud"] == resource  # RFC 8707: bound to the backend it is for
    assert claims["sub"] == USER  # the account logged in at the login page
    assert claims["client_id"] == client_id
    assert SCOPE in claims["scope"].split()


# --- dynamic registration; secrets ---------------------------------------------------------


@dataclass
class Registered:
    home: Home
    gateway: Running


@pytest.fixture(scope="module")
def registered(tmp_path_factory: pytest.TempPathFactory, protected: str) -> Iterator[Registered]:
    """A client gateway with `auth: {type: oauth}` and nothing else (no client id: dynamic
    registration), its traffic tapped; shared by the tests that only call through it."""
    home = Home(tmp_path_factory.mktemp("registered"))
    auth = {"type": "oauth", "client_name": "login-registered"}
    gateway = start(home, client_config(home, protected, auth, tap=True))
    try:
        yield Registered(home, gateway)
    finally:
        stop(gateway)


async def test_a_dynamically_registered_native_client_logs_in_and_calls_a_tool(
    auth_server: AuthServer, protected: str, registered: Registered
) -> None:
    """The backend's 401 leads the gateway to the authorization server (protected resource
    metadata, then the server's metadata), where it registers as a native public client
    (RFC 7591) with a loopback redirect URI, opens the browser on the authorization request,
    and the login made there buys a token bound to the backend for the user who logged in:
    the call is served."""
    home = registered.home
    assert await echo(registered.gateway.url, "hello") == "hello"

    (registration,) = auth_server.events("registration", 1, client_name="login-registered")
    assert registration["application_type"] == "native"
    assert registration["token_endpoint_auth_method"] == "none"
    assert set(registration["grant_types"]) >= {"authorization_code", "refresh_token"}
    (redirect,) = registration["redirect_uris"]
    assert redirect.startswith("http://127.0.0.1:") and redirect.endswith("/callback")
    client_id = registration["client_id"]
    assert home.client_id() == client_id

    assert home.browser_logins() == 1
    assert len(auth_server.events("authorization", 1, client_id=client_id)) == 1
    codes = auth_server.events("grant", 1, client_id=client_id, grant_type="authorization_code")
    assert len(codes) == 1
    access, _ = home.tokens()
    assert_issued_by_login(access, auth_server, protected, client_id)
    record = home.record()
    assert (record["backend"], record["resource"], record["issuer"]) == (
        "remote",
        protected,
        auth_server.issuer,
    )


async def test_no_token_nor_code_reaches_the_log_or_the_tap(
    auth_server: AuthServer, registered: Registered
) -> None:
    """The debug log and the traffic tap (which records the gateway's POSTs to the backend,
    headers included) hold neither the access token, nor the refresh token, nor the
    authorization code the login returned."""
    home, gateway = registered.home, registered.gateway
    assert await echo(gateway.url, "quiet") == "quiet"
    access, refresh = home.tokens()
    client_id = home.client_id()
    (authorization,) = auth_server.events("authorization", 1, client_id=client_id)
    code = authorization["code"]
    secrets = {"access token": access, "refresh token": refresh, "authorization code": code}

    log = "\n".join(gateway.proc.lines["stderr"])
    assert "needs a login: open " in log  # the log is the one of the login
    tap = (home.directory / "tap.jsonl").read_text()
    records = [orjson.loads(line) for line in tap.splitlines()]
    # The tap did record the backend hop with its headers (the call among them); the bearer
    # token is added to a request after it is recorded, so Authorization is absent (or, were it
    # recorded, redacted).
    sent = [r for r in records if r.get("hop") == "backend" and r.get("dir") == "out"]
    assert any(r["msg"].get("method") == "tools/call" and r.get("headers") for r in sent), tap
    for r in sent:
        shown = {name.lower(): value for name, value in r.get("headers", {}).items()}
        assert shown.get("authorization", "[redacted]") == "[redacted]", r
    for what, secret in secrets.items():
        assert secret not in log, f"the {what} is in the gateway's log"
        assert secret not in tap, f"the {what} is in the tap"
        # Nor any recognisable part of it (a JWT's signature, say, logged alone).
        for part in secret.split("."):
            if len(part) >= 16:
                assert part not in log and part not in tap, f"part of the {what} leaked"


# --- a pre-registered client; refresh --------------------------------------------------------


async def test_a_pre_registered_public_native_client_logs_in_without_registering(
    tmp_path: Path, auth_server: AuthServer, protected: str
) -> None:
    home = Home(tmp_path)
    auth = {"type": "oauth", "client_id": NATIVE.client_id, "client_name": "login-configured"}
    gateway = start(home, client_config(home, protected, auth))
    try:
        assert await echo(gateway.url, "configured") == "configured"
    finally:
        stop(gateway)
    assert auth_server.events("registration", client_name="login-configured") == []
    assert home.record()["registration"] is None
    assert home.browser_logins() == 1
    access, _ = home.tokens()
    assert_issued_by_login(access, auth_server, protected, NATIVE.client_id)


async def test_a_token_about_to_expire_is_refreshed_without_another_login(
    tmp_path: Path, auth_server: AuthServer, protected: str
) -> None:
    """`refresh_margin` longer than the token lives (300 s): every request after the login
    finds the token about to expire and renews it with the refresh token (rotated each time,
    as a public client's is): calls succeed, the browser opened once, one authorization code
    was redeemed, and the store holds the newest tokens."""
    home = Home(tmp_path)
    auth = {"type": "oauth", "client_name": "login-refresh", "refresh_margin": 3600}
    gateway = start(home, client_config(home, protected, auth))
    try:
        assert await echo(gateway.url, "first") == "first"
        client_id = home.client_id()
        refreshes = auth_server.events("grant", client_id=client_id, grant_type="refresh_token")
        first = home.tokens()
        assert await echo(gateway.url, "second") == "second"
        more = auth_server.events(
            "grant", len(refreshes) + 1, client_id=client_id, grant_type="refresh_token"
        )
        assert len(more) > len(refreshes)
        second = home.tokens()
    finally:
        stop(gateway)
    assert home.browser_logins() == 1
    assert len(auth_server.events("authorization", client_id=client_id)) == 1
    codes = auth_server.events("grant", client_id=client_id, grant_type="authorization_code")
    assert len(codes) == 1
    assert second[0] != first[0] and second[1] != first[1]
    assert_issued_by_login(second[0], auth_server, protected, client_id)


# --- the store across restarts; auth list and logout ----------------------------------------


async def test_a_stored_login_survives_a_restart_until_logout(
    tmp_path: Path, auth_server: AuthServer, protected: str
) -> None:
    """After a restart the stored token (and registration) is used: no browser, no new
    authorization, no new registration. `auth list` shows the login; `auth logout NAME`
    removes it, and the next start logs in again."""
    home = Home(tmp_path)
    name = "login-restart"
    config = client_config(home, protected, {"type": "oauth", "client_name": name})
    gateway = start(home, config)
    try:
        assert await echo(gateway.url, "before") == "before"
    finally:
        stop(gateway)
    client_id = home.client_id()
    stored = home.tokens()

    gateway = start(home, config)
    try:
        assert await echo(gateway.url, "after") == "after"
    finally:
        stop(gateway)
    assert home.browser_logins() == 1
    assert len(auth_server.events("registration", client_name=name)) == 1
    assert len(auth_server.events("authorization", client_id=client_id)) == 1
    assert home.tokens() == stored  # still good: neither renewed nor replaced

    # Restarted once more, finding the stored token about to expire (a margin longer than its
    # life): the stored refresh token and registration renew it, still without a browser.
    refreshing = {"type": "oauth", "client_name": name, "refresh_margin": 3600}
    gateway = start(home, client_config(home, protected, refreshing))
    try:
        assert await echo(gateway.url, "renewed") == "renewed"
    finally:
        stop(gateway)
    assert home.browser_logins() == 1
    assert auth_server.events("grant", 1, client_id=client_id, grant_type="refresh_token")
    assert len(auth_server.events("authorization", client_id=client_id)) == 1
    assert len(auth_server.events("registration", client_name=name)) == 1
    renewed = home.tokens()
    assert renewed[0] != stored[0] and renewed[1] != stored[1]
    assert home.client_id() == client_id

    listed = home.cli("auth", "list")
    assert listed.returncode == 0, listed.stderr
    (line,) = listed.stdout.splitlines()
    fields = line.split("\t")
    assert fields[:4] == ["remote", protected, "user (gateway)", f"issuer {auth_server.issuer}"]
    assert fields[4].startswith("expires in ") and fields[5] == "refresh token", line
    assert renewed[0] not in listed.stdout and renewed[1] not in listed.stdout

    out = home.cli("auth", "logout", "remote")
    assert out.returncode == 0, out.stderr
    assert "removed 1 stored login(s) for remote" in out.stdout
    assert home.records() == []
    again = home.cli("auth", "logout", "remote")
    assert again.returncode == 1 and "no stored login for remote" in again.stderr
    assert "no stored logins" in home.cli("auth", "list").stdout

    gateway = start(home, config)
    try:
        assert await echo(gateway.url, "again") == "again"
    finally:
        stop(gateway)
    assert home.browser_logins() == 2
    assert home.tokens() not in (stored, renewed)
    assert_issued_by_login(home.tokens()[0], auth_server, protected, home.client_id())


# --- connect ---------------------------------------------------------------------------------


async def test_connect_logs_in_by_itself_and_serves_the_backend_on_stdio(
    tmp_path: Path, auth_server: AuthServer, protected: str
) -> None:
    """`connect URL` with no auth flag, spoken to by the SDK's client over stdio: the server's
    401 makes it register, log in in the browser and store the login; the call is served."""
    home = Home(tmp_path)
    bridge = StdioServerParameters(
        command=PYTHON,
        args=["-m", "gateway", "connect", protected],
        cwd=str(ROOT),
        env={**os.environ, **home.env()},
    )
    with anyio.fail_after(LOGIN_BOUND + START_BOUND):
        async with Client(bridge) as client:
            result = await client.call_tool("echo", {"text": "over stdio"})
    block = result.content[0]
    assert isinstance(block, TextContent) and block.text == "over stdio", result
    assert home.browser_logins() == 1
    (registration,) = auth_server.events("registration", client_name=DEFAULT_CLIENT_NAME)
    assert registration["application_type"] == "native"
    assert home.client_id() == registration["client_id"]
    assert home.record()["backend"] == "remote"
    access, _ = home.tokens()
    assert_issued_by_login(access, auth_server, protected, registration["client_id"])
    # `auth logout` takes the backend's URL as well as its name.
    out = home.cli("auth", "logout", protected)
    assert out.returncode == 0 and "removed 1 stored login(s)" in out.stdout, out
    assert home.records() == []
