"""The gateway logging in to protected backends (basic/authorization, the client's half), end to
end on 127.0.0.1: the gateway in-process, a small authorization server of the test and a
protected MCP backend (tests/support/oauth.py) that accepts only tokens issued for it.

Service accounts (client credentials), token exchange for each caller (RFC 8693: the caller's
own token never reaches the backend), step-up on 403 `insufficient_scope`, a bounded number of
attempts against a server that refuses every token, one renewal for many concurrent requests,
the token store across restarts, and the SSRF rule for URLs a server names."""

from __future__ import annotations

import asyncio
import logging
import stat
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import httpx2
import orjson
import pytest
import yaml
from aiohttp import web
from mcp import Client
from mcp.client.context import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp_types import ElicitRequestParams, ElicitRequestURLParams, ElicitResult, TextContent

from gateway.app import Gateway
from gateway.backend_auth.authorizer import Authorizer
from gateway.backend_auth.failures import AuthFailed
from gateway.backend_auth.fetch import FetchFailed, OAuthHttp
from gateway.backend_auth.redirect import RedirectListener
from gateway.backend_auth.seam import GATEWAY
from gateway.backend_auth.state import Opener
from gateway.backend_auth.store import TokenStore
from gateway.config import BackendAuth, ConfigInvalid, parse
from tests.support import BOUND
from tests.support.auth import VERSION, serving
from tests.support.oauth import (
    CLIENT_ID,
    CLIENT_SECRET,
    EXCHANGE,
    Backend,
    TokenServer,
    protected_backend,
    token_server,
)
from tests.support.oidc import free_ports

pytestmark = pytest.mark.anyio

UNAVAILABLE = -31001
GATEWAY_RESOURCE = "http://gateway.test/mcp"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's own token store (never the user's)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    return tmp_path / "mcp-gateway"


def config(backend: str, login: dict[str, Any], **top: Any) -> str:
    return yaml.safe_dump(
        {
            "listen": {"http": {"host": "127.0.0.1", "port": 0, "path": "/mcp"}},
            "backends": {"p": {"http": {"url": backend}, "auth": login, "connect_timeout": 5}},
            **top,
        }
    )


CREDENTIALS = {"type": "client_credentials", "client_id": CLIENT_ID, "client_secret": CLIENT_SECRET}


def call(tool: str = "whoami", id_: int = 1) -> dict[str, Any]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    params = {"name": tool, "arguments": {}, "_meta": meta}
    return {"jsonrpc": "2.0", "id": id_, "method": "tools/call", "params": params}


async def post(url: str, body: dict[str, Any], token: str | None = None) -> dict[str, Any]:
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": VERSION,
        "Mcp-Method": body["method"],
    }
    if body["method"] == "tools/call":
        headers["Mcp-Name"] = body["params"]["name"]
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    with anyio.fail_after(BOUND * 2):
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=orjson.dumps(body), headers=headers) as resp,
        ):
            reply: dict[str, Any] = orjson.loads(await resp.read())
            return reply


def grants(auth: TokenServer, kind: str) -> list[dict[str, str]]:
    return [g for g in auth.grants if g.get("grant_type") == kind]


@pytest.fixture
async def service() -> AsyncIterator[tuple[TokenServer, Any]]:
    async with token_server() as auth, protected_backend(auth) as backend:
        yield auth, backend


async def test_a_service_account_token_reaches_the_backend_and_is_kept(
    service: tuple[TokenServer, Any], state: Path
) -> None:
    auth, backend = service
    async with Gateway(parse(config(backend.url, CREDENTIALS))) as gw:
        assert gw.http_url is not None
        reply = await post(gw.http_url, call())
        assert "result" in reply, reply
        counted = gw.telemetry.stats.backend_tokens
        assert counted == {("p", "client_credentials", "ok"): 1}
    # One token for the probe, the catalog and the call, issued for this backend only.
    assert len(grants(auth, "client_credentials")) == 1
    assert grants(auth, "client_credentials")[0]["resource"] == backend.url
    assert backend.accepted and {c["aud"] for c in backend.accepted} == {backend.url}
    files = list(state.iterdir())  # noqa: ASYNC240 (a test's look at a small directory)
    assert len(files) == 1 and stat.S_IMODE(files[0].stat().st_mode) == 0o600
    # A restart takes the stored token: no new grant.
    async with Gateway(parse(config(backend.url, CREDENTIALS))) as gw:
        assert gw.http_url is not None
        assert "result" in await post(gw.http_url, call())
    assert len(grants(auth, "client_credentials")) == 1


