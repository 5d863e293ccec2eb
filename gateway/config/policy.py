"""The `policy:` section (who may see and call what) and the stdio front end's configured
identity (`listen.stdio: {identity: ...}`), read with line-numbered problems like the rest."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection
from typing import Any

from gateway.config import keys
from gateway.config.access import (
    ARGUMENT_TESTS,
    POLICY_DEFAULTS,
    RULE_EFFECTS,
    PolicyAnnotations,
    PolicyArgument,
    PolicyConfig,
    PolicyRule,
    PolicyTarget,
    PolicyWhen,
)
from gateway.config.key import KEY, NAME, Key
from gateway.config.listeners import ConfiguredIdentity
from gateway.config.reader import _Check

# A scope token (RFC 6749, section 3.3): what a `scope` challenge can carry unquoted-safely.
_SCOPE = re.compile(r"[\x21\x23-\x5B\x5D-\x7E]+")
# A JSON pointer (RFC 6901, section 3): "" (the whole arguments) or /-prefixed reference
# tokens, `~` only as `~0` or `~1`.
_POINTER = re.compile(r"(/([^~/]|~[01])*)*")


def _scopes(
    c: _Check, body: dict[str, Any], path: tuple[str, ...], key: Key, name: str = "scopes"
) -> tuple[str, ...]:
    scopes: tuple[str, ...] = c.field(body, path, name, key)
    for i, scope in enumerate(scopes):
        if not _SCOPE.fullmatch(scope):
            c.r.problem(path + (name, str(i)), "is not a scope (no spaces, quotes or \\)")
    return scopes


def stdio(c: _Check, raw: Any) -> tuple[bool, ConfiguredIdentity | None]:
    """`listen.stdio`: true/false, or a mapping (on) that may name the caller's identity."""
    path = ("listen", "stdio")
    if raw is None or isinstance(raw, bool):
        return bool(raw), None
    if not isinstance(raw, dict):
        c.r.problem(path, "must be true, false or a mapping with `identity`")
        return False, None
    body = c.mapping(raw, path, keys.names("listen_stdio"))
    if body.get("identity") is None:
        return True, None
    where = path + ("identity",)
    ident = c.mapping(body["identity"], where, keys.names("stdio_identity"))
    t = keys.table("stdio_identity")
    subject = c.field(ident, where, "subject", t["subject"])
    if not subject:
        c.r.problem(where + ("subject",), "is required (who the stdio caller is)")
    return True, ConfiguredIdentity(
        subject=subject or "",
        client_id=c.field(ident, where, "client_id", t["client_id"]),
        scopes=_scopes(c, ident, where, t["scopes"]),
        claims=c.field(ident, where, "claims", t["claims"]),
    )


def policy(
    c: _Check, raw: Any, backends: Collection[str], path: tuple[str, ...] = ("policy",)
) -> PolicyConfig | None:
    """`policy:` (or a virtual server's, at `path`)."""
    if raw is None:
        return None
    body = c.mapping(raw, path, keys.names("policy"))
    t = keys.table("policy")
    default = c.field(body, path, "default", t["default"]) or "allow"
    if default not in POLICY_DEFAULTS:
        c.r.problem(path + ("default",), f"must be one of {', '.join(POLICY_DEFAULTS)}")
        default = "deny"  # (the config is refused anyway; never fail open while reading it)
    rules_raw = body.get("rules")
    rules: list[PolicyRule] = []
    if rules_raw is not None and not isinstance(rules_raw, list):
        c.r.problem(path + ("rules",), "must be a list of rules")
    else:
        for i, item in enumerate(rules_raw or ()):
            rule = _rule(c, item, path + ("rules", str(i)), backends)
            if rule is not None:
                rules.append(rule)
    return PolicyConfig(default=default, rules=tuple(rules))


