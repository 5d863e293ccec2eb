"""Who may see and call what (pure): the `policy:` rules, compiled once, judging one caller's
access to one backend's tool, prompt, resource or resource template.

Names are the backend's own (before namespacing and renames; URIs without the gateway's
`mcp-gateway://` wrapper), so a rule means the same whatever the prefix mode or a rename does.
A decision is one of: allowed; hidden and refused as if unknown (denied); or visible but
callable only with scopes the caller lacks (`Verdict.needs`: a step-up challenge).

Deny wins: a matching `deny` rule hides the item whatever else matches. Otherwise every
matching `require` rule whose scopes the caller lacks makes it need those scopes (all the scopes
of the matching `require` rules, so one challenge names everything the call needs); a matching
`allow`, or a `require` that is satisfied, allows it; and what no rule matches gets `default`.

It runs on every list item, so each caller maps to a `View` (cached by which rules apply to it,
so callers alike share one) that caches its decisions.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gateway.caller_auth.identity import Identity
from gateway.config.access import PolicyConfig, PolicyRule, PolicyWhen
from gateway.routing.fold import folded_pattern
from gateway.routing.table import CatalogData

TOOL: Final = "tool"
PROMPT: Final = "prompt"
RESOURCE: Final = "resource"
TEMPLATE: Final = "template"  # a resource template, judged by its uriTemplate text
# Which of a target's glob lists judges each kind.
_GLOBS: Final[Mapping[str, str]] = {
    TOOL: "tools",
    PROMPT: "prompts",
    RESOURCE: "resources",
    TEMPLATE: "resources",
}
# A backend a caller can see nothing of: every list capability hidden from it.
ALL_HIDDEN: Final = frozenset({"tools", "prompts", "resources"})
# Decisions kept per view, and views kept per policy, before the cache starts over: a cache,
# not the truth (a backend with endless names cannot grow it without bound).
MAX_DECISIONS = 50_000
MAX_VIEWS = 1024

_INACTIVE, _ACTIVE, _SATISFIED = 0, 1, 2


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    needs: frozenset[str] = frozenset()  # not allowed, but would be with these scopes

    @property
    def visible(self) -> bool:
        """Shown in lists: allowed, or callable after a step-up (a call would name the scopes
        anyway, so listing it tells nothing more)."""
        return self.allowed or bool(self.needs)


ALLOW: Final = Verdict(True)
DENY: Final = Verdict(False)


def _pattern(globs: Sequence[str]) -> re.Pattern[str]:
    return re.compile("|".join(fnmatch.translate(g) for g in globs))


class _Rule:
    __slots__ = ("backends", "effect", "folded", "patterns", "scopes", "when", "when_scopes")

    def __init__(self, rule: PolicyRule) -> None:
        self.effect = rule.effect
        self.when = rule.when
        self.when_scopes = frozenset(rule.when.scopes) if rule.when is not None else frozenset()
        self.scopes = frozenset(rule.scopes)
        target = rule.target
        self.backends = frozenset(target.backends) or None  # None: every backend
        lists = {"tools": target.tools, "prompts": target.prompts, "resources": target.resources}
        everything = not any(lists.values())
        # Per kind: None when the target does not cover the kind, else the compiled globs
        # (a target that names no kind at all covers every name of every kind).
        self.patterns: dict[str, re.Pattern[str] | None] = {
            kind: (_pattern(["*"]) if everything else _pattern(lists[key]) if lists[key] else None)
            for kind, key in _GLOBS.items()
        }
        # The same globs folded (routing/fold.py): what a name missing from every catalog is
        # judged by as a lenient server would read it.
        self.folded: dict[str, re.Pattern[str] | None] = {
            kind: (folded_pattern(["*"] if everything else lists[key]) if pattern else None)
            for (kind, key), pattern in zip(_GLOBS.items(), self.patterns.values(), strict=True)
        }

    def covers(self, kind: str, backend: str, name: str, folded: bool = False) -> bool:
        if self.backends is not None and backend not in self.backends:
            return False
        pattern = (self.folded if folded else self.patterns)[kind]
        return pattern is not None and pattern.match(name) is not None

    def state(self, identity: Identity | None) -> int:
        if not holds(self.when, identity, self.when_scopes):
            return _INACTIVE
        if self.effect == "require" and identity is not None and identity.has_scopes(self.scopes):
            return _SATISFIED
        return _ACTIVE


def holds(
    when: PolicyWhen | None, identity: Identity | None, scopes: frozenset[str] | None = None
) -> bool:
    """Whether a rule's `when` is for this caller; an anonymous caller meets no condition.
    `scopes`: `when.scopes` as a set, when the caller has made it already."""
    if when is None:
        return True
    if identity is None:
        return not (when.scopes or when.subjects or when.clients or when.claims)
    if when.scopes and not identity.has_scopes(scopes or frozenset(when.scopes)):
        return False
    if when.subjects and identity.subject not in when.subjects:
        return False
    if when.clients and identity.client_id not in when.clients:
        return False
    return all(claim_matches(identity.claims.get(k), v) for k, v in when.claims.items())


def claim_matches(value: Any, wanted: str) -> bool:
    """A claim against a configured value (text, as YAML gave it): equal, or for a list claim
    (groups, roles), holding it."""
    if isinstance(value, list | tuple):
        return any(claim_matches(v, wanted) for v in value if not isinstance(v, list | tuple))
    if isinstance(value, bool):
        return wanted == ("true" if value else "false")
    if isinstance(value, str | int | float):
        return str(value) == wanted
    return False


class View:
    """The policy as one kind of caller meets it: the rules that apply, and their decisions."""

    __slots__ = ("_decisions", "_default", "_rules")

    def __init__(self, rules: Sequence[tuple[_Rule, int]], default: Verdict) -> None:
        self._rules = rules
        self._default = default
        self._decisions: dict[tuple[str, str, str], Verdict] = {}

    def decide(self, kind: str, backend: str, name: str) -> Verdict:
        key = (kind, backend, name)
        found = self._decisions.get(key)
        if found is None:
            if len(self._decisions) >= MAX_DECISIONS:
                self._decisions.clear()
            found = self._decisions[key] = self._judge(kind, backend, name)
        return found

    def visible(self, kind: str, backend: str, name: str) -> bool:
        return self.decide(kind, backend, name).visible

    def decide_folded(self, kind: str, backend: str, folded: str) -> Verdict:
        """The decision on a folded name (routing/fold.py) by the folded globs: how the rules
        judge what a lenient server would run for it. Not cached: only names missing from every
        catalog come here."""
        return self._judge(kind, backend, folded, folded=True)

    def _judge(self, kind: str, backend: str, name: str, folded: bool = False) -> Verdict:
        granted = False
        missing = False
        required: set[str] = set()
        for rule, state in self._rules:
            if not rule.covers(kind, backend, name, folded):
                continue
            if rule.effect == "deny":
                return DENY
            if rule.effect == "require":
                required |= rule.scopes
                missing = missing or state != _SATISFIED
            granted = True
        if missing:
            return Verdict(False, frozenset(required))
        return ALLOW if granted else self._default


def strictest(first: Verdict, second: Verdict) -> Verdict:
    """Two readings of one target judged together: denied if either is, else needing every
    scope either needs."""
    if first.allowed:
        return second
    if second.allowed or first == DENY:
        return first
    if second == DENY:
        return second
    return Verdict(False, first.needs | second.needs)


class Policy:
    def __init__(self, config: PolicyConfig) -> None:
        self._rules = tuple(_Rule(r) for r in config.rules)
        self._default = ALLOW if config.default == "allow" else DENY
        self._views: dict[tuple[int, ...], View] = {}

    def view(self, identity: Identity | None) -> View:
        """The view of a caller (None: anonymous). Callers to whom the same rules apply, in the
        same way, share one."""
        states = tuple(rule.state(identity) for rule in self._rules)
        found = self._views.get(states)
        if found is None:
            if len(self._views) >= MAX_VIEWS:
                self._views.clear()
            active = [(r, s) for r, s in zip(self._rules, states, strict=True) if s != _INACTIVE]
            found = self._views[states] = View(active, self._default)
        return found

    def decide(self, identity: Identity | None, kind: str, backend: str, name: str) -> Verdict:
        return self.view(identity).decide(kind, backend, name)


def hidden_capabilities(view: View, backend: str, data: CatalogData | None) -> frozenset[str]:
    """The list capabilities (tools, prompts, resources) of a backend whose every item the
    caller may not see, by its loaded catalog (none while it is not loaded): not advertised
    to it, and their list changes not relayed to it. ALL_HIDDEN: it can see nothing of it."""
    if data is None:
        return frozenset()
    lists = {
        "tools": [(TOOL, i.get("name")) for i in data.tools],
        "prompts": [(PROMPT, i.get("name")) for i in data.prompts],
        "resources": [(RESOURCE, i.get("uri")) for i in data.resources]
        + [(TEMPLATE, i.get("uriTemplate")) for i in data.templates],
    }
    hidden = frozenset(
        capability
        for capability, items in lists.items()
        if items and not any(isinstance(n, str) and view.visible(k, backend, n) for k, n in items)
    )
    if hidden and hidden == {c for c, items in lists.items() if items}:
        return ALL_HIDDEN
    return hidden