async def test_without_the_store_nothing_is_written(
    service: tuple[TokenServer, Any], state: Path
) -> None:
    _, backend = service
    async with Gateway(parse(config(backend.url, {**CREDENTIALS, "store": False}))) as gw:
        assert gw.http_url is not None
        assert "result" in await post(gw.http_url, call())
    assert not state.exists()  # noqa: ASYNC240


async def test_a_403_insufficient_scope_steps_up_with_the_challenged_scope() -> None:
    async with token_server() as auth, protected_backend(auth, call_scope="mcp:write") as backend:
        async with Gateway(parse(config(backend.url, CREDENTIALS))) as gw:
            assert gw.http_url is not None
            reply = await post(gw.http_url, call())
            assert "result" in reply, reply
        assert backend.refused[403] == 1
        asked = grants(auth, "client_credentials")
        assert len(asked) == 2 and "mcp:write" in asked[1]["scope"].split()


async def test_a_server_that_refuses_every_token_costs_a_bounded_number_of_grants() -> None:
    async with token_server() as auth, protected_backend(auth) as backend:
        text = config(backend.url, {**CREDENTIALS, "max_attempts": 2})
        async with Gateway(parse(text)) as gw:
            assert gw.http_url is not None
            assert "result" in await post(gw.http_url, call())
            backend.refuse_all = True
            before, refused = len(auth.grants), backend.refused[401]
            reply = await post(gw.http_url, call(id_=2))
            assert reply["error"]["code"] == UNAVAILABLE
            assert gw.telemetry.stats.backend_tokens["p", "client_credentials", "ok"] == 3
            # The token it had, then two new ones, each refused once: no loop.
            assert len(auth.grants) - before == 2
            assert backend.refused[401] - refused == 3


async def test_one_renewal_serves_many_concurrent_requests() -> None:
    async with token_server() as auth, protected_backend(auth) as backend:
        async with Gateway(parse(config(backend.url, CREDENTIALS))) as gw:
            assert gw.http_url is not None
            url = gw.http_url
            replies: list[dict[str, Any]] = []

            async def one(i: int) -> None:
                replies.append(await post(url, call(id_=i)))

            async with anyio.create_task_group() as tg:
                for i in range(20):
                    tg.start_soon(one, i)
        assert all("result" in r for r in replies)
        assert len(grants(auth, "client_credentials")) == 1


async def test_an_authorization_server_on_plain_http_elsewhere_is_never_asked() -> None:
    # The PRM names an http:// authorization server off loopback: not fetched (SSRF, and
    # basic/authorization's Communication Security), so the backend cannot be logged in to.
    async with (
        token_server() as auth,
        protected_backend(auth, servers=["http://auth.example.invalid"]) as backend,
    ):
        async with Gateway(parse(config(backend.url, CREDENTIALS))) as gw:
            assert gw.http_url is not None
            reply = await post(gw.http_url, call())
            assert reply["error"]["code"] == UNAVAILABLE
            assert "backend 'p'" in reply["error"]["message"]
        assert not auth.grants and not backend.accepted


# --- token exchange ---------------------------------------------------------------------------


def exchange_config(auth: TokenServer, backend: str) -> str:
    exchange = {
        "type": "token_exchange",
        "client_id": CLIENT_ID,
        "client_secret": CLIENT_SECRET,
        "authorization_server": auth.issuer,
    }
    listener_auth = {"issuer": auth.issuer, "resource": GATEWAY_RESOURCE}
    return config(backend, exchange, auth=listener_auth)


async def test_each_caller_s_token_is_exchanged_once_and_never_passed_through() -> None:
    async with token_server() as auth, protected_backend(auth) as backend:
        alice = auth.mint("alice", GATEWAY_RESOURCE, "mcp:call")
        bob = auth.mint("bob", GATEWAY_RESOURCE, "mcp:call")
        async with Gateway(parse(exchange_config(auth, backend.url))) as gw:
            assert gw.http_url is not None
            for token in (alice, alice, bob):
                reply = await post(gw.http_url, call(), token)
                assert "result" in reply, reply
        exchanged = grants(auth, EXCHANGE)
        # Cached per subject until it expires: alice's second call exchanges nothing.
        assert [g["subject_token"] for g in exchanged] == [alice, bob]
        assert all(g["resource"] == backend.url for g in exchanged)
        calls = [c for c in backend.accepted if c["sub"] in ("alice", "bob")]
        assert [c["sub"] for c in calls] == ["alice", "alice", "bob"]
        # The callers' own tokens (for the gateway) never reached the backend.
        assert alice not in backend.tokens and bob not in backend.tokens


