"""Policy bypass through another spelling (THREAT_MODEL.md, Policy bypass), in memory: the fold
and the URI normaliser as pure functions, and the dispatcher in front of an in-memory copy of the
lenient test server (tests/servers/lenient_server.py), which runs whatever a lenient match finds.

A denied or unknown name is refused with the unknown-name error (server/tools, Error Handling:
-32602) and never reaches the backend; a URI is judged in its RFC 3986 normal form (and as a
server decoding an encoded slash reads it); a client notification with a request's method is
dropped (basic/index, Notifications: a notification is never answered, so it cannot carry a
request)."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gateway.backends.base import Call, NotificationSink
from gateway.config import parse
from gateway.core.dispatcher import Dispatcher, GatewayInfo
from gateway.core.policy import RESOURCE, TOOL, Policy
from gateway.core.ratelimit import RateLimiter
from gateway.protocol import codes
from gateway.protocol.jsonrpc import Message
from gateway.routing.fold import fold
from gateway.routing.names import Naming
from gateway.routing.table import Exposure
from gateway.routing.uris import normalize, readings
from tests.servers import lenient_server
from tests.support.memory_backend import ignore, modern

pytestmark = pytest.mark.anyio

FULLWIDTH = "\uff53\uff45\uff43\uff52\uff45\uff54_read"  # secret_read, fullwidth letters
CYRILLIC_E = "s\u0435cret_read"  # a Cyrillic e
# Each way the issue spells `secret_read` (denied) that a lenient server still runs.
SPELLINGS = {
    "upper case": "SECRET_READ",
    "fullwidth": FULLWIDTH,
    "zero-width space": "secret\u200b_read",
    "soft hyphen": "secret\u00ad_read",
    "leading space": " secret_read",
    "cyrillic e": CYRILLIC_E,
}
POLICY = """
policy:
  rules:
    - deny: {tools: ['secret_*'], prompts: ['secret_*'], resources: ['file:///secret/*']}
    - require: {tools: ['admin_*']}
      scopes: [admin]
