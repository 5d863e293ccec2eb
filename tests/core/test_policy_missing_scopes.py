"""`when: {missing_scopes: [...]}` (gateway/core/policy.py, config/policy.py), pure: a rule for
callers that lack a scope, so "deny destructive tools to callers without scope X" hides and
refuses them for those callers only, rather than listing them behind a step-up (`require`,
basic/authorization, Scope Challenge Handling). Rules read from YAML by the real loader."""

from __future__ import annotations

import pytest

from gateway.config import ConfigInvalid, parse
from gateway.core.policy import ALLOW, DENY, PROMPT, TOOL, Verdict
from tests.core.test_policy import who
from tests.core.test_policy_annotations import HEAD, decide, load, policy

pytestmark = pytest.mark.fast

DENY_DESTRUCTIVE = (
    "  rules:\n    - deny: {tools: ['*'], annotations: {destructiveHint: true}}\n"
    "      when: {missing_scopes: [tools:write]}\n"
)


def test_destructive_tools_are_denied_to_callers_without_the_scope_only() -> None:
    p = policy(DENY_DESTRUCTIVE)
    writer = who("ann", "tools:write other")
    reader = who("bob", "tools:read")
    # write_file says destructive, `bare` says nothing (destructive by the spec's default).
    for name in ("write_file", "bare"):
        assert decide(p, name, identity=reader) == DENY
        assert decide(p, name, identity=writer) == ALLOW
    # Hidden, not a step-up: nothing to list, no scope to name.
    assert not p.decide(reader, TOOL, "fs", "write_file").visible
    # What the rule does not select stays allowed to every caller.
    for name in ("read_file", "mkdir"):
        assert decide(p, name, identity=reader) == ALLOW
    # A call is judged by the same catalog definition.
    assert p.view(reader).decide_call("fs", "write_file", {"path": "/x"}) == DENY
    assert p.view(writer).decide_call("fs", "write_file", {"path": "/x"}) == ALLOW


def test_an_anonymous_caller_lacks_every_scope() -> None:
    p = policy(DENY_DESTRUCTIVE)
    assert decide(p, "write_file", identity=None) == DENY
    assert decide(p, "read_file", identity=None) == ALLOW


def test_an_anonymous_caller_still_meets_no_other_condition() -> None:
    # Every condition given must hold: anonymous has no client id, so the rule is not for it.
    p = policy(
        "  rules:\n    - deny: {annotations: {destructiveHint: true}}\n"
        "      when: {missing_scopes: [tools:write], clients: [cli]}\n"
    )
    assert decide(p, "write_file", identity=None) == ALLOW
    assert decide(p, "write_file", identity=who("ann")) == DENY  # who(): client id "cli"
    assert decide(p, "write_file", identity=who("ann", "tools:write")) == ALLOW


def test_lacking_any_one_of_several_scopes_is_enough() -> None:
    p = policy(
        "  rules:\n    - deny: {annotations: {destructiveHint: true}}\n"
        "      when: {missing_scopes: [tools:write, fs:admin]}\n"
    )
    assert decide(p, "write_file", identity=who("a", "tools:write")) == DENY
    assert decide(p, "write_file", identity=who("a", "fs:admin")) == DENY
    assert decide(p, "write_file", identity=who("a", "tools:write fs:admin")) == ALLOW


def test_it_combines_with_scopes_held() -> None:
    # For callers who may read but not write: held `read`, lacking `write`.
    p = policy(
        "  rules:\n    - deny: {annotations: {readOnlyHint: false}}\n"
        "      when: {scopes: [read], missing_scopes: [write]}\n"
    )
    assert decide(p, "mkdir", identity=who("a", "read")) == DENY
    assert decide(p, "mkdir", identity=who("a", "read write")) == ALLOW
    assert decide(p, "mkdir", identity=who("a")) == ALLOW  # holds no `read`: not for it
    assert decide(p, "read_file", identity=who("a", "read")) == ALLOW


def test_on_names_alone_it_denies_prompts_and_tools_alike() -> None:
    p = policy("  rules:\n    - deny: {backends: [ev]}\n      when: {missing_scopes: [ev]}\n")
    assert p.decide(who("a"), PROMPT, "ev", "p") == DENY
    assert p.decide(who("a", "ev"), PROMPT, "ev", "p") == ALLOW
    assert p.decide(None, TOOL, "ev", "search") == DENY
    assert p.decide(None, TOOL, "fs", "read_file") == ALLOW


def test_callers_alike_share_a_view_and_the_lookup_is_skipped_for_those_with_the_scope() -> None:
    p = policy(DENY_DESTRUCTIVE)
    assert p.view(who("a", "tools:write")) is p.view(who("b", "tools:write x"))
    assert p.view(who("a")) is p.view(None)
    # The rule is inactive for a caller with the scope: its view reads no definition.
    assert not p.view(who("a", "tools:write")).inspects
    assert p.view(who("a")).inspects


def test_require_stays_the_step_up_alternative() -> None:
    # The same intent with require: listed to everyone, a call without the scope names it.
    p = policy(
        "  rules:\n    - require: {annotations: {destructiveHint: true}}\n"
        "      scopes: [tools:write]\n"
    )
    assert decide(p, "write_file", identity=who("a")) == Verdict(False, frozenset({"tools:write"}))
    assert p.decide(who("a"), TOOL, "fs", "write_file").visible


def test_the_loader_reads_missing_scopes() -> None:
    rule = load(DENY_DESTRUCTIVE).rules[0]
    assert rule.when is not None and rule.when.missing_scopes == ("tools:write",)
    assert rule.when.scopes == ()


@pytest.mark.parametrize(
    ("when", "where"),
    [
        ("{missing_scopes: ['a b']}", "policy.rules.0.when.missing_scopes.0"),
        ("{missing_scopes: write}", "policy.rules.0.when.missing_scopes"),
        # Holding all of them and lacking one of them: never true, surely a mistake.
        ("{scopes: [a, b], missing_scopes: [b]}", "policy.rules.0.when.missing_scopes"),
    ],
)
def test_a_bad_missing_scopes_is_refused_naming_its_path(when: str, where: str) -> None:
    text = HEAD + f"policy:\n  rules:\n    - deny: {{tools: [x]}}\n      when: {when}\n"
    with pytest.raises(ConfigInvalid) as caught:
        parse(text, "gw.yaml")
    assert any(f": {where}:" in p for p in caught.value.problems), caught.value.problems