def _rule(
    c: _Check, raw: Any, path: tuple[str, ...], backends: Collection[str]
) -> PolicyRule | None:
    if not isinstance(raw, dict):
        c.r.problem(path, "must be a mapping naming one of allow, deny or require")
        return None
    body = c.mapping(raw, path, keys.names("policy_rule"))
    effects = [e for e in RULE_EFFECTS if body.get(e) is not None]
    if len(effects) != 1:
        c.r.problem(path, "needs exactly one of allow, deny or require ({} covers everything)")
        return None
    effect = effects[0]
    target = _target(c, body[effect], path + (effect,), backends)
    scopes = _scopes(c, body, path, keys.table("policy_rule")["scopes"])
    if effect == "require" and not scopes:
        c.r.problem(path + ("scopes",), "is required with require (the scopes a call needs)")
    elif effect != "require" and body.get("scopes") is not None:
        c.r.problem(path + ("scopes",), "only applies with require (for callers, use when.scopes)")
    when = _when(c, body["when"], path + ("when",)) if body.get("when") is not None else None
    return PolicyRule(effect=effect, target=target, when=when, scopes=scopes)


def _target(c: _Check, raw: Any, path: tuple[str, ...], backends: Collection[str]) -> PolicyTarget:
    body = c.mapping(raw, path, keys.names("policy_target"))
    t = keys.table("policy_target")
    named = c.field(body, path, "backends", t["backends"])
    for i, name in enumerate(named):
        if name not in backends:
            known = ", ".join(sorted(backends)) or "none"
            c.r.problem(path + ("backends", str(i)), f"no backend {name!r} (backends: {known})")
    annotations = None
    if body.get("annotations") is not None:
        annotations = _annotations(c, body["annotations"], path + ("annotations",))
    arguments = _arguments(c, body.get("arguments"), path + ("arguments",))
    if (annotations is not None or arguments) and (body.get("prompts") or body.get("resources")):
        c.r.problem(path, "annotations and arguments select tools: no prompts or resources here")
    return PolicyTarget(
        backends=named,
        annotations=annotations,
        arguments=arguments,
        **c.scalars(body, path, PolicyTarget, skip={"backends"}),
    )


def _annotations(c: _Check, raw: Any, path: tuple[str, ...]) -> PolicyAnnotations:
    body = c.mapping(raw, path, keys.names("policy_annotations"))
    hints: dict[str, bool | None] = {}
    for f in dataclasses.fields(PolicyAnnotations):
        name = f.metadata[NAME]
        given = body.get(name) is not None
        hints[f.name] = c.field(body, path, name, f.metadata[KEY]) if given else None
    if isinstance(raw, dict) and all(v is None for v in hints.values()):
        # (an empty selector would match every tool: surely not what was meant)
        c.r.problem(path, "names no hint (readOnlyHint, destructiveHint, ...)")
    return PolicyAnnotations(**hints)


def _arguments(c: _Check, raw: Any, path: tuple[str, ...]) -> dict[str, PolicyArgument]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not raw:
        c.r.problem(path, "must be a mapping of JSON pointers (/name) to conditions")
        return {}
    out: dict[str, PolicyArgument] = {}
    for pointer, condition in raw.items():
        where = path + (pointer,)
        if not _POINTER.fullmatch(pointer):
            c.r.problem(where, "is not a JSON pointer (RFC 6901: /name/0, ~0 for ~, ~1 for /)")
        body = c.mapping(condition, where, keys.names("policy_argument"))
        tests = [t for t in ARGUMENT_TESTS if body.get(t) is not None]
        if len(tests) != 1:
            c.r.problem(where, "needs exactly one of equals or glob")
            continue
        if tests == ["equals"]:
            value = body["equals"]
            # (bool is an int; a YAML date or timestamp is neither, and no JSON argument)
            if not isinstance(value, str | int | float):
                c.r.problem(where + ("equals",), "must be a string, number or boolean")
                continue
            out[pointer] = PolicyArgument(equals=value)
        else:
            glob = c.string(body["glob"], where + ("glob",))
            if glob is not None:
                out[pointer] = PolicyArgument(glob=glob)
    return out


def _when(c: _Check, raw: Any, path: tuple[str, ...]) -> PolicyWhen:
    body = c.mapping(raw, path, keys.names("policy_when"))
    t = keys.table("policy_when")
    scopes = _scopes(c, body, path, t["scopes"])
    missing = _scopes(c, body, path, t["missing_scopes"], "missing_scopes")
    if missing and set(missing) <= set(scopes):
        # (holding them all and lacking one of them: a rule that never applies)
        c.r.problem(path + ("missing_scopes",), "names only scopes `scopes` asks for: never met")
    return PolicyWhen(
        scopes=scopes,
        missing_scopes=missing,
        **c.scalars(body, path, PolicyWhen, skip={"scopes", "missing_scopes"}),
    )