async def test_the_gateway_s_own_requests_go_as_its_client_under_token_exchange() -> None:
    async with token_server() as auth, protected_backend(auth) as backend:
        async with Gateway(parse(exchange_config(auth, backend.url))) as gw:
            assert gw.http_url is not None
            token = auth.mint("alice", GATEWAY_RESOURCE, "mcp:call")
            assert "result" in await post(gw.http_url, call(), token)
        # The probe and the catalog: as the gateway's client, never as a caller.
        own = [c for c in backend.accepted if c["sub"] == CLIENT_ID]
        assert own and len(grants(auth, "client_credentials")) == 1


# --- per-user logins --------------------------------------------------------------------------


def modern(body: dict[str, Any], url_elicitation: bool) -> dict[str, Any]:
    caps: dict[str, Any] = {"elicitation": {"form": {}, "url": {}}} if url_elicitation else {}
    body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] = caps
    return body


async def open_link(url: str) -> tuple[int, str]:
    """What a browser does with a login link: follow the redirects (the test authorization
    server approves at once) to the gateway's callback page."""
    with anyio.fail_after(BOUND):
        async with aiohttp.ClientSession() as session, session.get(url) as resp:
            return resp.status, await resp.text()


class LinkWatch(logging.Handler):
    """The first login link the gateway logs (by default the operator's), as an event."""

    def __init__(self, said: str = "operator's login") -> None:
        super().__init__()
        self.said = said
        self.seen = asyncio.Event()
        self.link = ""

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if self.said in message and not self.seen.is_set():
            self.link = message.rsplit("open ", 1)[1]
            self.seen.set()


@contextmanager
def watching(said: str = "operator's login") -> Iterator[LinkWatch]:
    watch = LinkWatch(said)
    logger = logging.getLogger("gateway.backend_auth")
    logger.addHandler(watch)
    try:
        yield watch
    finally:
        logger.removeHandler(watch)


async def operator_login(watch: LinkWatch) -> None:
    """The gateway's own login (its catalog), whose link it logs for the operator."""
    with anyio.fail_after(BOUND):
        await watch.seen.wait()
    assert (await open_link(watch.link))[0] == 200


def per_user_config(port: int, auth: TokenServer, backend: str) -> str:
    return yaml.safe_dump(
        {
            "listen": {"http": {"host": "127.0.0.1", "port": port, "path": "/mcp"}},
            "backends": {
                "p": {"http": {"url": backend}, "auth": {"type": "oauth", "per_user": True}}
            },
            "auth": {
                "issuer": auth.issuer,
                "resource": f"http://127.0.0.1:{port}/mcp",
                "login_client_id": "gateway-login",
            },
        }
    )


async def test_each_caller_logs_in_through_a_link_and_only_their_token_is_sent() -> None:
    (port,) = free_ports(1)
    resource = f"http://127.0.0.1:{port}/mcp"
    async with token_server() as auth, protected_backend(auth) as backend:
        alice = auth.mint("alice", resource, "mcp:call")
        bob = auth.mint("bob", resource, "mcp:call")
        with watching() as watch:
            auth.login_as = "operator"
            async with Gateway(parse(per_user_config(port, auth, backend.url))) as gw:
                assert gw.http_url == resource
                await operator_login(watch)
                await alice_and_bob(auth, resource, alice, bob)
        calls = [c for c in backend.accepted if c["sub"] in ("alice", "bob")]
        assert [c["sub"] for c in calls] == ["alice"]
        # The operator's token served discovery and lists only; no caller's token crossed.
        assert alice not in backend.tokens and bob not in backend.tokens
        registered = auth.registrations[0]["redirect_uris"]
        assert registered == [f"http://127.0.0.1:{port}/oauth/callback"]
        # Alice signed in at the listener's issuer first, as the gateway's login client.
        signed_in = [g for g in grants(auth, "authorization_code") if g["resource"] == resource]
        assert [g["client_id"] for g in signed_in] == ["gateway-login"]


