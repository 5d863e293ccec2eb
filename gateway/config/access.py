"""The config's frozen objects for `policy:`: who may see and call which tools, prompts and
resources (with model.py, a leaf of the package)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.config.key import key

# `policy:`: what no rule decides, and what a rule does with what it matches.
POLICY_DEFAULTS = ("allow", "deny")
RULE_EFFECTS = ("allow", "deny", "require")
# What an argument condition tests its value by (exactly one of them).
ARGUMENT_TESTS = ("equals", "glob")


@dataclass(frozen=True)
class PolicyAnnotations:
    """The tool annotations a rule is for (server/tools, Tool annotations), each as the spec's
    defaults and read-only reading make it (core/conditions.py): every one given must hold.
    None: the rule does not look at that hint."""

    read_only: bool | None = key(
        "boolean", "The tool claims not to modify its environment.", None, name="readOnlyHint"
    )
    destructive: bool | None = key(
        "boolean", "The tool claims it may destroy (not read-only).", None, name="destructiveHint"
    )
    idempotent: bool | None = key(
        "boolean", "The tool claims repeated calls do nothing more.", None, name="idempotentHint"
    )
    open_world: bool | None = key(
        "boolean", "The tool claims to reach outside entities.", None, name="openWorldHint"
    )


@dataclass(frozen=True)
class PolicyArgument:
    """One condition on a call's arguments, at a JSON pointer (RFC 6901) into them."""

    equals: str | int | float | bool | None = key(
        "value", "The value there is this string, number or boolean (of the same JSON type).", None
    )
    glob: str | None = key("string", "The value there is a string this glob matches.", None)


@dataclass(frozen=True)
class PolicyTarget:
    """What a rule covers: backends by name (none: every backend) and globs on the backend's own
    tool and prompt names and resource URIs. A target naming none of tools, prompts and
    resources covers all three; one naming some covers only those. With `annotations` or
    `arguments` it covers tools only (every tool when it names none), those that meet them."""

    backends: tuple[str, ...] = key("strings", "Backends by name (default: all).", ())
    tools: tuple[str, ...] = key("strings", "Globs on tool names as the backend has them.", ())
    prompts: tuple[str, ...] = key("strings", "Globs on prompt names as the backend has them.", ())
    resources: tuple[str, ...] = key(
        "strings", "Globs on resource URIs and templates as the backend has them.", ()
    )
    # Either makes the rule one on tools only (core/policy.py).
    annotations: PolicyAnnotations | None = key(
        "section",
        "Tools whose annotations (hints) are these; a server's claim, not a proof.",
        None,
        section="policy_annotations",
    )
    arguments: Mapping[str, PolicyArgument] = key(
        "sections",
        "Calls whose arguments meet these conditions, by JSON pointer (tools/call only).",
        factory=dict,
        section="policy_argument",
    )


@dataclass(frozen=True)
class PolicyWhen:
    """Which callers a rule is for; every condition given must hold. Scopes and claims: all of
    them; subjects and clients: any of them; missing scopes: one of them is enough (the caller
    does not hold all of them: an anonymous caller holds none)."""

    scopes: tuple[str, ...] = key("strings", "The caller holds all of these scopes.", ())
    missing_scopes: tuple[str, ...] = key(
        "strings", "The caller lacks one or more of these scopes (anonymous: lacks all).", ()
    )
    subjects: tuple[str, ...] = key("strings", "The caller's subject is one of these.", ())
    clients: tuple[str, ...] = key("strings", "The caller's client id is one of these.", ())
    claims: Mapping[str, str] = key(
        "string_map", "Each claim has this value (or, a list claim, holds it).", factory=dict
    )


@dataclass(frozen=True)
class PolicyRule:
    # Both from the one key of RULE_EFFECTS the rule names (keys.py: it nests a target).
    effect: str
    target: PolicyTarget
    scopes: tuple[str, ...] = key("strings", "require: the scopes the caller must hold.", ())
    when: PolicyWhen | None = key(  # None: every caller, anonymous ones too
        "section", "Which callers the rule is for (default: all).", None, section="policy_when"
    )


@dataclass(frozen=True)
class PolicyConfig:
    default: str = key(
        "string",
        "What a tool, prompt or resource no rule decides gets.",
        "allow",
        choices=POLICY_DEFAULTS,
    )
    rules: tuple[PolicyRule, ...] = key(
        "section_list",
        "Each names one of allow, deny or require; deny wins.",
        (),
        section="policy_rule",
    )
