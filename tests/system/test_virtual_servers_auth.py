"""Virtual servers under `auth:` (issue 33; basic/authorization, Protected Resource Metadata
Discovery and Token Audience Binding): each endpoint is a protected resource of its own, with
its own `resource` in its own metadata, challenges naming that metadata, its own required
scopes, and tokens bound to its own audience. Real sockets on 127.0.0.1: the gateway
in-process, the test's authorization server (tests/support/auth.py) and a recording backend."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import anyio
import pytest
import yaml

from gateway.app import Gateway
from gateway.config import parse
from tests.support import START_BOUND
from tests.support.auth import VERSION, AuthServer, auth_server, recording_backend

pytestmark = pytest.mark.anyio

RESOURCE = "http://gw.example/mcp"
READER_KEY = "reader-key-0123456789"
ADMIN_KEY = "admin-key-0123456789"


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def team(backend: str, issuer: str) -> str:
    return yaml.safe_dump(
        {
            "listen": {"http": {"host": "127.0.0.1", "port": 0}},
            "backends": {"rec": {"http": {"url": backend}}},
            "auth": {
                "resource": RESOURCE,
                "issuer": issuer,
                "scopes_supported": ["read", "admin"],
                "api_keys": [
                    {"name": "reader", "sha256": digest(READER_KEY), "scopes": ["read"]},
                    {"name": "admin", "sha256": digest(ADMIN_KEY), "scopes": ["read", "admin"]},
                ],
            },
            "servers": {
                "docs": {"backends": {"rec": {}}},
                "ops": {
                    "backends": {"rec": {}},
                    "auth": {"scopes": ["admin"], "scopes_supported": ["admin"]},
                },
            },
        }
    )


@asynccontextmanager
async def gateway() -> AsyncIterator[tuple[str, AuthServer]]:
    async with (
        auth_server() as issuer,
        recording_backend() as (backend, _),
    ):
        with anyio.fail_after(START_BOUND):
            async with Gateway(parse(team(backend + "/mcp", issuer.issuer))) as gw:
                assert gw.http_url is not None
                yield gw.http_url.removesuffix("/mcp"), issuer


def listing(token: str | None) -> tuple[dict[str, Any], dict[str, str]]:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/list",
        "params": {
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": VERSION,
                "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": {},
            }
        },
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": VERSION,
        "Mcp-Method": "tools/list",
    }
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return body, headers


async def status(http: aiohttp.ClientSession, url: str, token: str | None) -> int:
    body, headers = listing(token)
    async with http.post(url, json=body, headers=headers) as answer:
        return answer.status


async def test_each_endpoint_publishes_its_own_resource_metadata() -> None:
    """RFC 9728: the metadata at each endpoint's path-inserted well-known URL names that
    endpoint as the resource; a 401 from an endpoint points at its own metadata."""
    async with gateway() as (origin, _), aiohttp.ClientSession() as http:
        wanted = {
            "/.well-known/oauth-protected-resource/mcp": (RESOURCE, ["read", "admin"]),
            "/.well-known/oauth-protected-resource/mcp/docs": (
                RESOURCE + "/docs",
                ["read", "admin"],
            ),
            "/.well-known/oauth-protected-resource/mcp/ops": (RESOURCE + "/ops", ["admin"]),
        }
        for path, (resource, scopes) in wanted.items():
            async with http.get(origin + path) as found:
                assert found.status == 200
                document = await found.json()
            assert document["resource"] == resource
            assert document["scopes_supported"] == scopes
        body, headers = listing(None)
        async with http.post(origin + "/mcp/docs", json=body, headers=headers) as refused:
            assert refused.status == 401
            challenge = refused.headers["WWW-Authenticate"]
        metadata = "http://gw.example/.well-known/oauth-protected-resource/mcp/docs"
        assert f'resource_metadata="{metadata}"' in challenge


async def test_a_servers_own_scopes_are_required_there_only() -> None:
    """Access Token Privilege Restriction: ops requires `admin`; a reader's key is 403 there
    and served at docs and at the merged /mcp."""
    async with gateway() as (origin, _), aiohttp.ClientSession() as http:
        assert await status(http, origin + "/mcp/ops", READER_KEY) == 403
        assert await status(http, origin + "/mcp/ops", ADMIN_KEY) == 200
        assert await status(http, origin + "/mcp/docs", READER_KEY) == 200
        assert await status(http, origin + "/mcp", READER_KEY) == 200


async def test_a_token_is_bound_to_its_endpoints_audience() -> None:
    """RFC 8707, Token Audience Binding: a token minted for /mcp/docs is refused at /mcp/ops
    and at /mcp (401), and one for /mcp is refused at /mcp/docs."""
    async with gateway() as (origin, issuer), aiohttp.ClientSession() as http:
        for_docs = issuer.mint(aud=RESOURCE + "/docs", scope="read admin")
        for_merged = issuer.mint(aud=RESOURCE, scope="read admin")
        assert await status(http, origin + "/mcp/docs", for_docs) == 200
        assert await status(http, origin + "/mcp/ops", for_docs) == 401
        assert await status(http, origin + "/mcp", for_docs) == 401
        assert await status(http, origin + "/mcp", for_merged) == 200
        assert await status(http, origin + "/mcp/docs", for_merged) == 401
