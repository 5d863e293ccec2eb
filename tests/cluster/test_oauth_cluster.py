"""Backend logins shared by replicas (`cluster.redis`): two `Gateway`s in this process with the
same config but their own ports, as a round-robin load balancer has behind it, a real
`redis-server` on a free loopback port, and the OAuth tests' authorization server and
protected backend (tests/support/oauth.py).

A per-user login link made by one replica is opened at the other, its redirects come back to
either, and the caller's token then serves both; the operator's login is one for the cluster;
a refresh by one replica serves the other, and replicas refreshing at once spend one refresh
token; a `state` is taken once across replicas; a link opened by someone else is refused; the
records in Redis hold no token, user or URL in clear, and a record sealed under a secret still
listed opens after a rotation; Redis stopped or stalled is a clear error, promptly.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import anyio
import pytest
import yaml
from click.testing import CliRunner
from redis.asyncio import Redis

from gateway.app import Gateway
from gateway.backend_auth.shared import PURPOSE
from gateway.backend_auth.store import Key
from gateway.cli import main
from gateway.cluster.logins import PREFIX, RedisLogins, token_key
from gateway.config import parse
from tests.backend_auth.test_oauth_client import call, grants, modern, post
from tests.support import BOUND, START_BOUND, Proc, until
from tests.support.oauth import Backend, TokenServer, protected_backend, token_server
from tests.support.oidc import free_ports
from tests.support.redis_server import launch, need_redis, redis_url

pytestmark = pytest.mark.anyio

SECRET = "oauth-cluster-secret-Vb7Np2Qx9Lk4Ws"
NEW_SECRET = "oauth-cluster-secret-next-Hy3Rm8Tc"
UNAVAILABLE = -31001


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's own file store, which a cluster must leave untouched."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    return tmp_path / "mcp-gateway"


def replica_config(
    port: int, resource: str, auth: TokenServer, backend: str, redis: int, *secrets: str
) -> str:
    return yaml.safe_dump(
        {
            "listen": {"http": {"host": "127.0.0.1", "port": port, "path": "/mcp"}},
            "backends": {
                "p": {
                    "http": {"url": backend},
                    "auth": {"type": "oauth", "per_user": True},
                    "connect_timeout": BOUND,
                }
            },
            # Every replica has the load balancer's address as its resource (and so its
            # links' and redirects' origin): here, the first replica's.
            "auth": {"issuer": auth.issuer, "resource": resource, "login_client_id": "gw-login"},
            "cluster": {"secrets": list(secrets or (SECRET,)), "redis": redis_url(redis)},
        }
    )


class Links(logging.Handler):
    """Every operator's login link the replicas log; `seen` once both replicas have."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.seen = anyio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "operator's login" in message:
            self.links.append(message.rsplit("open ", 1)[1])
            if len(self.links) == 2:
                self.seen.set()


@contextmanager
def operator_links() -> Iterator[Links]:
    links = Links()
    logger = logging.getLogger("gateway.backend_auth")
    logger.addHandler(links)
    try:
        yield links
    finally:
        logger.removeHandler(links)


@dataclass
class Cluster:
    auth: TokenServer
    backend: Backend
    redis: Proc
    redis_port: int
    ports: list[int]  # the replicas' (A, B)
    resource: str
    texts: list[str]  # the replicas' configs
    operator_links: list[str] = field(default_factory=list)

    def at(self, port: int) -> str:
        return f"http://127.0.0.1:{port}/mcp"


