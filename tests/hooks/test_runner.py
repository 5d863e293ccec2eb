"""The hook runner in memory (gateway/hooks/runner.py): a `HookedBackend` over an in-memory
backend, with the tests' own hooks (tests/support/hooks.py) loaded by path as a config names
them. Over real processes: tests/system/test_hooks_e2e.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.backends.base import Call
from gateway.caller_auth.identity import Identity
from gateway.config import ConfigInvalid, HookConfig, parse
from gateway.hooks.api import HookEvent, Refuse
from gateway.hooks.load import load_all
from gateway.hooks.runner import HookedBackend
from gateway.origin import Origin
from gateway.protocol import codes
from gateway.telemetry.api import Stats
from tests.support.hooks import REFUSAL_CODE
from tests.support.memory_backend import MemoryBackend, modern, tool_call

pytestmark = pytest.mark.anyio

ALICE = Call(Origin("http", identity=Identity(subject="alice")))
BOB = Call(Origin("http", identity=Identity(subject="bob")))
HOOKS = "tests.support.hooks"


def configs(*entries: dict[str, Any]) -> tuple[HookConfig, ...]:
    text = yaml.safe_dump(
        {
            "listen": {"stdio": True},
            "backends": {"b": {"stdio": {"command": "x"}}},
            "hooks": list(entries),
        }
    )
    return parse(text).hooks


def hooked(
    *entries: dict[str, Any], audit: list[dict[str, Any]] | None = None
) -> tuple[HookedBackend, MemoryBackend, Stats]:
    backend, stats = MemoryBackend("b"), Stats()
    hooks = load_all(configs(*entries), "hooks")
    return (
        HookedBackend(backend, hooks, stats, audit.append if audit is not None else None),
        backend,
        stats,
    )


async def ignore(_: Any) -> None:
    return None


async def test_a_refusing_hook_answers_with_its_own_error_and_the_backend_is_never_asked() -> None:
    audit: list[dict[str, Any]] = []
    layer, backend, stats = hooked({"use": f"{HOOKS}:refuse", "on": "request"}, audit=audit)
    reply = await layer.request(tool_call(7, "echo", text="hi"), ignore, BOB)
    assert reply["id"] == 7
    assert reply["error"]["code"] == REFUSAL_CODE
    assert reply["error"]["data"] == {"subject": "bob"}
    assert backend.calls() == []
    assert stats.hook_outcomes[(f"{HOOKS}:refuse", "refused")] == 1
    (line,) = audit
    assert line["outcome"] == "refused" and line["subject"] == "bob" and line["name"] == "echo"
    # The caller the hook lets through reaches the backend.
    reply = await layer.request(tool_call(8, "echo", text="hi"), ignore, ALICE)
    assert "result" in reply and len(backend.calls()) == 1
    assert stats.hook_outcomes[(f"{HOOKS}:refuse", "pass")] == 1


async def test_a_rewriting_hook_changes_the_request_and_the_result() -> None:
    layer, backend, stats = hooked({"use": f"{HOOKS}:rewrite"})
    reply = await layer.request(tool_call(1, "echo", text="hi"), ignore, ALICE)
    (sent,) = backend.calls()
    assert sent["params"]["arguments"] == {"text": "hooked: hi"}
    assert sent["params"]["_meta"]  # (the request's protocol fields stay)
    assert reply["result"]["content"][0]["text"] == "{'TEXT': 'HOOKED: HI'}"
    assert stats.hook_outcomes[(f"{HOOKS}:rewrite", "changed")] == 2


@pytest.mark.parametrize("use", ["hang", "hang_in_thread"])
async def test_a_hanging_hook_times_out_and_fails_closed(use: str) -> None:
    layer, backend, stats = hooked({"use": f"{HOOKS}:{use}", "on": "request", "timeout": 0.05})
    reply = await layer.request(tool_call(1, "echo", text="hi"), ignore, ALICE)
    assert reply["error"]["code"] == codes.HOOK_FAILED
    assert backend.calls() == []
    assert stats.hook_outcomes[(f"{HOOKS}:{use}", "timeout")] == 1


async def test_a_hanging_hook_with_on_error_allow_lets_the_request_pass() -> None:
    layer, _backend, stats = hooked({"use": f"{HOOKS}:hang", "timeout": 0.05, "on_error": "allow"})
    reply = await layer.request(tool_call(1, "echo", text="hi"), ignore, ALICE)
    assert reply["result"]["content"][0]["text"] == "{'text': 'hi'}"
    assert stats.hook_outcomes[(f"{HOOKS}:hang", "timeout")] == 2  # (request and result)


@pytest.mark.parametrize("use", ["raises", "wrong", "renames"])
async def test_a_hook_that_raises_or_answers_wrongly_fails_closed(use: str) -> None:
    audit: list[dict[str, Any]] = []
    layer, backend, stats = hooked({"use": f"{HOOKS}:{use}", "on": "request"}, audit=audit)
    reply = await layer.request(tool_call(1, "echo", text="hi"), ignore, ALICE)
    assert reply["error"]["code"] == codes.HOOK_FAILED
    assert backend.calls() == []
    assert stats.hook_outcomes[(f"{HOOKS}:{use}", "error")] == 1
    assert audit[0]["outcome"] == "error" and audit[0]["refused"] is True


async def test_a_hook_sees_only_the_methods_and_tools_it_is_configured_for() -> None:
    layer, _backend, stats = hooked({"use": f"{HOOKS}:raises", "on": "request", "tools": ["ec*"]})
    # resources/read is no method of its; `add` is not among its tools; tools/list never is.
    for msg in (
        modern(1, "resources/read", uri="mem://note"),
        tool_call(2, "add", a=1),
        modern(3, "tools/list"),
    ):
        reply = await layer.request(msg, ignore, ALICE)
        assert "result" in reply
    assert stats.hook_outcomes[(f"{HOOKS}:raises", "error")] == 0
    reply = await layer.request(tool_call(4, "echo"), ignore, ALICE)
    assert reply["error"]["code"] == codes.HOOK_FAILED


async def test_hooks_run_in_order_and_a_refusal_stops_the_rest() -> None:
    layer, _backend, stats = hooked(
        {"use": f"{HOOKS}:rewrite", "on": "request"},
        {"use": f"{HOOKS}:refuse", "on": "request"},
        {"use": f"{HOOKS}:raises", "on": "request"},
    )
    reply = await layer.request(tool_call(1, "echo", text="x"), ignore, BOB)
    assert reply["error"]["code"] == REFUSAL_CODE
    assert stats.hook_outcomes[(f"{HOOKS}:rewrite", "changed")] == 1
    assert stats.hook_outcomes[(f"{HOOKS}:raises", "error")] == 0


async def test_a_hook_is_handed_its_with_settings() -> None:
    layer, backend, _ = hooked({"use": f"{HOOKS}:options", "with": {"team": "ops", "n": 2}})
    await layer.request(tool_call(1, "echo"), ignore, ALICE)
    assert backend.calls()[0]["params"]["arguments"] == {"text": "n=2|team=ops"}


async def test_a_method_no_hook_sees_is_the_inner_call_itself() -> None:
    """No frame of the layer on the path of what no hook sees: the coroutine handed back is
    the backend's own."""
    layer, _backend, _ = hooked({"use": f"{HOOKS}:raises"})
    coro = layer.request(modern(1, "tools/list"), ignore, ALICE)
    assert coro.cr_code is MemoryBackend.request.__code__  # type: ignore[attr-defined]
    await coro


