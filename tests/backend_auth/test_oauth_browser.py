"""A real authorization server with a real login page, driven headlessly: the ground the
gateway's OAuth client tests stand on.

oidc-provider (tests/support/oidc.py) with native clients (pre-registered and registered
dynamically), its own login and consent pages walked through by Debian's chromium
(tests/servers/browser_login.mjs), a loopback redirect URI on an ephemeral port (RFC 8252 7.3)
and, as the protected resource, the gateway with an `auth:` section in front of the bundled
demo server (in this process, and as a process of its own). The authorization requests
here are made by hand, as an MCP client makes them (basic/authorization: PKCE S256,
`resource`); each login takes about 2 s.
"""

from __future__ import annotations

import secrets
import webbrowser
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import anyio
import anyio.to_thread
import jwt
import orjson
import pytest

from tests.support import BOUND, mirrored_headers, request
from tests.support.oidc import (
    LOGIN_BOUND,
    AuthServer,
    CodeClient,
    Pkce,
    Resource,
    browser_command,
    browser_login,
    free_ports,
    loopback_callback,
    protected_gateway,
    require_browser,
    start_protected_gateway,
)

pytestmark = pytest.mark.anyio

SCOPE = "mcp:tools"
PUBLIC = CodeClient("native-app")
CONFIDENTIAL = CodeClient("native-confidential", "confidential-secret")
POSTING = CodeClient("native-posting", "posting-secret", auth_method="client_secret_post")


@dataclass(frozen=True)
class Urls:
    in_process: str  # the resource URL of the gateway run in this process
    process: str  # ... and of the one run as a process of its own


@pytest.fixture(scope="module")
def urls() -> Urls:
    first, second = free_ports(2)
    return Urls(f"http://127.0.0.1:{first}/mcp", f"http://127.0.0.1:{second}/mcp")


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory, urls: Urls) -> Iterator[AuthServer]:
    require_browser()
    server = AuthServer(
        tmp_path_factory.mktemp("oidc"),
        clients=[],
        resources={urls.in_process: Resource(SCOPE), urls.process: Resource(SCOPE)},
        code_clients=[PUBLIC, CONFIDENTIAL, POSTING],
        registration=True,
        refresh_tokens="always",
    )
    with server.running():
        yield server


@pytest.fixture
async def gateway(auth_server: AuthServer, urls: Urls) -> AsyncIterator[str]:
    async with protected_gateway(auth_server, urls.in_process, [SCOPE]) as gw:
        assert gw.http_url is not None
        yield gw.http_url


@pytest.fixture(scope="module")
def gateway_process(
    tmp_path_factory: pytest.TempPathFactory, auth_server: AuthServer, urls: Urls
) -> Iterator[str]:
    proc = start_protected_gateway(
        tmp_path_factory.mktemp("gw"), auth_server, urls.process, [SCOPE]
    )
    try:
        yield urls.process
    finally:
        proc.stop()


async def tools_list(url: str, bearer: str) -> tuple[int, dict[str, Any]]:
    msg = request(1, "tools/list")
    headers = {**mirrored_headers(msg), "Authorization": f"Bearer {bearer}"}
    with anyio.fail_after(BOUND):
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=orjson.dumps(msg), headers=headers) as resp,
        ):
            assert resp.content_type == "application/json", resp.content_type
            body: dict[str, Any] = orjson.loads(await resp.read())
            return resp.status, body


def unverified(token: str) -> dict[str, Any]:
    """A JWT's claims, for reading what the server put there (the gateway checks signatures)."""
    out: dict[str, Any] = jwt.decode(token, options={"verify_signature": False})
    return out


async def login_for_code(
    server: AuthServer,
    client: CodeClient,
    resource: str,
    pkce: Pkce,
    open_browser: Callable[[str], Awaitable[None]],
) -> tuple[dict[str, str], str]:
    """One authorization request on a fresh loopback port, the browser sent to it by
    `open_browser`; the authorization response's parameters and the redirect URI used."""
    state = secrets.token_urlsafe(16)
    async with loopback_callback() as callback:
        url = server.authorization_url(
            client, callback.redirect_uri, pkce, scope=SCOPE, resource=resource, state=state
        )
        await open_browser(url)
        params = await callback.params()
    assert params["state"] == state
    # RFC 9207: the response names the server that issued it, so a client with several
    # authorization servers can tell a mix-up.
    assert params["iss"] == server.issuer
    return params, callback.redirect_uri


