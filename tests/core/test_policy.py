"""The policy evaluator (gateway/core/policy.py), pure: rules read from YAML by the real loader,
judged for callers built as the front ends build them. Insufficient scope is the step-up case
of the authorization spec (basic/authorization, Scope Challenge Handling)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.caller_auth.identity import CONFIGURED, Identity
from gateway.config import ConfigInvalid, PolicyConfig, describe, parse
from gateway.core import policy as policies
from gateway.core.policy import ALLOW, DENY, PROMPT, RESOURCE, TEMPLATE, TOOL, Policy, Verdict
from tests.support import PYTHON, ROOT

HEAD = (
    "listen: {stdio: true}\nbackends:\n  gh: {stdio: {command: x}}\n  docs: {stdio: {command: y}}\n"
)


def load(policy: str) -> PolicyConfig:
    config = parse(HEAD + "policy:\n" + policy)
    assert config.policy is not None
    return config.policy


def who(subject: str = "ann", scopes: str = "", **claims: Any) -> Identity:
    return Identity(subject, "cli", "https://as", frozenset(scopes.split()), claims, CONFIGURED)


def test_no_rules_and_default_allow_allows_everything_even_anonymous() -> None:
    p = Policy(load("  default: allow\n"))
    assert p.decide(None, TOOL, "gh", "anything") == ALLOW
    assert p.decide(who(), RESOURCE, "docs", "file:///x") == ALLOW


def test_default_deny_denies_what_no_rule_allows() -> None:
    p = Policy(
        load(
            "  default: deny\n  rules:\n    - allow: {backends: [docs]}\n"
            "    - allow: {backends: [gh], tools: ['get_*']}\n"
        )
    )
    assert p.decide(None, TOOL, "docs", "search") == ALLOW
    assert p.decide(None, PROMPT, "docs", "summary") == ALLOW  # a target naming no kind: all
    assert p.decide(None, TOOL, "gh", "get_issue") == ALLOW
    assert p.decide(None, TOOL, "gh", "create_issue") == DENY
    assert p.decide(None, PROMPT, "gh", "get_x") == DENY  # tools globs say nothing of prompts


def test_deny_wins_over_allow_in_any_order() -> None:
    for rules in (
        "    - allow: {tools: ['*']}\n    - deny: {tools: ['delete_*']}\n",
        "    - deny: {tools: ['delete_*']}\n    - allow: {tools: ['*']}\n",
    ):
        p = Policy(load("  default: deny\n  rules:\n" + rules))
        assert p.decide(who(), TOOL, "gh", "delete_repo") == DENY
        assert p.decide(who(), TOOL, "gh", "list_repos") == ALLOW


def test_deny_wins_over_a_satisfied_require() -> None:
    p = Policy(
        load(
            "  rules:\n    - require: {tools: ['x']}\n      scopes: [w]\n"
            "    - deny: {tools: ['x']}\n      when: {subjects: [bob]}\n"
        )
    )
    assert p.decide(who("bob", "w"), TOOL, "gh", "x") == DENY
    assert p.decide(who("ann", "w"), TOOL, "gh", "x") == ALLOW


def test_globs_match_the_whole_name_and_backends_narrow_a_rule() -> None:
    p = Policy(load("  rules:\n    - deny: {backends: [gh], tools: ['create_*', 'x?z']}\n"))
    assert p.decide(None, TOOL, "gh", "create_issue") == DENY
    assert p.decide(None, TOOL, "gh", "xyz") == DENY
    assert p.decide(None, TOOL, "gh", "xyzz") == ALLOW
    assert p.decide(None, TOOL, "gh", "do_create_issue") == ALLOW
    assert p.decide(None, TOOL, "docs", "create_issue") == ALLOW


def test_resource_globs_judge_resources_and_templates_by_their_uri_text() -> None:
    p = Policy(load("  rules:\n    - deny: {resources: ['file:///secret/*']}\n"))
    assert p.decide(None, RESOURCE, "docs", "file:///secret/a/b.txt") == DENY
    assert p.decide(None, TEMPLATE, "docs", "file:///secret/{name}") == DENY
    assert p.decide(None, RESOURCE, "docs", "file:///public/a") == ALLOW
    assert p.decide(None, TOOL, "docs", "file:///secret/a") == ALLOW


def test_require_asks_for_its_scopes_and_a_token_with_them_is_allowed() -> None:
    p = Policy(
        load(
            "  default: deny\n  rules:\n    - require: {backends: [gh], tools: ['create_*']}\n"
            "      scopes: [repo:write]\n"
        )
    )
    needs = Verdict(False, frozenset({"repo:write"}))
    assert p.decide(who(scopes="repo:read"), TOOL, "gh", "create_issue") == needs
    assert p.decide(None, TOOL, "gh", "create_issue") == needs  # anonymous: never has them
    assert needs.visible and not needs.allowed
    # A satisfied requirement allows, even under default deny: "this needs X" means "with X".
    assert p.decide(who(scopes="repo:read repo:write"), TOOL, "gh", "create_issue") == ALLOW
    assert p.decide(who(scopes="repo:write"), TOOL, "gh", "delete_issue") == DENY


def test_one_challenge_names_every_scope_the_call_needs() -> None:
    # (basic/authorization, Runtime Insufficient Scope Errors: all the scopes in one challenge)
    p = Policy(
        load(
            "  rules:\n    - require: {tools: ['admin_*']}\n      scopes: [admin]\n"
            "    - require: {backends: [gh]}\n      scopes: [gh]\n"
        )
    )
    assert p.decide(who(scopes="gh"), TOOL, "gh", "admin_x").needs == {"admin", "gh"}
    assert p.decide(who(scopes="admin"), TOOL, "gh", "admin_x").needs == {"admin", "gh"}
    assert p.decide(who(scopes="admin gh"), TOOL, "gh", "admin_x") == ALLOW
    assert p.decide(who(), TOOL, "docs", "admin_x").needs == {"admin"}


def test_when_scopes_need_all_subjects_and_clients_need_one() -> None:
    p = Policy(
        load(
            "  default: deny\n  rules:\n    - allow: {tools: [a]}\n      when: {scopes: [s1, s2]}\n"
            "    - allow: {tools: [b]}\n      when: {subjects: [ann, bob], clients: [cli]}\n"
        )
    )
    assert p.decide(who(scopes="s1 s2"), TOOL, "gh", "a") == ALLOW
    assert p.decide(who(scopes="s1"), TOOL, "gh", "a") == DENY
    assert p.decide(who("bob"), TOOL, "gh", "b") == ALLOW
    assert p.decide(who("carl"), TOOL, "gh", "b") == DENY
    other_client = Identity("ann", "web", None, frozenset(), {}, CONFIGURED)
    assert p.decide(other_client, TOOL, "gh", "b") == DENY
    assert p.decide(None, TOOL, "gh", "a") == DENY  # anonymous meets no condition


@pytest.mark.parametrize(
    ("claim", "wanted", "matches"),
    [
        ("admins", "admins", True),
        ("users", "admins", False),
        (["users", "admins"], "admins", True),
        (["users"], "admins", False),
        (True, "true", True),
        (False, "true", False),
        (3, "3", True),
        (None, "admins", False),
        ({"nested": "admins"}, "admins", False),
    ],
)
def test_claims_match_equal_values_and_list_members(
    claim: object, wanted: str, matches: bool
) -> None:
    assert policies.claim_matches(claim, wanted) is matches


def test_claims_in_when_come_from_the_identity() -> None:
    p = Policy(
        load(
            "  rules:\n    - deny: {backends: [gh]}\n"
            "      when: {claims: {group: interns, mfa: false}}\n"
        )
    )
    assert p.decide(who(group=["staff", "interns"], mfa=False), TOOL, "gh", "x") == DENY
    assert p.decide(who(group=["interns"], mfa=True), TOOL, "gh", "x") == ALLOW
    assert p.decide(who(), TOOL, "gh", "x") == ALLOW


def test_an_empty_when_is_every_caller() -> None:
    p = Policy(load("  rules:\n    - deny: {tools: [x]}\n      when: {}\n"))
    assert p.decide(None, TOOL, "gh", "x") == DENY


def test_callers_alike_share_a_view_and_decisions_are_cached() -> None:
    p = Policy(load("  rules:\n    - deny: {tools: [x]}\n      when: {scopes: [s]}\n"))
    a, b, c = who("ann", "s t"), who("bob", "s"), who("carl")
    assert p.view(a) is p.view(b)
    assert p.view(a) is not p.view(c)
    view = p.view(a)
    assert view.decide(TOOL, "gh", "x") is view.decide(TOOL, "gh", "x")


def test_the_decision_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policies, "MAX_DECISIONS", 10)
    view = Policy(load("  rules:\n    - deny: {tools: ['x*']}\n")).view(None)
    for i in range(25):
        assert view.decide(TOOL, "gh", f"x{i}") == DENY
    assert len(view._decisions) <= 10


def test_the_view_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policies, "MAX_VIEWS", 2)
    rules = "".join(
        f"    - deny: {{tools: [t{i}]}}\n      when: {{scopes: [s{i}]}}\n" for i in range(4)
    )
    p = Policy(load("  rules:\n" + rules))
    for i in range(4):
        assert p.decide(who(scopes=f"s{i}"), TOOL, "gh", f"t{i}") == DENY
    assert len(p._views) <= 2


@pytest.mark.parametrize(
    ("policy", "where"),
    [
        ("  default: maybe\n", "policy.default"),
        ("  rules: {allow: {}}\n", "policy.rules"),
        ("  rules:\n    - {}\n", "policy.rules.0"),
        ("  rules:\n    - {allow: {}, deny: {}}\n", "policy.rules.0"),
        ("  rules:\n    - allow: {backends: [nope]}\n", "policy.rules.0.allow.backends.0"),
        ("  rules:\n    - allow: {tools: x}\n", "policy.rules.0.allow.tools"),
        ("  rules:\n    - allow: {}\n      scopes: [a]\n", "policy.rules.0.scopes"),
        ("  rules:\n    - require: {}\n", "policy.rules.0.scopes"),
        ("  rules:\n    - require: {}\n      scopes: ['a b']\n", "policy.rules.0.scopes.0"),
        ("  rules:\n    - allow: {}\n      when: {groups: [a]}\n", "policy.rules.0.when.groups"),
    ],
)
def test_a_bad_policy_is_refused_naming_its_line_and_path(policy: str, where: str) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        parse(HEAD + "policy:\n" + policy, "gw.yaml")
    assert any(f": {where}:" in p and p.startswith("gw.yaml:") for p in caught.value.problems)


def test_the_stdio_identity_is_read_from_listen_stdio() -> None:
    config = parse(
        "listen:\n  stdio:\n    identity: {subject: ci, client_id: bot, scopes: [a, b],"
        " claims: {team: core}}\nbackends: {b: {stdio: {command: x}}}\n"
    )
    assert config.listen.stdio
    who = config.listen.stdio_identity
    assert who is not None
    assert (who.subject, who.client_id, who.scopes, dict(who.claims)) == (
        "ci",
        "bot",
        ("a", "b"),
        {"team": "core"},
    )
    plain = parse("listen: {stdio: true}\nbackends: {b: {stdio: {command: x}}}\n")
    assert plain.listen.stdio and plain.listen.stdio_identity is None


@pytest.mark.parametrize(
    ("stdio", "where"),
    [
        ("5", "listen.stdio"),
        ("{identity: {}}", "listen.stdio.identity.subject"),
        ("{identity: {subject: a, scopes: ['x y']}}", "listen.stdio.identity.scopes.0"),
        ("{who: a}", "listen.stdio.who"),
    ],
)
def test_a_bad_stdio_identity_is_refused(stdio: str, where: str) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        parse(f"listen:\n  stdio: {stdio}\nbackends: {{b: {{stdio: {{command: x}}}}}}\n")
    assert any(f": {where}:" in p for p in caught.value.problems)


def test_the_commented_example_policy_in_config_example_yaml_loads() -> None:
    text = (ROOT / "config.example.yaml").read_text(encoding="utf-8")
    start = text.index("# policy:")
    block = "\n".join(line.removeprefix("# ") for line in text[start:].splitlines())
    config = parse(text[:start] + block, env={"MCP_GATEWAY_PYTHON": PYTHON})
    assert config.policy is not None and len(config.policy.rules) == 3
    assert [r.effect for r in config.policy.rules] == ["deny", "require", "allow"]


def test_check_config_describes_the_policy_and_the_stdio_identity() -> None:
    config = parse(
        "listen: {stdio: {identity: {subject: ci-bot}}}\nbackends: {b: {stdio: {command: x}}}\n"
        "policy:\n  default: deny\n  rules:\n    - allow: {backends: [b]}\n"
    )
    text = describe(config)
    assert "listen stdio (as ci-bot)" in text
    assert "policy       default deny, rules: 1" in text