@asynccontextmanager
async def cluster(*secrets: str) -> AsyncIterator[Cluster]:
    need_redis()
    a, b, redis_port = free_ports(3)
    resource = f"http://127.0.0.1:{a}/mcp"
    redis = launch(redis_port)
    try:
        async with token_server() as auth, protected_backend(auth) as backend:
            texts = [
                replica_config(port, resource, auth, backend.url, redis_port, *secrets)
                for port in (a, b)
            ]
            with operator_links() as links:
                auth.login_as = "operator"
                async with Gateway(parse(texts[0])) as first, Gateway(parse(texts[1])) as second:
                    with anyio.fail_after(BOUND):
                        await links.seen.wait()
                    # One operator's login for the cluster: opened once, at the other replica
                    # (its redirect coming back to the first).
                    status, page, _ = await browse(links.links[0], [b, a])
                    assert status == 200 and "logged in" in page, page
                    # The backend's start waited for that login, and may have given up first:
                    # then its health tries again in the background (1 s, then doubling).
                    # (Health has no event to wait on: looked at every 10 ms, within the time a
                    # backend start may take.)
                    await until(
                        lambda: all(g.up for g in first.guarded + second.guarded),
                        within=START_BOUND,
                        every=0.01,
                    )
                    yield Cluster(
                        auth, backend, redis, redis_port, [a, b], resource, texts, links.links
                    )
    finally:
        redis.stop()


async def browse(url: str, replicas: list[int]) -> tuple[int, str, list[str]]:
    """A browser following redirects, where each visit to the gateway's login routes reaches
    the next replica of `replicas` (a round-robin load balancer's choice): the last status,
    its page, and the gateway URLs visited."""
    hops = iter(replicas)
    visited: list[str] = []
    with anyio.fail_after(BOUND):
        async with aiohttp.ClientSession() as session:
            while True:
                parts = urlsplit(url)
                if parts.path.startswith("/oauth/"):
                    url = urlunsplit(parts._replace(netloc=f"127.0.0.1:{next(hops)}"))
                    visited.append(url)
                async with session.get(url, allow_redirects=False) as resp:
                    if resp.status in (302, 303):
                        url = resp.headers["Location"]
                        continue
                    return resp.status, await resp.text(), visited


async def begin_only(link: str, port: int) -> int:
    """The first step of a link, at replica `port`: the redirect to the sign-in, not followed."""
    url = urlunsplit(urlsplit(link)._replace(netloc=f"127.0.0.1:{port}"))
    with anyio.fail_after(BOUND):
        async with (
            aiohttp.ClientSession() as session,
            session.get(url, allow_redirects=False) as resp,
        ):
            return resp.status


def retry_of(first: dict[str, Any], id_: int) -> dict[str, Any]:
    result = first["result"]
    retry = modern(call(id_=id_), True)
    retry["params"]["requestState"] = result["requestState"]
    retry["params"]["inputResponses"] = {k: {"action": "accept"} for k in result["inputRequests"]}
    return retry


def link_of(first: dict[str, Any]) -> str:
    (ask,) = first["result"]["inputRequests"].values()
    return str(ask["params"]["url"])


def callers(backend: Backend) -> list[str]:
    return [c["sub"] for c in backend.accepted if c["sub"] != "operator"]


async def raw_records(port: int) -> dict[str, bytes]:
    client = Redis.from_url(redis_url(port))
    try:
        found: dict[str, bytes] = {}
        async for name in client.scan_iter(match=PREFIX + "*"):
            value = await client.get(name)
            assert isinstance(value, bytes)
            found[name.decode()] = value
        return found
    finally:
        await client.aclose()


