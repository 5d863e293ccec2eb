"""The `policy:` section (who may see and call what) and the stdio front end's configured
identity (`listen.stdio: {identity: ...}`), read with line-numbered problems like the rest."""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

from gateway.config import keys
from gateway.config.access import (
    POLICY_DEFAULTS,
    RULE_EFFECTS,
    PolicyConfig,
    PolicyRule,
    PolicyTarget,
    PolicyWhen,
)
from gateway.config.key import Key
from gateway.config.listeners import ConfiguredIdentity
from gateway.config.reader import _Check

# A scope token (RFC 6749, section 3.3): what a `scope` challenge can carry unquoted-safely.
_SCOPE = re.compile(r"[\x21\x23-\x5B\x5D-\x7E]+")


def _scopes(c: _Check, body: dict[str, Any], path: tuple[str, ...], key: Key) -> tuple[str, ...]:
    scopes: tuple[str, ...] = c.field(body, path, "scopes", key)
    for i, scope in enumerate(scopes):
        if not _SCOPE.fullmatch(scope):
            c.r.problem(path + ("scopes", str(i)), "is not a scope (no spaces, quotes or \\)")
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
    return PolicyTarget(backends=named, **c.scalars(body, path, PolicyTarget, skip={"backends"}))


def _when(c: _Check, raw: Any, path: tuple[str, ...]) -> PolicyWhen:
    body = c.mapping(raw, path, keys.names("policy_when"))
    t = keys.table("policy_when")
    scopes = _scopes(c, body, path, t["scopes"])
    return PolicyWhen(scopes=scopes, **c.scalars(body, path, PolicyWhen, skip={"scopes"}))
