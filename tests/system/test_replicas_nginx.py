"""Identical replicas behind a stock load balancer (README "Running several replicas"): three
gateway processes sharing `cluster.secrets` behind a real nginx running the shipped
deploy/nginx/mcp-gateway.conf (round-robin, no stickiness). Modern traffic needs nothing else:
every request of a paged list goes to another replica than the one before, and the pages still
join up; a tool call works from any replica; a client's list from one replica pages on another.
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from tests.support import BOUND, META, sdk_stdio_command, stdio_backend
from tests.support.nginx import behind_nginx, replicas

pytestmark = pytest.mark.slow

SECRET = "replica-test-secret-0123456789abcdef"
PAGE_SIZE = 2


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[str]]]:
    """nginx's MCP URL, and each replica's own MCP URL."""
    directory = tmp_path_factory.mktemp("replicas")
    backend = stdio_backend(sdk_stdio_command("--page-size", str(PAGE_SIZE)))
    settings = {"backends": {"sdk": backend}, "cluster": {"secrets": [SECRET]}}
    with replicas(directory, settings) as gateways, behind_nginx(directory, gateways) as url:
        yield url, [g.url for g in gateways]


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": META["io.modelcontextprotocol/protocolVersion"],
        "Mcp-Method": body["method"],
    }
    if body["method"] == "tools/call":
        headers["Mcp-Name"] = body["params"]["name"]
    sent = urllib.request.Request(url, data=orjson.dumps(body), headers=headers, method="POST")
    with urllib.request.urlopen(sent, timeout=BOUND) as reply:
        answer: dict[str, Any] = orjson.loads(reply.read())
        return answer


def page(url: str, rid: int, cursor: str | None) -> dict[str, Any]:
    params: dict[str, Any] = {"_meta": dict(META)}
    if cursor is not None:
        params["cursor"] = cursor
    return post(url, {"jsonrpc": "2.0", "id": rid, "method": "tools/list", "params": params})


def test_a_paged_list_through_round_robin_joins_up(front: tuple[str, list[str]]) -> None:
    url, replicas = front
    alone = [t["name"] for t in all_pages(replicas[0])]
    assert len(alone) > 2 * PAGE_SIZE  # several pages, so several replicas serve one list
    before = [lists_served(r) for r in replicas]
    assert [t["name"] for t in all_pages(url)] == alone
    served = [lists_served(r) - b for r, b in zip(replicas, before, strict=True)]
    # Round-robin, no stickiness: every replica served pages of the one list.
    assert all(n > 0 for n in served) and sum(served) == len(alone) // PAGE_SIZE + 1


def test_a_cursor_from_one_replica_pages_on_another(front: tuple[str, list[str]]) -> None:
    _, replicas = front
    first = page(replicas[0], 1, None)["result"]
    second = page(replicas[1], 2, first["nextCursor"])["result"]
    assert second["tools"] and second["tools"][0] != first["tools"][-1]


def test_a_tool_call_works_from_every_replica(front: tuple[str, list[str]]) -> None:
    url, _ = front
    for rid in range(6):
        call = {
            "jsonrpc": "2.0",
            "id": rid,
            "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": f"r{rid}"}, "_meta": dict(META)},
        }
        result = post(url, call)["result"]
        assert result["content"][0]["text"].endswith(f"r{rid}")


def all_pages(url: str) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = []
    cursor: str | None = None
    for rid in range(100):
        result = page(url, rid, cursor)["result"]
        tools.extend(result["tools"])
        cursor = result.get("nextCursor")
        if cursor is None:
            return tools
    raise AssertionError("the list never ended")


def lists_served(replica: str) -> float:
    """tools/list requests a replica has answered, from its own /metrics."""
    metrics = replica.removesuffix("/mcp") + "/metrics"
    with urllib.request.urlopen(metrics, timeout=BOUND) as reply:
        text = reply.read().decode()
    pattern = (
        r"^mcp_server_operation_duration_seconds_count"
        r'\{[^}]*mcp_method_name="tools/list"[^}]*\} (\S+)$'
    )
    return sum(float(m) for m in re.findall(pattern, text, flags=re.M))