def test_metrics_list_each_hook_from_the_start() -> None:
    _, _, stats = hooked({"use": "redact"}, {"use": f"{HOOKS}:refuse"})
    assert set(stats.hook_outcomes) == {("redact", "pass"), (f"{HOOKS}:refuse", "pass")}


@pytest.mark.parametrize(
    "use",
    [
        f"{HOOKS}:no_such",
        "tests.support.no_such_module:f",
        "no_such_entry_point",
        f"{HOOKS}:REFUSAL_CODE",
    ],
)
def test_a_hook_that_cannot_be_loaded_is_a_config_problem(use: str) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        load_all(configs({"use": use}), "hooks")
    assert caught.value.problems[0].startswith("hooks.0.use: ")


def test_the_worked_example_of_the_docs_does_what_they_say() -> None:
    """docs/trusting-tools/hooks.md "A worked example", run as written."""
    doc = (Path(__file__).resolve().parents[2] / "docs/trusting-tools/hooks.md").read_text()
    example = doc.split("### A worked example", 1)[1].split("```python\n", 1)[1].split("```")[0]
    space: dict[str, Any] = {}
    exec(compile(example, "hooks.md", "exec"), space)
    hook = space["writers_only"]
    writer = Identity(subject="w", scopes=frozenset({"github:write"}))

    def event(stage: str, name: str, who: Identity | None, result: Any = None) -> HookEvent:
        params = {"name": name}
        return HookEvent(stage, "tools/call", params, result, "github", who, "http", {"team": "p"})  # type: ignore[arg-type]

    with pytest.raises(Refuse) as caught:
        hook(event("request", "create_issue", Identity(subject="r")))
    assert caught.value.code == -32051
    assert hook(event("request", "create_issue", writer)) is None
    assert hook(event("request", "search_issues", None)) is None
    tagged = hook(event("result", "search_issues", None, {"content": []}))
    assert tagged == {"content": [], "_meta": {"example.com/served-by": "p"}}


async def test_a_hook_handing_back_what_it_was_given_passes() -> None:
    layer, backend, stats = hooked({"use": f"{HOOKS}:same"})
    msg = tool_call(1, "echo", text="hi")
    reply = await layer.request(msg, ignore, ALICE)
    assert backend.calls() == [msg] and "result" in reply
    assert stats.hook_outcomes[(f"{HOOKS}:same", "pass")] == 2
    assert stats.hook_outcomes[(f"{HOOKS}:same", "changed")] == 0