async def alice_and_bob(auth: TokenServer, resource: str, alice: str, bob: str) -> None:
    # Alice has no login yet: she is sent a link, by URL-mode elicitation.
    first = await post(resource, modern(call(), True), alice)
    result = first["result"]
    assert result["resultType"] == "input_required"
    (ask,) = result["inputRequests"].values()
    assert ask["method"] == "elicitation/create" and ask["params"]["mode"] == "url"
    auth.login_as = "alice"
    status, page = await open_link(ask["params"]["url"])
    assert status == 200 and "logged in" in page
    # A link is good for one login.
    assert (await open_link(ask["params"]["url"]))[0] == 404
    retry = modern(call(id_=2), True)
    retry["params"]["requestState"] = result["requestState"]
    retry["params"]["inputResponses"] = {k: {"action": "accept"} for k in result["inputRequests"]}
    done = await post(resource, retry, alice)
    assert "content" in done["result"], done
    # Bob has none: a client that cannot open URLs gets -32042 with his own link.
    refused = await post(resource, modern(call(id_=3), False), bob)
    assert refused["error"]["code"] == -32042
    link = refused["error"]["data"]["elicitations"][0]["url"]
    assert link != ask["params"]["url"]
    # Lists are the gateway's own requests: Bob sees the tools before he logs in.
    listing = {
        **call(id_=4),
        "method": "tools/list",
        "params": {"_meta": call()["params"]["_meta"]},
    }
    assert "tools" in (await post(resource, listing, bob))["result"]


async def test_a_link_opened_by_someone_else_binds_nothing() -> None:
    # client/elicitation, Phishing: Alice's link, opened by Bob, gives Alice nothing of Bob's.
    (port,) = free_ports(1)
    resource = f"http://127.0.0.1:{port}/mcp"
    async with token_server() as auth, protected_backend(auth) as backend:
        alice = auth.mint("alice", resource, "mcp:call")
        with watching() as watch:
            auth.login_as = "operator"
            async with Gateway(parse(per_user_config(port, auth, backend.url))):
                await operator_login(watch)
                first = (await post(resource, modern(call(), True), alice))["result"]
                (ask,) = first["inputRequests"].values()
                auth.login_as = "bob"
                assert (await open_link(ask["params"]["url"]))[0] == 403
                # The link is spent; Alice is still asked to log in, with a new link.
                assert (await open_link(ask["params"]["url"]))[0] == 404
                again = (await post(resource, modern(call(id_=2), True), alice))["result"]
                assert again["resultType"] == "input_required"
                (ask_again,) = again["inputRequests"].values()
                assert ask_again["params"]["url"] != ask["params"]["url"]
        # Bob's sign-in reached the check only: no backend login was redeemed for anyone.
        backend_logins = [
            g for g in grants(auth, "authorization_code") if g["resource"] == backend.url
        ]
        assert len(backend_logins) == 1  # the operator's
        assert not [c for c in backend.accepted if c["sub"] in ("alice", "bob")]


async def test_a_forged_callback_or_an_unknown_link_changes_nothing() -> None:
    (port,) = free_ports(1)
    async with token_server() as auth, protected_backend(auth) as backend:
        async with Gateway(parse(per_user_config(port, auth, backend.url))):
            forged = f"http://127.0.0.1:{port}/oauth/callback?code=x&state=forged&iss={auth.issuer}"
            assert (await open_link(forged))[0] == 400
            assert (await open_link(f"http://127.0.0.1:{port}/oauth/login?id=nope"))[0] == 404
            async with (
                aiohttp.ClientSession() as session,
                session.post(f"http://127.0.0.1:{port}/oauth/callback") as resp,
            ):
                assert resp.status == 405
                assert resp.headers["Cache-Control"] == "no-store"
                assert resp.headers["Referrer-Policy"] == "no-referrer"
        assert not grants(auth, "authorization_code")


def test_per_user_needs_the_listener_s_identities() -> None:
    text = config("https://b.example.com/mcp", {"type": "oauth", "per_user": True})
    with pytest.raises(ConfigInvalid) as refused:
        parse(text)
    assert any("per_user" in p for p in refused.value.problems)


# --- the login in the browser -----------------------------------------------------------------


@asynccontextmanager
async def direct_authorizer(
    backend: Backend, state: Path, wait_bound: float = BOUND, opener: Opener | None = None
) -> AsyncIterator[Authorizer]:
    """The authorizer of an `oauth` backend on its own (no gateway around it), so a test can
    hand it the backend's refusal and watch what it does."""
    extra: dict[str, Opener] = {"opener": opener} if opener is not None else {}
    authorizer = Authorizer(
        "p",
        backend.url,
        BackendAuth(type="oauth"),
        OAuthHttp(5.0, 65536, "test"),
        TokenStore(state),
        wait_bound=wait_bound,
        **extra,
    )
    try:
        yield authorizer
    finally:
        await authorizer.close()


