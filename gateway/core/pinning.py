"""Tool-definition pinning at run time (docs/trusting-tools/pinning.md): the pins in force, and
each pinned backend's definitions judged against them when its catalog loads (core/catalog.py).

Nothing here runs per `tools/call`: a blocked item is left out of the catalog the route table is
built from, so a call to it misses exactly as a call to an unknown name does. A merged list asks
the backends live, so their answers' items are checked here too (`admits`), only for pinned
backends; a definition the catalog has not judged yet makes it load again, and that load logs,
audits and counts the change, once for each definition (backend, item, digest) however often it
is listed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.config.pins import DEFAULT_PIN_NOTIFY_WAIT
from gateway.core import pins as p
from gateway.routing.fold import fold
from gateway.routing.table import CatalogData
from gateway.telemetry.api import Stats

log = logging.getLogger("gateway.pins")

# The names one log line lists of a backend's changes; the rest are counted.
LOGGED_NAMES = 10
# CatalogData's field for each pinned list.
FIELDS = {"tools": "tools", "prompts": "prompts", "resourceTemplates": "templates"}


@dataclass(frozen=True)
class PinEvent:
    """A definition that differs from its pin, as a catalog load found it (or an approval)."""

    backend: str
    kind: str
    name: str
    status: str  # p.CHANGED, p.NEW; or p.PINNED for an approval
    outcome: str  # p.OUTCOMES' values, or p.APPROVED
    digest: str
    pinned: str | None  # the digest it was pinned with, if any


@dataclass(frozen=True)
class Held:
    """A definition awaiting approval: what it is, and whether it is served meanwhile."""

    kind: str
    name: str
    status: str
    digest: str
    served: bool


@dataclass
class _Judged:
    # What its last load found unapproved, by (kind, name).
    held: dict[tuple[str, str], Held] = field(default_factory=dict)
    # Folded tool and prompt names hidden (block): a name a lenient server reads as one of them
    # is not forwarded on a guess either.
    withheld: frozenset[str] = frozenset()


class Pinning:
    def __init__(
        self,
        modes: Mapping[str, str],
        pinned: p.PinSet,
        stats: Stats,
        on_event: Callable[[PinEvent], None] | None = None,
        notify_wait: float = DEFAULT_PIN_NOTIFY_WAIT,
    ) -> None:
        """`modes`: each pinned backend's on_change; `on_event`: told of each change once (the
        audit log); `notify_wait`: how long a listen holds a pinned backend's list change back
        for its judgement (core/listen.py)."""
        self.modes = dict(modes)
        self.notify_wait = notify_wait
        self.pinned: p.PinSet = pinned
        self._stats = stats
        self.on_event = on_event
        self._judged: dict[str, _Judged] = {}
        # Items whose pins a `replace` changed, until next judged: one of them as pinned now is
        # an approval (anything else held before and as pinned now went back to its pin).
        self._repinned: set[tuple[str, str, str]] = set()
        # (backend, kind, name, digest) already told of: a change is counted once.
        self._told: set[tuple[str, str, str, str]] = set()

    def covers(self, backend: str) -> bool:
        return backend in self.modes

    def held(self) -> dict[str, list[Held]]:
        """Each backend's definitions awaiting approval, as its last load found them."""
        return {b: list(j.held.values()) for b, j in sorted(self._judged.items()) if j.held}

    def reconfigure(self, modes: Mapping[str, str]) -> None:
        """A reload: the pinned backends and their modes (a changed backend's catalog is
        loaded again, and judged then)."""
        self.modes = dict(modes)
        for gone in self._judged.keys() - self.modes.keys():
            del self._judged[gone]

    def replace(self, pinned: p.PinSet) -> list[str]:
        """New pins (an approval, the file edited): the pinned backends whose pins differ."""
        old, self.pinned = self.pinned, pinned
        self._repinned |= {
            (b, kind, name)
            for b in self.modes
            for kind in p.KINDS
            for name, found in pinned.get(b, {}).get(kind, {}).items()
            if old.get(b, {}).get(kind, {}).get(name) != found
        }
        return [b for b in self.modes if old.get(b) != pinned.get(b)]

    def judge(self, backend: str, data: CatalogData) -> CatalogData:
        """A backend's catalog as it may be served: under `block` without what differs from
        its pin. What newly differs is logged (one line), audited and counted."""
        mode = self.modes.get(backend)
        if mode is None:
            return data
        mine = self.pinned.get(backend)
        judged = _Judged()
        kept: dict[str, tuple[dict[str, Any], ...]] = {}
        fresh: list[PinEvent] = []
        before = self._judged.get(backend)
        for kind, attr in FIELDS.items():
            items = getattr(data, attr)
            out = []
            for item in items:
                name = p.name_of(kind, item)
                if name is None:
                    out.append(item)
                    continue
                found = p.pin(kind, item)
                status = p.standing(mine, kind, name, found.digest)
                if status == p.PINNED:
                    out.append(item)
                    repinned = (backend, kind, name) in self._repinned
                    self._repinned.discard((backend, kind, name))
                    if repinned and before is not None and (kind, name) in before.held:
                        fresh.append(self._approved(backend, kind, name, found.digest))
                    continue
                served = p.serves(mode, status)
                judged.held[(kind, name)] = Held(kind, name, status, found.digest, served)
                if served:
                    out.append(item)
                if (backend, kind, name, found.digest) not in self._told:
                    self._told.add((backend, kind, name, found.digest))
                    pinned = (mine or {}).get(kind, {}).get(name)
                    digest = pinned.digest if pinned is not None else None
                    outcome = p.OUTCOMES[mode]
                    fresh.append(
                        PinEvent(backend, kind, name, status, outcome, found.digest, digest)
                    )
            kept[attr] = tuple(out)
        judged.withheld = frozenset(
            fold(h.name)
            for h in judged.held.values()
            if not h.served and h.kind != "resourceTemplates"
        )
        self._judged[backend] = judged
        self._tell(backend, fresh)
        return CatalogData(
            tools=kept["tools"],
            prompts=kept["prompts"],
            resources=data.resources,
            templates=kept["templates"],
        )

    def _approved(self, backend: str, kind: str, name: str, digest: str) -> PinEvent:
        return PinEvent(backend, kind, name, p.PINNED, p.APPROVED, digest, digest)

    def admits(self, backend: str, kind: str, item: Mapping[str, Any]) -> tuple[bool, bool]:
        """Whether a live list's item may be shown, and whether its catalog has yet to judge it
        (the caller loads the catalog again). For a pinned backend's tools, prompts and
        templates only; the others are shown."""
        mode = self.modes.get(backend)
        name = p.name_of(kind, item) if mode is not None and kind in p.NAME_FIELD else None
        if mode is None or name is None:
            return True, False
        digest = p.pin(kind, item).digest
        status = p.standing(self.pinned.get(backend), kind, name, digest)
        if status == p.PINNED:
            return True, False
        judged = self._judged.get(backend)
        held = judged.held.get((kind, name)) if judged is not None else None
        return p.serves(mode, status), held is None or held.digest != digest

    def withholds(self, backend: str, name: str) -> bool:
        """Whether a tool or prompt name missing from the catalog is, as typed or as a lenient
        server reads it, one of the backend's blocked ones (not forwarded on a guess)."""
        judged = self._judged.get(backend)
        return judged is not None and bool(judged.withheld) and fold(name) in judged.withheld

    def _tell(self, backend: str, events: Iterable[PinEvent]) -> None:
        events = list(events)
        if not events:
            return
        stats = self._stats.pin_changes
        for event in events:
            stats[(event.backend, event.outcome)] += 1
            if self.on_event is not None:
                self.on_event(event)
        by_outcome: dict[str, list[str]] = {}
        for event in events:
            by_outcome.setdefault(event.outcome, []).append(f"{event.name} ({event.status})")
        parts = []
        for outcome, names in sorted(by_outcome.items()):
            shown = ", ".join(names[:LOGGED_NAMES])
            more = f" and {len(names) - LOGGED_NAMES} more" if len(names) > LOGGED_NAMES else ""
            parts.append(f"{outcome}: {shown}{more}")
        level = logging.INFO if set(by_outcome) <= {p.APPROVED, "allowed"} else logging.WARNING
        log.log(level, "pins: %s: %s", backend, "; ".join(parts))
