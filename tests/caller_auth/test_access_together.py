"""Authentication, policy, rate limits and the audit log together on one HTTP listener: the
identity a bearer token establishes is what each of the others reads (basic/authorization,
Access Token Usage; Scope Selection Strategy for the step-up challenge).

Two API keys stand for two callers, so no authorization server is needed here (the tests against
a real one are in test_auth_oidc.py); the backend is the bundled demo server over stdio."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import orjson
import pytest
import yaml

from gateway.app import Gateway
from gateway.config import parse
from gateway.protocol import codes
from tests.support import BOUND, DEMO_STDIO, START_BOUND, call, mirrored_headers

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

RESOURCE = "http://127.0.0.1/mcp"
ALICE = "alice-key-0123456789"
BOB = "bob-key-9876543210"
ALICE_BURST = 5


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def config(audit: Path) -> str:
    return yaml.safe_dump(
        {
            "listen": {"http": {"host": "127.0.0.1", "port": 0}},
            "backends": {"demo": DEMO_STDIO},
            "auth": {
                "resource": RESOURCE,
                "api_keys": [
                    {"name": "alice-laptop", "sha256": _digest(ALICE), "subject": "alice"},
                    {
                        "name": "bob-ci",
                        "sha256": _digest(BOB),
                        "subject": "bob",
                        "scopes": ["math"],
                    },
                ],
            },
            "policy": {
                "rules": [
                    {"deny": {"tools": ["sleep"]}, "when": {"subjects": ["alice"]}},
                    {"require": {"tools": ["add"]}, "scopes": ["math"]},
                ]
            },
            "rate_limits": {"per_identity": {"rate": 0.001, "burst": ALICE_BURST}},
            "audit": {"path": str(audit)},
        }
    )


@asynccontextmanager
async def gateway(audit: Path) -> AsyncIterator[str]:
    with anyio.fail_after(START_BOUND):
        async with Gateway(parse(config(audit))) as gw:
            assert gw.http_url is not None
            await gw.catalogs_loaded.wait()
            yield gw.http_url


class Caller:
    def __init__(self, session: aiohttp.ClientSession, url: str, key: str) -> None:
        self._session, self._url, self._key = session, url, key
        self.last: aiohttp.ClientResponse | None = None

    async def send(self, msg: dict[str, Any]) -> dict[str, Any]:
        headers = {**mirrored_headers(msg), "Authorization": f"Bearer {self._key}"}
        with anyio.fail_after(BOUND):
            async with self._session.post(
                self._url, data=orjson.dumps(msg), headers=headers
            ) as resp:
                self.last = resp
                reply: dict[str, Any] = orjson.loads(await resp.read())
        return reply

    @property
    def status(self) -> int:
        assert self.last is not None
        return self.last.status


def tools_list(rid: int) -> dict[str, Any]:
    msg = call(rid, "x")
    return {**msg, "method": "tools/list", "params": {"_meta": msg["params"]["_meta"]}}


async def test_one_identity_drives_policy_limits_and_the_audit_line(tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    async with gateway(audit) as url, aiohttp.ClientSession() as session:
        alice, bob = Caller(session, url, ALICE), Caller(session, url, BOB)

        # Policy reads the key's subject: alice does not see what bob sees.
        alice_tools = {t["name"] for t in (await alice.send(tools_list(1)))["result"]["tools"]}
        bob_tools = {t["name"] for t in (await bob.send(tools_list(2)))["result"]["tools"]}
        assert "sleep" in bob_tools and "sleep" not in alice_tools
        assert alice_tools == bob_tools - {"sleep"}

        # A denied name is refused as an unknown one.
        denied = await alice.send(call(3, "sleep", seconds=0))
        unknown = await alice.send(call(4, "no_such_tool"))
        assert denied["error"]["code"] == unknown["error"]["code"] == codes.INVALID_PARAMS

        # A name that needs a scope: 403 with a step-up challenge naming it; with it, served.
        stepped = await alice.send(call(5, "add", a=1, b=2))
        assert alice.status == 403 and stepped["error"]["code"] == codes.INSUFFICIENT_SCOPE
        assert alice.last is not None
        challenge = alice.last.headers["WWW-Authenticate"]
        assert 'error="insufficient_scope"' in challenge and 'scope="math"' in challenge
        added = await bob.send(call(6, "add", a=1, b=2))
        assert bob.status == 200 and "result" in added

        # The rate limit is per identity: this is alice's fifth request (refused ones count), the
        # last of her burst; the next is refused while bob is still served.
        assert (await alice.send(call(7, "echo", text="fifth")))["result"]
        limited = await alice.send(call(8, "echo", text="sixth"))
        assert alice.status == 429 and limited["error"]["code"] == codes.RATE_LIMITED
        assert alice.last is not None and int(alice.last.headers["Retry-After"]) >= 1
        assert "result" in await bob.send(call(9, "echo", text="bob goes on"))

    lines = [orjson.loads(line) for line in audit.read_bytes().splitlines()]
    by_id = {line["id"]: line for line in lines}
    assert set(by_id) == set(range(1, 10))
    assert {by_id[i]["subject"] for i in (1, 3, 5, 7, 8)} == {"alice"}
    assert {by_id[i]["subject"] for i in (2, 6, 9)} == {"bob"}
    assert by_id[6]["client_id"] == "bob-ci" and by_id[6]["auth"] == "api_key"
    assert by_id[5]["code"] == codes.INSUFFICIENT_SCOPE
    assert by_id[8]["code"] == codes.RATE_LIMITED
    assert by_id[6]["outcome"] == "ok" and by_id[6]["backend"] == "demo"
    # The keys themselves are nowhere in the trail.
    assert ALICE.encode() not in audit.read_bytes() and BOB.encode() not in audit.read_bytes()