async def test_a_refused_login_is_not_offered_again_at_once(state: Path) -> None:
    async with token_server(deny=True) as auth, protected_backend(auth) as backend:
        opened: list[str] = []

        async def browser(url: str) -> None:
            opened.append(url)
            await open_link(url)

        challenge = [backend.challenge()]
        async with direct_authorizer(backend, state, opener=browser) as authorizer:
            with pytest.raises(AuthFailed):
                await authorizer.refused(GATEWAY, 401, challenge, None)
            with pytest.raises(AuthFailed):
                await authorizer.refused(GATEWAY, 401, challenge, None)
        assert len(opened) == 1 and len(auth.authorizations) == 1
        assert not grants(auth, "authorization_code")


async def test_a_request_waits_for_a_login_only_so_long_and_the_login_goes_on(
    state: Path,
) -> None:
    async with token_server() as auth, protected_backend(auth) as backend:
        opened: list[str] = []
        shown = asyncio.Event()

        async def browser(url: str) -> None:  # a person who has not looked yet
            opened.append(url)
            shown.set()

        challenge = [backend.challenge()]
        async with direct_authorizer(backend, state, 0.2, browser) as authorizer:
            with pytest.raises(AuthFailed) as waited:
                await authorizer.refused(GATEWAY, 401, challenge, None)
            assert "needs a login" in str(waited.value)
            # A second request joins the same login rather than starting another.
            with pytest.raises(AuthFailed):
                await authorizer.refused(GATEWAY, 401, challenge, None)
            with anyio.fail_after(BOUND):
                await shown.wait()
            assert len(opened) == 1 and len(auth.registrations) == 1
            # The person logs in later: the next request has its token.
            assert (await open_link(opened[0]))[0] == 200
            # (A refusal now joins the login while it finishes its exchange, or finds its token.)
            await authorizer.refused(GATEWAY, 401, challenge, None)
            header = await authorizer.authorization(GATEWAY)
            assert header is not None and header.startswith("Bearer ")
        assert len(auth.authorizations) == 1


async def test_a_redirect_from_a_metadata_url_is_not_followed() -> None:
    asked: list[str] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        asked.append(request.path)
        if request.path == "/elsewhere":
            return web.json_response({"issuer": "x"})
        raise web.HTTPFound("/elsewhere")

    async with serving(handle) as origin:
        http = OAuthHttp(5.0, 65536, "test")
        try:
            reply = await http.get(origin + "/.well-known/oauth-authorization-server")
            with pytest.raises(FetchFailed):
                await http.get("http://example.com/.well-known/oauth-authorization-server")
        finally:
            await http.close()
    assert reply.status == 302 and asked == ["/.well-known/oauth-authorization-server"]


async def test_a_pinned_authorization_server_is_the_only_one_asked() -> None:
    # The backend names another server: the gateway's credentials never go there.
    async with token_server() as auth, token_server() as other:
        async with protected_backend(auth, servers=[other.issuer]) as backend:
            pinned = {**CREDENTIALS, "authorization_server": auth.issuer}
            async with Gateway(parse(config(backend.url, pinned))) as gw:
                assert gw.http_url is not None
                reply = await post(gw.http_url, call())
                assert reply["error"]["code"] == UNAVAILABLE
        assert not other.asked and not auth.grants


def test_token_exchange_needs_a_pinned_server_and_the_listener_s_identities() -> None:
    exchange = {"type": "token_exchange", "client_id": "c", "client_secret": "s"}
    with pytest.raises(ConfigInvalid) as refused:
        parse(config("https://b.example.com/mcp", exchange))
    problems = " ".join(refused.value.problems)
    assert "authorization_server" in problems and "auth.type" in problems