"""
RATE_LIMITS = "rate_limits: {tools: {echo: {rate: 0.001, burst: 1}, dyn_tool: {rate: 100}}}\n"


class LenientBackend:
    """The lenient test server in memory: its answers, and every request and notification that
    reached it."""

    transport = "memory"
    name = "lenient"

    def __init__(self, record: Path) -> None:
        self._record = record
        self.received: list[Message] = []

    @property
    def up(self) -> bool:
        return True

    async def run(self) -> None:
        return None

    async def request(
        self, msg: Message, sink: NotificationSink, call: Call, *, long_lived: bool = False
    ) -> Message:
        self.received.append(msg)
        result = lenient_server.answer(msg, self._record)
        return {"jsonrpc": "2.0", "id": msg["id"], "result": {"resultType": "complete", **result}}

    async def notify(self, msg: Message) -> None:
        self.received.append(msg)

    def ran(self) -> list[Message]:
        listing = ("server/discover",) + tuple(f"{k}/list" for k in ("tools", "prompts"))
        skipped = (*listing, "resources/list", "resources/templates/list")
        return [m for m in self.received if m["method"] not in skipped]


async def gateway(
    tmp_path: Path,
    *,
    policy: bool = True,
    limits: bool = False,
    forward_unknown: bool = False,
) -> tuple[Dispatcher, LenientBackend]:
    backend = LenientBackend(tmp_path / "record.jsonl")
    text = (
        "listen: {stdio: true}\nbackends:\n  lenient: {stdio: {command: x}}\n"
        + (POLICY if policy else "")
        + (RATE_LIMITS if limits else "")
    )
    config = parse(text)
    exposure = Exposure(
        "lenient",
        "lenient",
        deny=("hidden_*",),
        rename={"old_name": "new_name"},
        forward_unknown=forward_unknown,
    )
    limiter = None
    if config.rate_limits is not None:
        limiter = RateLimiter(config.rate_limits, Counter())
    dispatcher = Dispatcher(
        [backend],
        [exposure],
        Naming(),
        GatewayInfo("mcp-gateway", "test"),
        policy=Policy(config.policy) if config.policy is not None else None,
        limiter=limiter,
    )
    await dispatcher.catalogs.load_all()
    return dispatcher, backend


def code(reply: Message) -> int:
    assert "error" in reply, reply
    value: int = reply["error"]["code"]
    return value


async def call(d: Dispatcher, method: str, **params: Any) -> Message:
    return await d.serve(modern(1, method, **params), ignore)


# --- the pure parts ------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", [s for k, s in SPELLINGS.items() if k != "cyrillic e"])
def test_each_lenient_spelling_folds_to_the_name(spelling: str) -> None:
    assert fold(spelling) == "secret_read"


def test_the_fold_keeps_apart_what_no_normalisation_joins() -> None:
    # A homoglyph is not a normalisation: the default (no forward_unknown) refuses it unlisted.
    assert fold(CYRILLIC_E) != "secret_read"
    assert fold("secret_read") == "secret_read"
    assert fold("\ufeff Echo\u2060 ") == "echo"
    assert fold("STRASSE") == fold("stra\u00dfe")  # full case folding, not lower()


@pytest.mark.parametrize(
    ("uri", "normal"),
    [
        ("FILE:///secret/key", "file:///secret/key"),
        ("file:///public/../secret/key", "file:///secret/key"),
        ("file:///public/./a/b/../../../secret/key", "file:///secret/key"),
        ("HTTP://User@Example.COM:80/%7euser/%3a", "http://User@example.com:80/~user/%3A"),
        ("file:///public%2f..%2fsecret/key", "file:///public%2F..%2Fsecret/key"),
        ("mem://private/b", "mem://private/b"),
        ("urn:x:y", "urn:x:y"),
        ("file:///public/{name}", "file:///public/{name}"),
        ("x:/a/.%2e/b?q=/../#f", "x:/b?q=/../#f"),
    ],
)
def test_uris_are_normalised_as_rfc_3986_says(uri: str, normal: str) -> None:
    assert normalize(uri) == normal
    assert normalize(normal) == normal  # a normal form is its own


def test_an_encoded_slash_is_also_read_as_a_separator() -> None:
    assert readings(normalize("file:///public%2f..%2fsecret/key")) == ("file:///secret/key",)
    assert readings("file:///public/..%2Fsecret%2Fkey") == ("file:///secret/key",)
    assert readings("file:///public/a%20b") == ()  # nothing a server would take for a slash
    assert readings("file:///secret/key") == ()


def test_folded_rules_and_filters_match_every_spelling() -> None:
    config = parse(f"listen: {{stdio: true}}\nbackends:\n  b: {{stdio: {{command: x}}}}\n{POLICY}")
    assert config.policy is not None
    view = Policy(config.policy).view(None)
    assert view.decide(TOOL, "b", "SECRET_READ").allowed  # the rules as written
    assert not view.decide_folded(TOOL, "b", fold("SECRET_READ")).allowed
    assert view.decide_folded(TOOL, "b", fold("ADMIN_TOOL")).needs == {"admin"}
    assert not view.decide_folded(RESOURCE, "b", "file:///secret/key").allowed
    exposure = Exposure("b", "b", allow=("*",), deny=("Hidden_*",), rename={"Old_Name": "x"})
    assert exposure.withholds("HIDDEN_TOOL", fold("HIDDEN_TOOL"))
    assert exposure.withholds("old\u00ad_name", fold("old\u00ad_name"))
    assert not exposure.withholds("echo", "echo")


def test_the_lenient_server_would_run_every_spelling() -> None:
    """The cases are real bypasses: the test server runs the secret for each of them."""
    for spelling in SPELLINGS.values():
        assert lenient_server.find(spelling, lenient_server.TOOLS) == "secret_read", spelling
    for uri in DENIED_URIS:
        assert lenient_server.lenient_uri(uri) == "file:///secret/key", uri


# --- the dispatcher --------------------------------------------------------------------------


@pytest.mark.parametrize("forward_unknown", [False, True])
@pytest.mark.parametrize("spelling", list(SPELLINGS.values()), ids=list(SPELLINGS))
async def test_a_respelled_denied_tool_is_refused_as_unknown(
    tmp_path: Path, spelling: str, forward_unknown: bool
) -> None:
    d, backend = await gateway(tmp_path, forward_unknown=forward_unknown)
    reply = await call(d, "tools/call", name=spelling)
    assert code(reply) == codes.INVALID_PARAMS
    assert backend.ran() == []


@pytest.mark.parametrize("forward_unknown", [False, True])
@pytest.mark.parametrize(
    ("case", "name"),
    [
        ("filtered out", "HIDDEN_TOOL"),
        ("filtered out", "hidden\u200b_tool"),
        ("renamed away", "OLD_NAME"),
        ("renamed away", "old_name"),
        ("required without its scope", "ADMIN_TOOL"),
        ("required without its scope", "admin\u00ad_tool"),
    ],
)
async def test_a_respelled_withheld_tool_is_refused_as_unknown(
    tmp_path: Path, case: str, name: str, forward_unknown: bool
) -> None:
    d, backend = await gateway(tmp_path, forward_unknown=forward_unknown)
    assert code(await call(d, "tools/call", name=name)) == codes.INVALID_PARAMS, case
    assert backend.ran() == []


@pytest.mark.parametrize("forward_unknown", [False, True])
async def test_a_respelled_denied_prompt_is_refused_as_unknown(
    tmp_path: Path, forward_unknown: bool
) -> None:
    d, backend = await gateway(tmp_path, forward_unknown=forward_unknown)
    for name in ("SECRET_PROMPT", "secret\u200b_prompt", "\uff53ecret_prompt"):
        assert code(await call(d, "prompts/get", name=name)) == codes.INVALID_PARAMS, name
        ref = {"type": "ref/prompt", "name": name}
        assert code(await call(d, "completion/complete", ref=ref)) == codes.INVALID_PARAMS
    assert backend.ran() == []


DENIED_URIS = [
    "FILE:///secret/key",
    "file:///public/../secret/key",
    "file:///public%2f..%2fsecret/key",
    "file:///public/..%2Fsecret%2Fkey",  # matches the public template as typed
    "file:///public/%2e%2e/secret/key",
]


@pytest.mark.parametrize("forward_unknown", [False, True])
@pytest.mark.parametrize("uri", DENIED_URIS)
async def test_a_denied_resource_is_not_read_through_another_spelling(
    tmp_path: Path, uri: str, forward_unknown: bool
) -> None:
    d, backend = await gateway(tmp_path, forward_unknown=forward_unknown)
    assert code(await call(d, "resources/read", uri=uri)) == codes.INVALID_PARAMS
    assert backend.ran() == []


async def test_an_allowed_resource_is_forwarded_in_its_normal_form(tmp_path: Path) -> None:
    d, backend = await gateway(tmp_path)
    reply = await call(d, "resources/read", uri="FILE:///public/x/../readme")
    assert reply["result"]["contents"][0]["text"] == "public text"
    assert [m["params"]["uri"] for m in backend.ran()] == ["file:///public/readme"]
    # Under a policy a URI no catalog has goes nowhere without forward_unknown.
    assert code(await call(d, "resources/read", uri="other:///x")) == codes.INVALID_PARAMS
    assert len(backend.ran()) == 1


async def test_forward_unknown_forwards_other_names_and_uris(tmp_path: Path) -> None:
    d, backend = await gateway(tmp_path, forward_unknown=True)
    reply = await call(d, "tools/call", name="dynamic_tool")
    assert reply["result"]["content"][0]["text"] == "ran None: "
    assert "result" in await call(d, "resources/read", uri="other:///x")
    assert [m["method"] for m in backend.ran()] == ["tools/call", "resources/read"]


async def test_the_default_under_a_policy_forwards_no_unknown_name(tmp_path: Path) -> None:
    d, backend = await gateway(tmp_path)
    assert code(await call(d, "tools/call", name="dynamic_tool")) == codes.INVALID_PARAMS
    assert backend.ran() == []
    assert "result" in await call(d, "tools/call", name="echo")  # a known name: as ever
    assert len(backend.ran()) == 1


async def test_without_policy_or_limits_unknown_names_still_reach_the_backend(
    tmp_path: Path,
) -> None:
    """Transparency stays (README, single-backend transparency), except for a name that folds
    to a tool the filters or renames keep from clients."""
    d, backend = await gateway(tmp_path, policy=False)
    assert "result" in await call(d, "tools/call", name="SECRET_READ")
    assert [m["params"]["name"] for m in backend.ran()] == ["SECRET_READ"]
    for name in ("HIDDEN_TOOL", "hidden\u200b_tool", "OLD_NAME", "old_name"):
        assert code(await call(d, "tools/call", name=name)) == codes.INVALID_PARAMS, name
    assert len(backend.ran()) == 1


@pytest.mark.parametrize("forward_unknown", [False, True])
async def test_a_rate_limit_is_not_escaped_by_respelling(
    tmp_path: Path, forward_unknown: bool
) -> None:
    d, backend = await gateway(tmp_path, policy=False, limits=True, forward_unknown=forward_unknown)
    assert "result" in await call(d, "tools/call", name="echo")
    assert code(await call(d, "tools/call", name="echo")) == codes.RATE_LIMITED
    for name in ("ECHO", " echo", "\uff45cho"):
        assert code(await call(d, "tools/call", name=name)) == codes.INVALID_PARAMS, name
    assert len(backend.ran()) == 1


async def test_an_unlisted_rate_limited_tool_is_forwarded_only_as_configured(
    tmp_path: Path,
) -> None:
    """`forward_unknown` on: a tool the backend does not list but `rate_limits.tools` names is
    forwarded under that name, never under another spelling (which would have its own bucket)."""
    d, backend = await gateway(tmp_path, policy=False, limits=True, forward_unknown=True)
    assert "result" in await call(d, "tools/call", name="dyn_tool")
    assert code(await call(d, "tools/call", name="DYN_TOOL")) == codes.INVALID_PARAMS
    assert [m["params"]["name"] for m in backend.ran()] == ["dyn_tool"]


@pytest.mark.parametrize("method", ["tools/call", "prompts/get", "resources/read", "ping"])
async def test_a_request_sent_as_a_notification_is_dropped_and_logged_once(
    tmp_path: Path, method: str, caplog: pytest.LogCaptureFixture
) -> None:
    d, backend = await gateway(tmp_path)
    note = {"jsonrpc": "2.0", "method": method, "params": {"name": "secret_read"}}
    with caplog.at_level(logging.WARNING, logger="gateway"):
        for _ in range(3):
            await d.notify(note)
    assert backend.ran() == []
    assert len([r for r in caplog.records if "notification" in r.getMessage()]) == 1
    assert d.telemetry.stats.rejections["request_as_notification"] == 3
    # A notification proper still goes through.
    await d.notify({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"})
    assert [m["method"] for m in backend.ran()] == ["notifications/roots/list_changed"]
