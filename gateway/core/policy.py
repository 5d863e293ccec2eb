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

A rule may also look past a tool's name (core/conditions.py): at its annotations, read from the
definition a list shows or, for anything else, the catalog's (`Policy.consult`), and on a call at
its arguments. Such a rule covers tools only. What cannot be known is read the strict way: a tool
no catalog describes meets a `deny`'s or `require`'s annotations and not an `allow`'s; a list
(no call, no arguments) takes a `deny`'s argument conditions as not met and the others' as met,
since some call may meet them: the call is judged on its own. A caller to whom no such rule
applies gets a plain `View`, and a policy without them never reads a definition.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gateway.caller_auth.identity import Identity
from gateway.config.access import PolicyConfig, PolicyRule, PolicyWhen
from gateway.core import conditions
from gateway.core.conditions import UNKNOWN, Condition
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

# The arguments of no call: a tool judged as a list shows it.
LISTING: Final = object()
# A backend's tool definition by (backend, the backend's own name); None: no catalog has it.
ToolLookup = Callable[[str, str], Mapping[str, Any] | None]


def _no_catalog(backend: str, name: str) -> None:
    return None


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
    __slots__ = (
        "arguments",
        "backends",
        "conditional",
        "effect",
        "folded",
        "mask",
        "missing",
        "patterns",
        "scopes",
        "want",
        "when",
        "when_scopes",
    )

    def __init__(self, rule: PolicyRule) -> None:
        self.effect = rule.effect
        self.when = rule.when
        self.when_scopes = frozenset(rule.when.scopes) if rule.when is not None else frozenset()
        self.missing = frozenset(rule.when.missing_scopes) if rule.when is not None else frozenset()
        self.scopes = frozenset(rule.scopes)
        target = rule.target
        self.backends = frozenset(target.backends) or None  # None: every backend
        lists = {"tools": target.tools, "prompts": target.prompts, "resources": target.resources}
        wanted = target.annotations
        self.mask, self.want = conditions.hint_mask(wanted) if wanted is not None else (0, 0)
        self.arguments = tuple(Condition(p, c) for p, c in target.arguments.items())
        # Looking past names: a rule on tools alone (all of them, when it names none).
        self.conditional = wanted is not None or bool(self.arguments)
        if self.conditional:
            lists = {"tools": target.tools or ("*",), "prompts": (), "resources": ()}
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

    def applies(self, hints: int, arguments: object) -> bool:
        """Whether a conditional rule holds of a tool with these hints (conditions.py), called
        with these arguments (LISTING: as a list shows it), read the strict way where unknown."""
        if self.mask:
            if hints == UNKNOWN:
                if self.effect == "allow":
                    return False
            elif hints & self.mask != self.want:
                return False
        if self.arguments:
            if arguments is LISTING:
                return self.effect != "deny"
            return all(c.holds(arguments) for c in self.arguments)
        return True

    def state(self, identity: Identity | None) -> int:
        if not holds(self.when, identity, self.when_scopes, self.missing):
            return _INACTIVE
        if self.effect == "require" and identity is not None and identity.has_scopes(self.scopes):
            return _SATISFIED
        return _ACTIVE