async def test_a_login_slower_than_the_probe_leaves_the_era_undecided() -> None:
    # End to end: a login that outlasts connect_timeout fails the first requests (-31001) and
    # then completes, and the modern server is spoken to in its era (no `initialize` is ever
    # accepted). The probe's own rule, that such a refusal teaches it nothing, is pinned by
    # test_oauth_parts.py::test_a_login_still_needed_teaches_the_era_probe_nothing.
    async with token_server() as auth, protected_backend(auth) as backend:
        login = {"type": "oauth", "open_browser": False}
        text = yaml.safe_dump(
            {
                "listen": {"http": {"host": "127.0.0.1", "port": 0, "path": "/mcp"}},
                "backends": {
                    "p": {"http": {"url": backend.url}, "auth": login, "connect_timeout": 0.3}
                },
            }
        )
        with watching("needs a login") as watch:
            async with Gateway(parse(text)) as gw:
                assert gw.http_url is not None
                with anyio.fail_after(BOUND):
                    await watch.seen.wait()
                early = await post(gw.http_url, call())
                assert early["error"]["code"] == UNAVAILABLE
                assert (await open_link(watch.link))[0] == 200
                later = await post(gw.http_url, call(id_=2))
                assert "content" in later["result"], later
        assert "initialize" not in backend.methods and "tools/call" in backend.methods


async def test_a_document_past_the_size_bound_is_refused() -> None:
    async def handle(request: web.Request) -> web.StreamResponse:
        return web.json_response({"issuer": "x" * 4096})

    async with serving(handle) as origin:
        http = OAuthHttp(5.0, 1024, "test")
        try:
            with pytest.raises(FetchFailed):
                await http.get(origin + "/.well-known/oauth-authorization-server")
        finally:
            await http.close()


async def test_the_redirect_listener_answers_only_its_own_state() -> None:
    listener = RedirectListener("the-state")
    uri = await listener.start(0)
    try:
        assert (await open_link(uri + "?code=c&state=other"))[0] == 404
        assert (await open_link(uri.replace("/callback", "/x") + "?state=the-state"))[0] == 404
        assert (await open_link(uri + "?code=c&state=the-state"))[0] == 200
        with anyio.fail_after(BOUND):
            assert (await listener.wait())["code"] == "c"
    finally:
        await listener.close()


async def test_no_login_with_a_server_that_does_not_advertise_s256(state: Path) -> None:
    class NoPkce(TokenServer):
        def metadata(self) -> dict[str, Any]:
            return {
                k: v
                for k, v in super().metadata().items()
                if k != "code_challenge_methods_supported"
            }

    server = NoPkce()
    async with serving(server.handle) as url:
        server.url = url
        async with (
            protected_backend(server) as backend,
            direct_authorizer(backend, state) as authorizer,
        ):
            with pytest.raises(AuthFailed):
                await authorizer.refused(GATEWAY, 401, [backend.challenge()], None)
    assert not server.authorizations and not server.registrations


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_the_sdk_client_is_sent_the_link_and_its_retry_goes_through(mode: str) -> None:
    # The official SDK client, modern (input_required, retried with the gateway's
    # requestState) and legacy (an elicitation/create request on its session): its URL-mode
    # elicitation handler opens the link, and the call it made goes through with Alice's token.
    (port,) = free_ports(1)
    resource = f"http://127.0.0.1:{port}/mcp"
    asked: list[str] = []

    async def on_elicit(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        assert isinstance(params, ElicitRequestURLParams)
        asked.append(params.url)
        assert (await open_link(params.url))[0] == 200
        return ElicitResult(action="accept")

    async with token_server() as auth, protected_backend(auth) as backend:
        alice = auth.mint("alice", resource, "mcp:call")
        with watching() as watch:
            auth.login_as = "operator"
            async with Gateway(parse(per_user_config(port, auth, backend.url))):
                await operator_login(watch)
                auth.login_as = "alice"
                with anyio.fail_after(BOUND * 2):
                    async with (
                        httpx2.AsyncClient(headers={"Authorization": f"Bearer {alice}"}) as http,
                        Client(
                            streamable_http_client(resource, http_client=http),
                            mode=mode,
                            elicitation_callback=on_elicit,
                        ) as client,
                    ):
                        result = await client.call_tool("whoami", {})
        assert isinstance(result.content[0], TextContent) and result.content[0].text == "ok"
        assert len(asked) == 1
        assert [c["sub"] for c in backend.accepted if c["sub"] != "operator"] == ["alice"]


async def test_a_refused_grant_is_an_error_and_a_count(service: tuple[TokenServer, Any]) -> None:
    _, backend = service
    wrong = {**CREDENTIALS, "client_secret": "not-it"}
    async with Gateway(parse(config(backend.url, wrong))) as gw:
        assert gw.http_url is not None
        reply = await post(gw.http_url, call())
        assert reply["error"]["code"] == UNAVAILABLE
        assert gw.telemetry.stats.backend_tokens["p", "client_credentials", "refused"] >= 1
        assert not gw.telemetry.stats.backend_tokens["p", "client_credentials", "ok"]
    assert not backend.accepted
