"""A reply the gateway does not change leaves as the bytes the backend sent; a client request is
always re-encoded, so the backend parses exactly what the gateway checked and routed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import anyio
import orjson
import pytest
from aiohttp import web

from gateway.app import Gateway
from gateway.config import parse
from gateway.protocol import jsonrpc
from tests.support import BOUND, META, mirrored_headers, serve_http

pytestmark = pytest.mark.anyio

TOOLS = {"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]}
DISCOVER = {
    "supportedVersions": ["2026-07-28"],
    "capabilities": {"tools": {}, "resources": {}},
    "serverInfo": {"name": "odd", "version": "1"},
}
# Spacing and member order no encoder of ours would produce: only an untouched forward keeps them.
ODD_REPLY = (
    b'{ "result" : {"content": [ {"type":"text", "text":"hi"} ]},  "id" : 7, "jsonrpc":"2.0" }'
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_a_kept_message_encodes_as_its_original_bytes() -> None:
    msg = jsonrpc.decode(ODD_REPLY, keep=True)
    assert isinstance(msg, dict)
    assert jsonrpc.encode(msg) is ODD_REPLY


def test_changing_a_kept_message_makes_it_encode_afresh() -> None:
    top = jsonrpc.decode(ODD_REPLY, keep=True)
    assert isinstance(top, dict)
    top["id"] = 8
    assert orjson.loads(jsonrpc.encode(top))["id"] == 8

    nested = jsonrpc.decode(ODD_REPLY, keep=True)
    assert isinstance(nested, dict)
    nested["result"]["content"][0]["text"] = "changed"
    jsonrpc.changed(nested)
    assert orjson.loads(jsonrpc.encode(nested))["result"]["content"][0]["text"] == "changed"

    mutations: list[Callable[[dict[str, Any]], object]] = [
        lambda m: m.pop("jsonrpc"),
        lambda m: m.update(extra=1),
        lambda m: m.setdefault("extra", 1),
    ]
    for mutate in mutations:
        msg = jsonrpc.decode(ODD_REPLY, keep=True)
        assert isinstance(msg, dict)
        mutate(msg)
        assert jsonrpc.encode(msg) != ODD_REPLY


def test_a_message_not_kept_is_encoded() -> None:
    msg = jsonrpc.decode(ODD_REPLY)
    assert isinstance(msg, dict)
    assert jsonrpc.encode(msg) == orjson.dumps(orjson.loads(ODD_REPLY))


class OddBackend:
    """An HTTP backend that answers tools/call with ODD_REPLY (its id patched in) and keeps the
    raw bodies it was sent."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        msg = orjson.loads(body)
        if "id" not in msg:
            return web.Response(status=202)
        if msg["method"] == "tools/call":
            self.bodies.append(body)
            reply = ODD_REPLY.replace(b'"id" : 7', b'"id" : ' + orjson.dumps(msg["id"]))
            return web.Response(body=reply, content_type="application/json")
        results: dict[str, dict[str, Any]] = {"server/discover": DISCOVER, "tools/list": TOOLS}
        result = results.get(msg["method"], {})
        if msg["method"] in ("resources/list", "prompts/list"):
            result = {msg["method"].split("/")[0]: []}
        out = {"jsonrpc": "2.0", "id": msg["id"], "result": result}
        return web.Response(body=orjson.dumps(out), content_type="application/json")


@asynccontextmanager
async def odd_gateway() -> AsyncIterator[tuple[OddBackend, str]]:
    backend = OddBackend()
    async with serve_http(backend.handle) as base:
        config = f"""
listen: {{http: {{host: 127.0.0.1, port: 0, path: /mcp}}}}
backends:
  odd: {{http: {{url: "{base}/mcp"}}}}
"""
        async with Gateway(parse(config)) as gateway:
            assert gateway.http_url is not None
            yield backend, gateway.http_url


async def test_an_unchanged_reply_reaches_the_client_byte_for_byte() -> None:
    msg = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {}, "_meta": META},
    }
    async with odd_gateway() as (_, url):
        with anyio.fail_after(BOUND):
            async with (
                aiohttp.ClientSession() as session,
                session.post(url, data=orjson.dumps(msg), headers=mirrored_headers(msg)) as resp,
            ):
                body = await resp.read()
    assert resp.status == 200
    assert body == ODD_REPLY


async def test_a_client_request_with_a_duplicated_member_reaches_the_backend_as_checked() -> None:
    # JSON parsers disagree on duplicated members (first wins, last wins, error): the backend
    # must see the one name the gateway routed and the headers were checked against.
    meta = orjson.dumps(META).decode()
    raw = (
        '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":'
        f'{{"name":"hidden","name":"echo","arguments":{{}},"_meta":{meta}}}}}'
    ).encode()
    headers = mirrored_headers(orjson.loads(raw))
    async with odd_gateway() as (backend, url):
        with anyio.fail_after(BOUND):
            async with (
                aiohttp.ClientSession() as session,
                session.post(url, data=raw, headers=headers) as resp,
            ):
                await resp.read()
    assert resp.status == 200
    assert len(backend.bodies) == 1
    sent = backend.bodies[0]
    assert b"hidden" not in sent
    assert orjson.loads(sent)["params"]["name"] == "echo"