async def test_a_link_made_at_one_replica_completes_across_both_and_serves_both(
    state: Path,
) -> None:
    async with cluster() as c:
        a, b = c.ports
        # Both replicas waited for the operator's login, and logged the same link.
        assert len(set(c.operator_links)) == 1 and len(c.operator_links) == 2
        alice = c.auth.mint("alice", c.resource, "mcp:call")
        first = await post(c.at(a), modern(call(), True), alice)
        assert first["result"]["resultType"] == "input_required"
        # Asking at the other replica while the link is open gives the same link.
        again = await post(c.at(b), modern(call(id_=2), True), alice)
        assert link_of(again) == link_of(first)
        c.auth.login_as = "alice"
        # Opened at B, the sign-in's redirect reaching A, the backend login's reaching B.
        status, page, visited = await browse(link_of(first), [b, a, b])
        assert status == 200 and "logged in" in page, page
        assert [urlsplit(u).port for u in visited] == [b, a, b]
        # A state is taken once, wherever it comes back: replayed at the other replica, refused.
        replayed, _, _ = await browse(visited[-1], [a])
        assert replayed == 400
        assert (await browse(visited[1], [b]))[0] == 400
        # The link is spent on every replica.
        assert (await browse(link_of(first), [a]))[0] == 404
        # The caller's retry at B goes through with Alice's token, and so does a call at A.
        done = await post(c.at(b), retry_of(first, 3), alice)
        assert "content" in done["result"], done
        assert "content" in (await post(c.at(a), modern(call(id_=4), True), alice))["result"]
        assert callers(c.backend) == ["alice", "alice"]
        # One backend login each for the operator and Alice, one registration for the cluster.
        logins = [g for g in grants(c.auth, "authorization_code") if g["resource"] == c.backend.url]
        assert len(logins) == 2 and len(c.auth.registrations) == 1
        # Redis holds digests and ciphertexts: no token, refresh token, user or URL in clear.
        records = await raw_records(c.redis_port)
        assert any(":token:" in name for name in records)
        secrets = [*c.backend.tokens, "refresh:alice", "refresh:operator", alice]
        for name, value in records.items():
            assert value.startswith(b"\x01"), name
            for clear in [*secrets, "alice", "operator", c.backend.url, "gw-login"]:
                assert clear.encode() not in value and clear not in name
    assert not state.exists()  # noqa: ASYNC240 (the file store was never written)


async def test_a_link_opened_by_someone_else_at_another_replica_is_refused() -> None:
    async with cluster() as c:
        a, b = c.ports
        alice = c.auth.mint("alice", c.resource, "mcp:call")
        first = await post(c.at(a), modern(call(), True), alice)
        # Opened again and again, on both replicas: one flow at a time, none piling up.
        for port in (a, b, a, b):
            assert await begin_only(link_of(first), port) == 302
        flows = [n for n in await raw_records(c.redis_port) if ":flow:" in n]
        assert len(flows) == 1
        c.auth.login_as = "bob"
        status, _, _ = await browse(link_of(first), [b, a])
        assert status == 403
        assert (await browse(link_of(first), [b]))[0] == 404
        later = await post(c.at(b), modern(call(id_=2), True), alice)
        assert later["result"]["resultType"] == "input_required"
        assert link_of(later) != link_of(first)
        assert callers(c.backend) == []


async def test_a_refresh_by_one_replica_serves_the_other_and_replicas_refresh_once() -> None:
    async with cluster() as c:
        a, b = c.ports
        alice = c.auth.mint("alice", c.resource, "mcp:call")
        first = await post(c.at(a), modern(call(), True), alice)
        c.auth.login_as = "alice"
        assert (await browse(link_of(first), [a, b, a]))[0] == 200
        for port in (a, b):  # both replicas hold Alice's token now
            assert "content" in (await post(c.at(port), modern(call(), True), alice))["result"]
        held = c.backend.tokens[-1]
        # The backend refuses it: A refreshes, and B, refused the same token, takes A's.
        c.backend.revoked.add(held)
        assert "content" in (await post(c.at(a), modern(call(), True), alice))["result"]
        assert "content" in (await post(c.at(b), modern(call(), True), alice))["result"]
        assert len(grants(c.auth, "refresh_token")) == 1
        used = [claims["jti"] for claims in c.backend.accepted if claims["sub"] == "alice"]
        assert used[-1] == used[-2] != used[-3]  # A's refreshed token, then at B the same
        # Both replicas refused at once, with many requests each: one refresh for all.
        c.backend.revoked.add(c.backend.tokens[-1])
        replies: list[dict[str, Any]] = []

        async def one(port: int, i: int) -> None:
            replies.append(await post(c.at(port), modern(call(id_=i), True), alice))

        async with anyio.create_task_group() as tg:
            for i in range(10):
                tg.start_soon(one, (a, b)[i % 2], i)
        assert all("content" in r["result"] for r in replies), replies
        assert len(grants(c.auth, "refresh_token")) == 2