def holds(
    when: PolicyWhen | None,
    identity: Identity | None,
    scopes: frozenset[str] | None = None,
    missing: frozenset[str] | None = None,
) -> bool:
    """Whether a rule's `when` is for this caller. An anonymous caller meets no condition but
    `missing_scopes` (it holds no scope, so lacks every one). `scopes`, `missing`: `when.scopes`
    and `when.missing_scopes` as sets, when the caller has made them already."""
    if when is None:
        return True
    if identity is None:
        return not (when.scopes or when.subjects or when.clients or when.claims)
    if when.scopes and not identity.has_scopes(scopes or frozenset(when.scopes)):
        return False
    if when.missing_scopes and identity.has_scopes(missing or frozenset(when.missing_scopes)):
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
    # Whether a rule of the view looks past names (InspectingView): what the dispatcher checks
    # before handing a call's arguments over, and a list before each tool's definition.
    inspects = False

    def __init__(self, rules: Sequence[tuple[_Rule, int]], default: Verdict) -> None:
        self._rules = rules
        self._default = default
        self._decisions: dict[tuple[object, ...], Verdict] = {}

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
        catalog come here (so no definition is read: its annotations are unknown)."""
        return self._judge(kind, backend, folded, folded=True)

    def decide_tool(self, backend: str, name: str, tool: Mapping[str, Any] | None) -> Verdict:
        """A tool as a list shows it, by this definition (only an InspectingView reads it)."""
        return self.decide(TOOL, backend, name)

    def decide_call(self, backend: str, name: str, arguments: object) -> Verdict:
        """A call of a tool with these arguments (only an InspectingView reads them)."""
        return self.decide(TOOL, backend, name)

    def _judge(
        self,
        kind: str,
        backend: str,
        name: str,
        folded: bool = False,
        hints: int = UNKNOWN,
        arguments: object = LISTING,
    ) -> Verdict:
        granted = False
        missing = False
        required: set[str] = set()
        for rule, state in self._rules:
            if not rule.covers(kind, backend, name, folded):
                continue
            if rule.conditional and not rule.applies(hints, arguments):
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


class InspectingView(View):
    """A view with a rule that looks past names: a tool's decision depends on its definition
    (cached by name and hints, so a changed definition is judged afresh), and a call's, when a
    rule has argument conditions, on its arguments (judged each time)."""

    __slots__ = ("_argued", "_tools")
    inspects = True

    def __init__(
        self, rules: Sequence[tuple[_Rule, int]], default: Verdict, tools: ToolLookup
    ) -> None:
        super().__init__(rules, default)
        self._tools = tools
        self._argued = any(rule.arguments for rule, _ in rules)

    def decide(self, kind: str, backend: str, name: str) -> Verdict:
        if kind != TOOL:
            return super().decide(kind, backend, name)
        return self.decide_tool(backend, name, self._tools(backend, name))

    def decide_tool(self, backend: str, name: str, tool: Mapping[str, Any] | None) -> Verdict:
        hints = conditions.hints(tool)
        key = (TOOL, backend, name, hints)
        found = self._decisions.get(key)
        if found is None:
            if len(self._decisions) >= MAX_DECISIONS:
                self._decisions.clear()
            found = self._decisions[key] = self._judge(TOOL, backend, name, hints=hints)
        return found

    def decide_call(self, backend: str, name: str, arguments: object) -> Verdict:
        tool = self._tools(backend, name)
        if not self._argued:
            return self.decide_tool(backend, name, tool)
        hints = conditions.hints(tool)
        return self._judge(TOOL, backend, name, hints=hints, arguments=arguments)


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
    def __init__(self, config: PolicyConfig, tools: ToolLookup = _no_catalog) -> None:
        self._rules = tuple(_Rule(r) for r in config.rules)
        self._default = ALLOW if config.default == "allow" else DENY
        self._views: dict[tuple[int, ...], View] = {}
        # Decided once: whether any rule looks past names, so reads tools' definitions.
        self.inspects = any(rule.conditional for rule in self._rules)
        self._tools = tools

    def consult(self, tools: ToolLookup) -> None:
        """Where views read a tool's definition from (the dispatcher's catalogs); until then,
        and for a tool none has, its annotations are unknown."""
        self._tools = tools
        self._views.clear()

    def view(self, identity: Identity | None) -> View:
        """The view of a caller (None: anonymous). Callers to whom the same rules apply, in the
        same way, share one."""
        states = tuple(rule.state(identity) for rule in self._rules)
        found = self._views.get(states)
        if found is None:
            if len(self._views) >= MAX_VIEWS:
                self._views.clear()
            active = [(r, s) for r, s in zip(self._rules, states, strict=True) if s != _INACTIVE]
            if any(rule.conditional for rule, _ in active):
                found = InspectingView(active, self._default, self._tools)
            else:
                found = View(active, self._default)
            self._views[states] = found
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
