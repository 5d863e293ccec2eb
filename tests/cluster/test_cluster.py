"""`cluster.secrets`: replicas of one gateway behind a load balancer sign with shared keys, so
modern traffic (any request, list page or MRTR retry) may land on any replica.

Pure: the keys derived per purpose, rotation (signed with the old secret, accepted while it is
still listed, refused once it is gone), another cluster's cursor. Config: where the secrets come
from and what is refused, and that no secret is ever shown. Then two gateways in this process
(real sockets on 127.0.0.1) in front of one paginating backend of the test: a list paged across
both, with the same secrets, mid-rotation, with other secrets, and without `cluster` (today's
behaviour: each process its own key); a modern backend's MRTR retry on the other replica; and
a call held for a legacy backend, which stays on its replica and is refused clearly elsewhere.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import orjson
import pytest
import yaml
from aiohttp import web

from gateway.app import Gateway
from gateway.backends.era.held import UNKNOWN_STATE
from gateway.config import ClusterConfig, ConfigInvalid, describe, load, parse
from gateway.config.credentials import MIN_CLUSTER_SECRET_LENGTH
from gateway.protocol import codes
from gateway.routing import cursor as cursors
from tests.backends.test_legacy_backends import answered, ask, text_of
from tests.support import (
    BOUND,
    PYTHON,
    ROOT,
    START_BOUND,
    VERSION,
    Message,
    messages,
    mirrored_headers,
    request,
    run_cli,
    sdk_stdio_command,
    serve_http,
    stdio_backend,
)

# Secrets as an operator would make them (`openssl rand -base64 32`), each recognisable in
# any text it should never appear in.
OLD = "old-secret-Jw9xQ2vLr8NfTb3KpZ6mYd1H"
NEW = "new-secret-Vc4sWq7GxE2uRn9LhA5tBk0P"
OTHER = "other-cluster-secret-Xr3Fy8Zq1Mw6Ds"
TOOLS = ["ask", "t1", "t2", "t3", "t4"]
PAGE = 2  # the backend's page size: TOOLS is three pages
SCOPE = "tools/list"
POSITIONS: list[cursors.Position] = [("pages", "2")]

pytestmark = pytest.mark.anyio


def cluster(*secrets: str) -> ClusterConfig:
    return ClusterConfig(secrets=secrets)


# --- pure: keys and rotation ------------------------------------------------------------------


def test_keys_are_derived_per_secret_and_per_purpose() -> None:
    keys = cluster(NEW, OLD).keys(cursors.PURPOSE)
    assert len(keys) == 2 and keys[0] != keys[1]
    assert keys == cluster(NEW, OLD).keys(cursors.PURPOSE)  # the same on every replica
    assert cluster(NEW).keys(b"mcp-gateway something else v1")[0] != keys[0]
    assert all(NEW.encode() not in k and len(k) == 32 for k in keys)


def test_a_cursor_signed_with_the_old_secret_is_accepted_while_it_is_listed_second() -> None:
    before = cluster(OLD).keys(cursors.PURPOSE)
    during = cluster(NEW, OLD).keys(cursors.PURPOSE)
    after = cluster(NEW).keys(cursors.PURPOSE)
    issued = cursors.encode(POSITIONS, before[0], SCOPE)
    assert cursors.decode(issued, during, SCOPE) == POSITIONS
    assert cursors.decode(issued, after, SCOPE) is None


def test_mid_rotation_replicas_accept_each_others_cursors() -> None:
    """Step one lists the new secret second everywhere; step two moves it first, replica by
    replica. A replica that has moved signs with the new secret, which one that has not yet
    moved still accepts, and the other way round."""
    moved = cluster(NEW, OLD).keys(cursors.PURPOSE)
    waiting = cluster(OLD, NEW).keys(cursors.PURPOSE)
    assert cursors.decode(cursors.encode(POSITIONS, moved[0], SCOPE), waiting, SCOPE) == POSITIONS
    assert cursors.decode(cursors.encode(POSITIONS, waiting[0], SCOPE), moved, SCOPE) == POSITIONS


def test_another_clusters_cursor_is_refused() -> None:
    theirs = cursors.encode(POSITIONS, cluster(OTHER).keys(cursors.PURPOSE)[0], SCOPE)
    assert cursors.decode(theirs, cluster(NEW, OLD).keys(cursors.PURPOSE), SCOPE) is None


# --- config -----------------------------------------------------------------------------------


def config_text(cluster_section: object) -> str:
    return yaml.safe_dump(
        {
            "listen": {"http": {"host": "127.0.0.1", "port": 0}},
            "backends": {"b": {"http": {"url": "http://127.0.0.1:1/mcp"}}},
            "cluster": cluster_section,
        }
    )


def problems(text: str, env: dict[str, str] | None = None, source: str = "<config>") -> list[str]:
    with pytest.raises(ConfigInvalid) as caught:
        parse(text, source, env=env or {})
    return caught.value.problems


def test_secrets_come_from_the_environment_in_order() -> None:
    env = {"GATEWAY_SECRET": NEW, "GATEWAY_OLD_SECRET": OLD}
    text = config_text({"secrets": ["${GATEWAY_SECRET}", "${GATEWAY_OLD_SECRET}"]})
    config = parse(text, env=env)
    assert config.cluster == cluster(NEW, OLD)


def test_without_cluster_there_are_no_shared_secrets() -> None:
    text = yaml.safe_dump(
        {"listen": {"stdio": True}, "backends": {"b": {"stdio": {"command": "x"}}}}
    )
    assert parse(text, env={}).cluster is None


@pytest.mark.parametrize(
    ("section", "where", "says"),
    [
        ({"secrets": ["short"]}, "cluster.secrets.0", "shorter than 32 characters"),
        (
            {"secrets": [NEW, "x" * (MIN_CLUSTER_SECRET_LENGTH - 1)]},
            "cluster.secrets.1",
            "shorter than 32 characters",
        ),
        ({"secrets": [""]}, "cluster.secrets.0", "is empty"),
        ({"secrets": []}, "cluster.secrets", "name at least one secret"),
        ({"secrets": NEW}, "cluster.secrets", "must be a list of strings"),
        ({"secrets": [{"value": NEW}]}, "cluster.secrets", "must be a list of strings"),
        ({"secrets": [NEW], "secrets_file": "s.txt"}, "cluster", "exactly one of"),
        ({}, "cluster", "exactly one of"),
        ({"secret": [NEW]}, "cluster.secret", "unknown key"),
        ("yes", "cluster", "must be a mapping"),
    ],
)
def test_a_bad_cluster_section_is_refused_where_it_is(
    section: object, where: str, says: str
) -> None:
    found = problems(config_text(section))
    assert any(f": {where}: " in p and says in p for p in found), found
    # One mistake, one problem (a misspelt key also leaves the section without a source).
    assert len(found) == 1 or "unknown key" in says, found


def test_an_unset_variable_is_refused_not_read_as_an_empty_secret() -> None:
    found = problems(config_text({"secrets": ["${GATEWAY_SECRET}"]}))
    assert any("environment variable GATEWAY_SECRET is not set" in p for p in found), found


def test_the_commented_example_in_config_example_yaml_loads() -> None:
    text = (ROOT / "config.example.yaml").read_text(encoding="utf-8")
    start = text.index("# cluster:")
    end = text.index("\n\n", start)
    block = "\n".join(line.removeprefix("# ") for line in text[start:end].splitlines())
    env = {"MCP_GATEWAY_PYTHON": PYTHON, "GATEWAY_SECRET": NEW, "GATEWAY_OLD_SECRET": OLD}
    config = parse(text[:start] + block + text[end:], env=env)
    assert config.cluster == cluster(NEW, OLD)


def write_secrets(directory: Path, text: str, mode: int = 0o600) -> Path:
    file = directory / "cluster-secrets"
    file.write_text(text)
    file.chmod(mode)
    return file


def write_config(directory: Path, section: object) -> Path:
    path = directory / "gateway.yaml"
    path.write_text(config_text(section))
    return path


def test_a_secrets_file_beside_the_config_holds_one_secret_a_line(tmp_path: Path) -> None:
    file = write_secrets(tmp_path, f"# rotated in May\n{NEW}\n\n  {OLD}  \n")
    config = load(write_config(tmp_path, {"secrets_file": file.name}), env={})
    assert config.cluster == ClusterConfig(secrets=(NEW, OLD), secrets_file=str(file))


@pytest.mark.parametrize(
    ("content", "mode", "says"),
    [
        (f"{NEW}\nshort\n", 0o600, "line 2 of"),
        ("# nothing yet\n\n", 0o600, "holds no secret"),
        (f"{NEW}\n", 0o620, "writable by others than its owner"),
        (f"{NEW}\n", 0o602, "writable by others than its owner"),
    ],
)
def test_a_bad_secrets_file_is_refused(tmp_path: Path, content: str, mode: int, says: str) -> None:
    path = write_config(tmp_path, {"secrets_file": write_secrets(tmp_path, content, mode).name})
    with pytest.raises(ConfigInvalid) as caught:
        load(path, env={})
    found = caught.value.problems
    assert any(": cluster.secrets_file: " in p and says in p for p in found), found
    assert not any(NEW in p for p in found)


def test_a_secrets_file_that_cannot_be_read_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a-directory").mkdir()
    for name in ("missing", "a-directory"):
        with pytest.raises(ConfigInvalid) as caught:
            load(write_config(tmp_path, {"secrets_file": name}), env={})
        (problem,) = caught.value.problems
        assert ": cluster.secrets_file: cannot read " in problem and name in problem


def test_no_secret_is_shown_by_repr_describe_errors_or_check_config(tmp_path: Path) -> None:
    env = {"GATEWAY_SECRET": NEW}
    config = parse(config_text({"secrets": ["${GATEWAY_SECRET}", OLD]}), env=env)
    assert config.cluster is not None
    shown = [repr(config), repr(config.cluster), str(config.cluster), describe(config)]
    assert "2 secrets" in describe(config)
    # A refused config: the good secret next to a short one.
    shown += problems(config_text({"secrets": [NEW, OLD[:20]]}))
    path = write_config(tmp_path, {"secrets": [NEW, OLD]})
    done = run_cli("check-config", "--config", str(path))
    assert done.returncode == 0, done.stderr
    shown += [done.stdout, done.stderr]
    file = write_secrets(tmp_path, f"{NEW}\n{OLD[:20]}\n")
    done = run_cli(
        "check-config", "--config", str(write_config(tmp_path, {"secrets_file": file.name}))
    )
    assert done.returncode != 0
    shown += [done.stdout, done.stderr]
    for text in shown:
        assert NEW not in text and OLD not in text and OLD[:20] not in text, text


# --- two replicas in front of one backend -----------------------------------------------------


@asynccontextmanager
async def paging_backend() -> AsyncIterator[tuple[str, list[Message]]]:
    """A modern MCP server on HTTP: TOOLS in pages of PAGE (the cursor is the next offset), and
    a tool `ask` that needs an answer first (input_required with a `requestState` of its own).
    Yields its URL and every request it got."""
    seen: list[Message] = []

    async def handle(http: web.Request) -> web.Response:
        body = orjson.loads(await http.read())
        seen.append(body)
        if "id" not in body:
            return web.Response(status=202)
        params = body.get("params") or {}
        result: dict[str, Any]
        if body["method"] == "server/discover":
            result = {"supportedVersions": [VERSION], "capabilities": {"tools": {}}}
        elif body["method"] == "tools/list":
            start = int(params.get("cursor", "0"))
            tools = [{"name": n, "inputSchema": {"type": "object"}} for n in TOOLS]
            result = {"tools": tools[start : start + PAGE], "ttlMs": 0}
            if start + PAGE < len(TOOLS):
                result["nextCursor"] = str(start + PAGE)
        elif "requestState" not in params:
            question = {"method": "elicitation/create", "params": {"message": "why?"}}
            result = {
                "resultType": "input_required",
                "inputRequests": {"q": question},
                "requestState": "state-of-the-backend",
            }
        else:
            answer = params["inputResponses"]["q"]["content"]["answer"]
            text = f"{params['requestState']}: {answer}"
            result = {"content": [{"type": "text", "text": text}]}
        reply = {"jsonrpc": "2.0", "id": body["id"], "result": {"resultType": "complete", **result}}
        return web.Response(body=orjson.dumps(reply), content_type="application/json")

    async with serve_http(handle) as origin:
        yield origin + "/mcp", seen


def gateway_text(backend: dict[str, object], secrets: tuple[str, ...] | None) -> str:
    doc: dict[str, object] = {
        "listen": {"http": {"host": "127.0.0.1", "port": 0}},
        "backends": {"pages": backend},
    }
    if secrets is not None:
        doc["cluster"] = {"secrets": list(secrets)}
    return yaml.safe_dump(doc)


@asynccontextmanager
async def replicas(
    backend: dict[str, object],
    a: tuple[str, ...] | None,
    b: tuple[str, ...] | None,
) -> AsyncIterator[tuple[str, str]]:
    """Two gateways of one config but for their secrets (None: no `cluster`), as a load
    balancer would have behind it; yields their MCP URLs."""
    with anyio.fail_after(START_BOUND):
        async with (
            Gateway(parse(gateway_text(backend, a), env={})) as first,
            Gateway(parse(gateway_text(backend, b), env={})) as second,
        ):
            assert first.http_url is not None and second.http_url is not None
            # Their own catalog loads are over: what the backend gets next is the test's.
            await first.catalogs_loaded.wait()
            await second.catalogs_loaded.wait()
            yield first.http_url, second.http_url


async def post(url: str, msg: Message) -> Message:
    with anyio.fail_after(BOUND):
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=orjson.dumps(msg), headers=mirrored_headers(msg)) as resp,
        ):
            async for item in messages(resp):
                if "method" not in item:
                    return item
    raise AssertionError(f"no reply to {msg['id']!r}")


async def page(url: str, rid: int, cursor: str | None = None) -> Message:
    return await post(url, request(rid, "tools/list", {} if cursor is None else {"cursor": cursor}))


def names_and_cursor(reply: Message) -> tuple[list[str], str | None]:
    assert "result" in reply, reply
    return [t["name"] for t in reply["result"]["tools"]], reply["result"].get("nextCursor")


def refused(reply: Message) -> bool:
    return bool(reply.get("error", {}).get("code") == codes.INVALID_PARAMS)


@pytest.mark.parametrize(
    ("a", "b"),
    [((NEW,), (NEW,)), ((NEW, OLD), (OLD, NEW))],
    ids=["same_secrets", "mid_rotation"],
)
async def test_a_list_paged_across_replicas_sees_every_item_once(
    a: tuple[str, ...], b: tuple[str, ...]
) -> None:
    async with paging_backend() as (url, seen), replicas({"http": {"url": url}}, a, b) as urls:
        shown: list[str] = []
        cursor = None
        for rid, replica in enumerate([urls[0], urls[1], urls[0]]):
            names, cursor = names_and_cursor(await page(replica, rid, cursor))
            shown += names
        assert cursor is None
    assert shown == TOOLS
    asked = [m["params"].get("cursor") for m in seen if m.get("method") == "tools/list"]
    assert asked[-3:] == [None, "2", "4"]


@pytest.mark.parametrize(
    ("a", "b"), [((NEW,), (OTHER,)), (None, None)], ids=["other_secrets", "no_cluster"]
)
async def test_a_replica_refuses_a_cursor_it_cannot_verify(
    a: tuple[str, ...] | None, b: tuple[str, ...] | None
) -> None:
    """Without `cluster` each process signs with a key of its own (today's behaviour); with
    other secrets the replicas are two clusters. Either way the cursor is refused, not passed
    on, and still works where it was issued."""
    async with paging_backend() as (url, _), replicas({"http": {"url": url}}, a, b) as urls:
        _, cursor = names_and_cursor(await page(urls[0], 1))
        assert cursor is not None
        assert refused(await page(urls[1], 2, cursor))
        names, _ = names_and_cursor(await page(urls[0], 3, cursor))
    assert names == TOOLS[PAGE : 2 * PAGE]


async def test_what_a_forged_cursor_can_and_cannot_do() -> None:
    """Whoever holds a cluster secret can sign positions of their choosing (THREAT_MODEL.md):
    any of a configured backend's cursors, which the backend must judge; a backend named
    twice, which would multiply one request into many, is refused all the same."""
    keys = cluster(NEW).keys(cursors.PURPOSE)
    async with (
        paging_backend() as (url, seen),
        replicas({"http": {"url": url}}, (NEW,), (NEW,)) as urls,
    ):
        steered = cursors.encode([("pages", "3")], keys[0], SCOPE)
        names, _ = names_and_cursor(await page(urls[1], 1, steered))
        assert names == TOOLS[3:5] and seen[-1]["params"]["cursor"] == "3"
        twice = cursors.encode([("pages", "2"), ("pages", "2")], keys[0], SCOPE)
        unknown = cursors.encode([("elsewhere", "2")], keys[0], SCOPE)
        before = len(seen)
        assert refused(await page(urls[1], 2, twice))
        assert refused(await page(urls[1], 3, unknown))
        assert len(seen) == before  # refused before any backend was asked


async def test_a_modern_backends_retry_may_land_on_the_other_replica() -> None:
    """input_required passes through untouched, `requestState` included: the state is the
    backend's, so the retry needs nothing of the replica that relayed the question."""
    async with (
        paging_backend() as (url, _),
        replicas({"http": {"url": url}}, (NEW,), (NEW,)) as urls,
    ):
        first = await post(urls[0], ask(1))
        assert first["result"]["resultType"] == "input_required"
        assert first["result"]["requestState"] == "state-of-the-backend"
        final = await post(urls[1], answered(2, first))
    assert text_of(final) == "state-of-the-backend: because"


async def test_a_call_held_for_a_legacy_backend_stays_on_its_replica() -> None:
    """The held call lives in one process's memory: a retry that another replica gets is
    refused with -32602 saying so, and the call is still there for a retry where it lives."""
    legacy = stdio_backend(sdk_stdio_command("--legacy-only"))
    async with replicas(legacy, (NEW,), (NEW,)) as (a, b):
        first = await post(a, ask(1))
        assert first["result"]["resultType"] == "input_required"
        elsewhere = await post(b, answered(2, first))
        assert refused(elsewhere) and elsewhere["error"]["message"] == UNKNOWN_STATE
        assert "gateway process that started it" in UNKNOWN_STATE
        final = await post(a, answered(3, first))
    assert text_of(final) == "answer: because"