@pytest.mark.parametrize(
    "client", [PUBLIC, CONFIDENTIAL, POSTING], ids=["public", "secret_basic", "secret_post"]
)
async def test_a_browser_login_gives_a_code_that_opens_the_protected_gateway(
    auth_server: AuthServer, gateway: str, client: CodeClient
) -> None:
    """Authorization code with PKCE for a pre-registered native client, public or confidential
    (client_secret_basic, client_secret_post):
    the browser logs in and consents at the authorization server's own pages and is sent to the
    loopback redirect URI (registered without a port) with `code`, the client's `state` and
    the server's `iss`; the code and the verifier, with `resource`, buy a JWT access token for
    the gateway (`aud`) naming the user who logged in (`sub`), and tools/list with it is
    served."""
    pkce = Pkce.generate()

    async def alice(url: str) -> None:
        await browser_login(url, login="alice")

    params, redirect_uri = await login_for_code(auth_server, client, gateway, pkce, alice)
    assert "error" not in params, params
    status, tokens = await auth_server.code_token_response(
        client, params["code"], redirect_uri, pkce.verifier, gateway
    )
    assert status == 200, tokens
    assert tokens["token_type"] == "Bearer"
    assert SCOPE in tokens["scope"].split()
    assert tokens.get("refresh_token")
    access = unverified(tokens["access_token"])
    assert (access["sub"], access["aud"], access["client_id"]) == (
        "alice",
        gateway,
        client.client_id,
    )
    status, reply = await tools_list(gateway, tokens["access_token"])
    assert status == 200, reply
    assert reply["result"]["tools"], reply


async def test_webbrowser_with_the_browser_command_logs_in_a_registered_client_that_refreshes(
    auth_server: AuthServer, gateway_process: str
) -> None:
    """The path the gateway's client takes: a client registered dynamically (RFC 7591, native,
    public), the browser opened by Python's webbrowser with `browser_command()` as its
    BROWSER (same parsing: a command line with `%s`), from a worker thread since webbrowser
    waits for the command while the callback must be served. The refresh token (with
    `resource`) buys a new access token that works, and a new refresh token: a public client's
    is rotated."""
    client = await auth_server.register()
    pkce = Pkce.generate()
    browser = webbrowser.get(browser_command(login="bob"))

    async def bob(url: str) -> None:
        with anyio.fail_after(LOGIN_BOUND):
            assert await anyio.to_thread.run_sync(browser.open, url)

    params, redirect_uri = await login_for_code(auth_server, client, gateway_process, pkce, bob)
    status, tokens = await auth_server.code_token_response(
        client, params["code"], redirect_uri, pkce.verifier, gateway_process
    )
    assert status == 200, tokens
    assert unverified(tokens["access_token"])["sub"] == "bob"

    status, renewed = await auth_server.refresh_response(
        client, tokens["refresh_token"], gateway_process
    )
    assert status == 200, renewed
    assert renewed["access_token"] != tokens["access_token"]
    assert renewed["refresh_token"] != tokens["refresh_token"]
    assert unverified(renewed["access_token"])["aud"] == gateway_process
    status, reply = await tools_list(gateway_process, renewed["access_token"])
    assert status == 200, reply
    status, spent = await auth_server.refresh_response(
        client, tokens["refresh_token"], gateway_process
    )
    assert (status, spent["error"]) == (400, "invalid_grant")


async def test_a_cancelled_login_reaches_the_client_as_access_denied(
    auth_server: AuthServer, urls: Urls
) -> None:
    """The user who cancels at the login page: the browser still reaches the redirect URI, with
    error=access_denied, the state and `iss`, and no code."""
    pkce = Pkce.generate()

    async def cancel(url: str) -> None:
        await browser_login(url, cancel=True)

    params, _ = await login_for_code(auth_server, PUBLIC, urls.in_process, pkce, cancel)
    assert params["error"] == "access_denied"
    assert "code" not in params