async def test_auth_logout_with_the_cluster_s_config_forgets_the_shared_logins(
    tmp_path: Path,
) -> None:
    async with cluster() as c:
        a, b = c.ports
        alice = c.auth.mint("alice", c.resource, "mcp:call")
        first = await post(c.at(a), modern(call(), True), alice)
        c.auth.login_as = "alice"
        assert (await browse(link_of(first), [b, a, b]))[0] == 200
        assert "content" in (await post(c.at(b), modern(call(), True), alice))["result"]
        config = tmp_path / "gateway.yaml"
        config.write_text(c.texts[0])
        args = ["auth", "logout", "p", "--config", str(config)]
        # (a thread: the command runs an event loop of its own)
        out = await anyio.to_thread.run_sync(CliRunner().invoke, main, args)
        assert out.exit_code == 0 and "removed 2 stored login(s)" in out.output, out.output
        # The operator's login and Alice's: nothing of either is left in Redis.
        assert not [n for n in await raw_records(c.redis_port) if ":token:" in n]
        # A replica still holding Alice's token uses it until it is refused; then it does
        # not bring the login back with its copy of the refresh token: Alice logs in again.
        c.backend.revoked.add(c.backend.tokens[-1])
        again = await post(c.at(b), modern(call(id_=2), True), alice)
        assert again["result"]["resultType"] == "input_required"
        assert not grants(c.auth, "refresh_token")


async def test_redis_stopped_or_stalled_is_a_clear_error_promptly() -> None:
    async with cluster() as c:
        a, b = c.ports
        alice = c.auth.mint("alice", c.resource, "mcp:call")
        first = await post(c.at(a), modern(call(), True), alice)
        link = link_of(first)
        os.kill(c.redis.popen.pid, signal.SIGSTOP)  # accepts nothing, answers nothing
        try:
            began = anyio.current_time()
            stalled = await post(c.at(b), modern(call(id_=2), True), alice)
            assert stalled["error"]["code"] == UNAVAILABLE
            assert "Redis" in stalled["error"]["message"]
            assert anyio.current_time() - began < 1.0 + 1.0  # the store's bound, and slack
        finally:
            os.kill(c.redis.popen.pid, signal.SIGCONT)
        c.redis.stop()
        began = anyio.current_time()
        stopped = await post(c.at(a), modern(call(id_=3), True), alice)
        assert stopped["error"]["code"] == UNAVAILABLE
        assert "Redis" in stopped["error"]["message"]
        status, page, _ = await browse(link, [b])
        assert status == 503 and "unavailable" in page
        assert anyio.current_time() - began < 1.0


async def test_records_sealed_under_a_secret_still_listed_open_after_a_rotation() -> None:
    need_redis()
    (port,) = free_ports(1)
    redis = launch(port)

    def store(*secrets: str) -> RedisLogins:
        text = yaml.safe_dump(
            {
                "listen": {"http": {"host": "127.0.0.1", "port": 0}},
                "backends": {"b": {"http": {"url": "https://b.example.com/mcp"}}},
                "cluster": {"secrets": list(secrets), "redis": redis_url(port)},
            }
        )
        cluster = parse(text).cluster
        assert cluster is not None
        return RedisLogins(redis_url(port), cluster.keys(PURPOSE), 1.0)

    key = Key("https://b.example.com/mcp", "oauth:registered", "alice-digest")
    record = {"token": {"access_token": "the-access-token", "refresh_token": "the-refresh"}}
    old, rotated, new_only = store(SECRET), store(NEW_SECRET, SECRET), store(NEW_SECRET)
    try:
        await old.save(key, record)
        assert (await rotated.load(key) or {})["token"] == record["token"]
        assert await new_only.load(key) is None  # a secret no longer listed opens nothing
        # Sealed again by the rotated replica, under the new secret: the old one still opens
        # it while it lists that secret second... and a replica with the old secret alone not.
        await rotated.save(key, record)
        assert (await new_only.load(key) or {})["token"] == record["token"]
        assert await old.load(key) is None
        # A record moved under another key (someone else's) does not open there.
        raw = Redis.from_url(redis_url(port))
        try:
            other = Key(key.resource, key.client, "mallory-digest")
            value = await raw.get(token_key(key))
            assert value is not None and b"the-access-token" not in value
            await raw.set(token_key(other), value)
        finally:
            await raw.aclose()
        assert await rotated.load(other) is None
    finally:
        for s in (old, rotated, new_only):
            await s.close()
        redis.stop()
