"""Policy rules on tool annotations and call arguments (gateway/core/policy.py, conditions.py),
pure: rules read from YAML by the real loader, tools' definitions from a dict standing for the
catalog. The hints and their defaults are the spec's (server/tools, Tool annotations:
ToolAnnotations); pointers are RFC 6901's."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.caller_auth.identity import CONFIGURED, Identity
from gateway.config import ConfigInvalid, PolicyConfig, parse
from gateway.core import conditions
from gateway.core.conditions import (
    DESTRUCTIVE,
    IDEMPOTENT,
    OPEN_WORLD,
    READ_ONLY,
    UNKNOWN,
    hints,
    resolve,
    same_json,
    tokens,
)
from gateway.core.policy import ALLOW, DENY, LISTING, PROMPT, RESOURCE, TOOL, Policy, Verdict
from tests.core.test_policy import who
from tests.support import ROOT

pytestmark = pytest.mark.fast

HEAD = (
    "listen: {stdio: true}\nbackends:\n  fs: {stdio: {command: x}}\n  ev: {stdio: {command: y}}\n"
)


def load(policy: str) -> PolicyConfig:
    config = parse(HEAD + "policy:\n" + policy)
    assert config.policy is not None
    return config.policy


def tool(name: str, **annotations: Any) -> dict[str, Any]:
    return {"name": name, "inputSchema": {"type": "object"}, "annotations": annotations}


# What the catalogs say (backend, own name) -> definition; a name not here is unknown.
CATALOG: dict[tuple[str, str], dict[str, Any]] = {
    ("fs", "read_file"): tool("read_file", readOnlyHint=True, openWorldHint=False),
    ("fs", "write_file"): tool("write_file", readOnlyHint=False, destructiveHint=True),
    ("fs", "mkdir"): tool("mkdir", readOnlyHint=False, destructiveHint=False, idempotentHint=True),
    ("fs", "bare"): {"name": "bare", "inputSchema": {"type": "object"}},  # no annotations
    ("ev", "search"): tool("search", readOnlyHint=True),  # open world by default
}


def policy(text: str, catalog: dict[tuple[str, str], dict[str, Any]] | None = None) -> Policy:
    shown = CATALOG if catalog is None else catalog
    return Policy(load(text), lambda backend, name: shown.get((backend, name)))


def decide(p: Policy, name: str, backend: str = "fs", identity: Any = None) -> Verdict:
    return p.decide(identity, TOOL, backend, name)


# --- the hints ------------------------------------------------------------------------------


def test_absent_hints_take_the_specs_defaults() -> None:
    # readOnlyHint false, destructiveHint true, idempotentHint false, openWorldHint true.
    assert hints({"name": "t"}) == DESTRUCTIVE | OPEN_WORLD
    assert hints(tool("t")) == DESTRUCTIVE | OPEN_WORLD
    assert hints({"name": "t", "annotations": None}) == DESTRUCTIVE | OPEN_WORLD


@pytest.mark.parametrize(
    ("given", "bits"),
    [
        ({"readOnlyHint": True}, READ_ONLY | IDEMPOTENT | OPEN_WORLD),
        ({"destructiveHint": False}, OPEN_WORLD),
        ({"idempotentHint": True}, DESTRUCTIVE | IDEMPOTENT | OPEN_WORLD),
        ({"openWorldHint": False}, DESTRUCTIVE),
        (
            {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": False},
            OPEN_WORLD,
        ),
    ],
)
def test_each_hint_given_sets_its_own_bit(given: dict[str, Any], bits: int) -> None:
    assert hints(tool("t", **given)) == bits


def test_a_read_only_tool_is_neither_destructive_nor_repeating_whatever_it_says() -> None:
    # destructiveHint and idempotentHint are meaningful only when readOnlyHint is false.
    said = tool("t", readOnlyHint=True, destructiveHint=True, idempotentHint=False)
    assert hints(said) == READ_ONLY | IDEMPOTENT | OPEN_WORLD


def test_a_hint_that_is_not_a_boolean_is_taken_as_absent() -> None:
    odd = tool("t", readOnlyHint="yes", destructiveHint=0, openWorldHint=None)
    assert hints(odd) == DESTRUCTIVE | OPEN_WORLD
    assert hints({"name": "t", "annotations": ["readOnlyHint"]}) == DESTRUCTIVE | OPEN_WORLD


def test_no_definition_is_unknown() -> None:
    assert hints(None) == UNKNOWN


# --- rules on annotations ---------------------------------------------------------------------


def test_deny_destructive_hides_the_destructive_tools_and_only_them() -> None:
    p = policy("  rules:\n    - deny: {tools: ['*'], annotations: {destructiveHint: true}}\n")
    assert decide(p, "write_file") == DENY
    assert decide(p, "bare") == DENY  # no annotations: destructive by default
    assert decide(p, "read_file") == ALLOW
    assert decide(p, "mkdir") == ALLOW
    assert decide(p, "search", "ev") == ALLOW


@pytest.mark.parametrize(
    ("hint", "value", "denied"),
    [
        ("readOnlyHint", "true", {"read_file", "search"}),
        ("readOnlyHint", "false", {"write_file", "mkdir", "bare"}),
        ("destructiveHint", "false", {"read_file", "mkdir", "search"}),
        ("idempotentHint", "true", {"read_file", "mkdir", "search"}),
        ("idempotentHint", "false", {"write_file", "bare"}),
        ("openWorldHint", "true", {"write_file", "mkdir", "bare", "search"}),
        ("openWorldHint", "false", {"read_file"}),
    ],
)
def test_every_hint_can_be_matched_either_way(hint: str, value: str, denied: set[str]) -> None:
    p = policy(f"  rules:\n    - deny: {{annotations: {{{hint}: {value}}}}}\n")
    got = {name for (backend, name) in CATALOG if decide(p, name, backend) == DENY}
    assert got == denied


def test_every_hint_given_must_hold() -> None:
    rule = "{annotations: {readOnlyHint: false, idempotentHint: true}}"
    p = policy(f"  rules:\n    - deny: {rule}\n")
    assert decide(p, "mkdir") == DENY
    assert decide(p, "write_file") == ALLOW  # not idempotent


def test_read_only_tools_only_by_default_deny_and_an_allow() -> None:
    p = policy("  default: deny\n  rules:\n    - allow: {annotations: {readOnlyHint: true}}\n")
    assert decide(p, "read_file") == ALLOW
    assert decide(p, "search", "ev") == ALLOW
    assert decide(p, "write_file") == DENY
    assert decide(p, "bare") == DENY


def test_a_rule_on_annotations_covers_tools_alone() -> None:
    p = policy("  rules:\n    - deny: {annotations: {readOnlyHint: false}}\n")
    assert p.decide(None, PROMPT, "fs", "write_file") == ALLOW
    assert p.decide(None, RESOURCE, "fs", "file:///x") == ALLOW
    strict = policy("  default: deny\n  rules:\n    - allow: {annotations: {readOnlyHint: true}}\n")
    assert strict.decide(None, PROMPT, "fs", "read_file") == DENY  # the allow is not for it


def test_names_and_backends_narrow_a_rule_on_annotations() -> None:
    p = policy(
        "  rules:\n    - deny: {backends: [fs], tools: ['w*'],"
        " annotations: {destructiveHint: true}}\n"
    )
    assert decide(p, "write_file") == DENY
    assert decide(p, "bare") == ALLOW  # destructive, but not a w* name


def test_a_tool_no_catalog_describes_is_judged_the_strict_way() -> None:
    # Fail closed: a deny's or require's annotations are met, an allow's are not.
    deny = policy("  rules:\n    - deny: {annotations: {readOnlyHint: true}}\n")
    assert decide(deny, "ghost") == DENY
    allow = policy("  default: deny\n  rules:\n    - allow: {annotations: {readOnlyHint: true}}\n")
    assert decide(allow, "ghost") == DENY
    require = policy(
        "  rules:\n    - require: {annotations: {destructiveHint: false}}\n      scopes: [admin]\n"
    )
    assert decide(require, "ghost") == Verdict(False, frozenset({"admin"}))


def test_without_a_catalog_every_tool_is_unknown() -> None:
    p = Policy(load("  rules:\n    - deny: {annotations: {readOnlyHint: true}}\n"))
    assert p.decide(None, TOOL, "fs", "read_file") == DENY
    p.consult(lambda backend, name: CATALOG.get((backend, name)))
    assert p.decide(None, TOOL, "fs", "write_file") == ALLOW
    assert p.decide(None, TOOL, "fs", "read_file") == DENY


def test_destructive_tools_need_a_scope_by_require() -> None:
    p = policy(
        "  rules:\n    - require: {annotations: {destructiveHint: true}}\n"
        "      scopes: [fs:write]\n"
    )
    assert decide(p, "write_file", identity=who(scopes="fs:read")) == Verdict(
        False, frozenset({"fs:write"})
    )
    assert decide(p, "write_file", identity=who(scopes="fs:write")) == ALLOW
    assert decide(p, "read_file", identity=who()) == ALLOW


def test_when_narrows_a_rule_on_annotations_to_its_callers() -> None:
    p = policy(
        "  rules:\n    - deny: {annotations: {readOnlyHint: false}}\n"
        "      when: {clients: [reader]}\n"
    )
    reader = Identity("bot", "reader", "https://as", frozenset(), {}, CONFIGURED)
    assert decide(p, "write_file", identity=reader) == DENY
    assert decide(p, "read_file", identity=reader) == ALLOW
    assert decide(p, "write_file", identity=who()) == ALLOW  # another client
    assert decide(p, "write_file") == ALLOW  # anonymous: meets no condition


def test_a_changed_definition_is_judged_afresh() -> None:
    catalog = dict(CATALOG)
    p = policy("  rules:\n    - deny: {annotations: {destructiveHint: true}}\n", catalog)
    assert decide(p, "mkdir") == ALLOW
    catalog["fs", "mkdir"] = tool("mkdir", destructiveHint=True)
    assert decide(p, "mkdir") == DENY


def test_a_listed_definition_is_judged_by_what_it_says() -> None:
    p = policy("  rules:\n    - deny: {annotations: {destructiveHint: true}}\n")
    view = p.view(None)
    assert view.decide_tool("fs", "read_file", tool("read_file", destructiveHint=True)) == DENY
    assert view.decide_tool("fs", "write_file", tool("write_file", readOnlyHint=True)) == ALLOW


# --- the fast path ----------------------------------------------------------------------------


def test_a_policy_on_names_alone_never_reads_a_definition() -> None:
    def never(backend: str, name: str) -> None:
        raise AssertionError("a definition was read")

    p = Policy(load("  rules:\n    - deny: {tools: ['write_*']}\n"), never)
    assert not p.inspects
    view = p.view(who())
    assert not view.inspects
    assert view.decide(TOOL, "fs", "write_file") == DENY
    assert view.decide_call("fs", "read_file", {"path": "/x"}) == ALLOW


def test_callers_no_rule_on_annotations_applies_to_get_a_plain_view() -> None:
    p = policy(
        "  rules:\n    - deny: {annotations: {readOnlyHint: false}}\n"
        "      when: {subjects: [intern]}\n"
    )
    assert p.inspects
    assert not p.view(who("ann")).inspects
    assert p.view(who("intern")).inspects


# --- argument conditions ------------------------------------------------------------------------


def test_pointers_unescape_and_reach_members_and_items() -> None:
    doc = {"a/b": {"m~n": [10, {"x": "y"}]}, "": 1}
    assert tokens("/a~1b/m~0n/1/x") == ("a/b", "m~n", "1", "x")
    assert resolve(doc, tokens("/a~1b/m~0n/1/x")) == "y"
    assert resolve(doc, tokens("/a~1b/m~0n/0")) == 10
    assert resolve(doc, tokens("/")) == 1  # the member named ""
    assert resolve(doc, tokens("")) is doc
    for absent in ("/nope", "/a~1b/m~0n/2", "/a~1b/m~0n/01", "/a~1b/m~0n/-", "/a~1b/m~0n/0/x"):
        assert resolve(doc, tokens(absent)) is conditions._ABSENT


def test_equality_is_of_json_values() -> None:
    assert same_json("read", "read") and not same_json("Read", "read")
    assert same_json(1, 1) and same_json(1.0, 1) and not same_json("1", 1)
    assert same_json(True, True) and not same_json(1, True) and not same_json(True, 1)
    assert not same_json(None, "null") and not same_json(["read"], "read")


def call(p: Policy, name: str, arguments: object, identity: Any = None) -> Verdict:
    return p.view(identity).decide_call("fs", name, arguments)


def test_deny_by_an_argument_glob_refuses_only_the_calls_that_match() -> None:
    p = policy("  rules:\n    - deny: {tools: [read_file], arguments: {/path: {glob: '/etc/*'}}}\n")
    assert call(p, "read_file", {"path": "/etc/shadow"}) == DENY
    assert call(p, "read_file", {"path": "/etc/ssl/certs/x"}) == DENY  # * crosses /
    assert call(p, "read_file", {"path": "/tmp/etc/x"}) == ALLOW  # the whole value, anchored
    assert call(p, "read_file", {"path": 7}) == ALLOW  # a glob matches strings only
    assert call(p, "read_file", {}) == ALLOW  # nothing there: the condition does not hold
    assert call(p, "read_file", None) == ALLOW
    assert call(p, "write_file", {"path": "/etc/shadow"}) == ALLOW  # another tool


def test_allow_by_an_argument_equals_allows_only_that_value() -> None:
    p = policy(
        "  default: deny\n  rules:\n"
        "    - allow: {tools: [mkdir], arguments: {/mode: {equals: read}, /opts/0: {equals: 1}}}\n"
    )
    assert call(p, "mkdir", {"mode": "read", "opts": [1]}) == ALLOW
    assert call(p, "mkdir", {"mode": "read", "opts": [True]}) == DENY  # true is not 1
    assert call(p, "mkdir", {"mode": "write", "opts": [1]}) == DENY
    assert call(p, "mkdir", {"mode": "read"}) == DENY  # every condition must hold


def test_a_list_shows_what_some_call_may_be_allowed() -> None:
    p = policy(
        "  default: deny\n  rules:\n"
        "    - allow: {tools: [read_file, write_file], arguments: {/path: {glob: '/tmp/*'}}}\n"
        "    - deny: {tools: [read_file], arguments: {/path: {glob: '*..*'}}}\n"
    )
    view = p.view(None)
    assert view.decide(TOOL, "fs", "read_file").visible  # a deny on arguments hides nothing
    assert view.decide(TOOL, "fs", "write_file").visible  # an allow on them may allow a call
    assert not view.decide(TOOL, "fs", "mkdir").visible
    assert call(p, "read_file", {"path": "/tmp/a"}) == ALLOW
    assert call(p, "read_file", {"path": "/tmp/../etc/shadow"}) == DENY
    assert call(p, "write_file", {"path": "/etc/x"}) == DENY
    assert view._judge(TOOL, "fs", "read_file", arguments=LISTING) == ALLOW


def test_require_on_arguments_asks_for_scopes_only_for_those_calls() -> None:
    p = policy(
        "  rules:\n    - require: {tools: [write_file], arguments: {/force: {equals: true}}}\n"
        "      scopes: [fs:force]\n"
    )
    assert call(p, "write_file", {"force": False}) == ALLOW
    assert call(p, "write_file", {"force": True}) == Verdict(False, frozenset({"fs:force"}))
    assert call(p, "write_file", {"force": True}, who(scopes="fs:force")) == ALLOW


def test_annotations_and_arguments_together_must_both_hold() -> None:
    p = policy(
        "  rules:\n    - deny: {annotations: {destructiveHint: true},"
        " arguments: {/path: {glob: '/srv/*'}}}\n"
    )
    assert call(p, "write_file", {"path": "/srv/a"}) == DENY
    assert call(p, "write_file", {"path": "/tmp/a"}) == ALLOW
    assert call(p, "mkdir", {"path": "/srv/a"}) == ALLOW  # not destructive
    assert call(p, "ghost", {"path": "/srv/a"}) == DENY  # unknown: strict


# --- the config -------------------------------------------------------------------------------


def test_the_rule_shape_is_read_as_written() -> None:
    config = load(
        "  rules:\n    - deny: {tools: ['*'], annotations: {destructiveHint: true}}\n"
        "    - deny: {tools: [read_file], arguments: {/path: {glob: '/etc/*'}, /n: {equals: 2}}}\n"
    )
    first, second = config.rules
    assert first.target.annotations is not None
    assert first.target.annotations.destructive is True
    assert first.target.annotations.read_only is None
    assert second.target.arguments["/path"].glob == "/etc/*"
    assert second.target.arguments["/n"].equals == 2


@pytest.mark.parametrize(
    ("rule", "where"),
    [
        (
            "deny: {annotations: {readOnlyHint: maybe}}",
            "policy.rules.0.deny.annotations.readOnlyHint",
        ),
        ("deny: {annotations: {readonly: true}}", "policy.rules.0.deny.annotations.readonly"),
        ("deny: {annotations: {}}", "policy.rules.0.deny.annotations"),
        ("deny: {annotations: true}", "policy.rules.0.deny.annotations"),
        ("deny: {prompts: [p], annotations: {readOnlyHint: true}}", "policy.rules.0.deny"),
        ("deny: {resources: [r], arguments: {/a: {equals: 1}}}", "policy.rules.0.deny"),
        ("deny: {arguments: {path: {equals: 1}}}", "policy.rules.0.deny.arguments.path"),
        ("deny: {arguments: {/a~2: {equals: 1}}}", "policy.rules.0.deny.arguments./a~2"),
        ("deny: {arguments: {/a: {}}}", "policy.rules.0.deny.arguments./a"),
        ("deny: {arguments: {/a: {equals: 1, glob: x}}}", "policy.rules.0.deny.arguments./a"),
        ("deny: {arguments: {/a: {equals: [1]}}}", "policy.rules.0.deny.arguments./a.equals"),
        (
            "deny: {arguments: {/a: {equals: 2024-01-01}}}",
            "policy.rules.0.deny.arguments./a.equals",
        ),
        ("deny: {arguments: {/a: {glob: 5}}}", "policy.rules.0.deny.arguments./a.glob"),
        ("deny: {arguments: {/a: {regex: x}}}", "policy.rules.0.deny.arguments./a.regex"),
        ("deny: {arguments: [/a]}", "policy.rules.0.deny.arguments"),
        ("deny: {arguments: {}}", "policy.rules.0.deny.arguments"),
    ],
)
def test_a_bad_rule_on_annotations_or_arguments_names_its_line_and_path(
    rule: str, where: str
) -> None:
    text = HEAD + "policy:\n  rules:\n    - allow: {}\n\n    - " + rule + "\n"
    with pytest.raises(ConfigInvalid) as caught:
        parse(text, "gw.yaml")
    wanted = where.replace("rules.0", "rules.1")
    line = text.splitlines().index("    - " + rule) + 1
    assert any(p.startswith(f"gw.yaml:{line}: {wanted}:") for p in caught.value.problems), (
        caught.value.problems
    )


def test_the_docs_examples_load_and_mean_what_they_say() -> None:
    """Every whole `policy:` or `servers:` example of docs/trusting-tools/annotations.md."""
    text = (ROOT / "docs" / "trusting-tools" / "annotations.md").read_text(encoding="utf-8")
    blocks = [b.split("```", 1)[0] for b in text.split("```yaml\n")[1:]]
    whole = [b for b in blocks if b.startswith(("policy:", "servers:"))]
    assert len(whole) >= 6
    head = "listen: {http: {port: 0}}\nbackends:\n" + "".join(
        f"  {b}: {{stdio: {{command: x}}}}\n" for b in ("files", "github")
    )
    for block in whole:
        config = parse(head + block)
        assert config.policy is not None or config.servers, block
    readonly = parse(head + next(b for b in whole if b.startswith("servers:")))
    (server,) = readonly.servers
    assert server.policy is not None
    p = Policy(server.policy, lambda backend, name: CATALOG.get(("fs", name)))
    assert p.decide(None, TOOL, "files", "write_file") == DENY
    assert p.decide(None, TOOL, "files", "read_file") == ALLOW
