"""Names and URIs missing from every catalog (pure): whether one may still be forwarded on a
guess, for the backend to answer (docs/security/policy.md; THREAT_MODEL.md, Policy bypass).

Policy and rate limits judge names as the gateway knows them, but a backend runs what it makes of
a name, and a lenient one makes `SECRET_READ` or a fullwidth spelling its `secret_read`. So under a
policy or rate limits (`guarded`) nothing missing from the catalog is forwarded unless the
backend's config says so (`forward_unknown`), and then not when the name, as a lenient server
reads it (routing/fold.py), is another spelling of a tool or prompt the backend has, of one the
filters or renames keep from clients, of a rate-limited tool, or is something the policy does not
allow this caller; nor is a name outside the characters the spec recommends. Without a policy or
rate limits a single unprefixed backend still answers for names it does not list (transparency),
except those that fold to a filtered or renamed tool.

Only the miss path comes here: a known name never pays for a fold. Also here: client
notifications that carry a request's method, dropped (`NotificationGate`).
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Collection, Mapping

from gateway.core.policy import TOOL, Verdict, View, strictest
from gateway.protocol.jsonrpc import Message
from gateway.routing.fold import fold
from gateway.routing.table import CatalogData, Exposure, Route

log = logging.getLogger("gateway")

# The characters and length a tool name should have (server/tools, Tool Names). A name with
# others is not forwarded on a guess: a server may take a look-alike letter (a Cyrillic e)
# for its Latin twin, which no normalisation maps, and no plain name needs such letters.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def may_guess_name(
    kind: str,
    name: str,
    exposure: Exposure,
    guarded: bool,
    view: View | None,
    data: CatalogData | None,
    limited: Mapping[str, Collection[str]],
) -> bool:
    """Whether a tool or prompt name missing from the catalog may go to the backend of
    `exposure` as it is. `data`: that backend's catalog; `limited`: the tool names that have a
    rate limit of their own, by their folds."""
    if guarded and not exposure.forward_unknown:
        return False
    folded = fold(name)
    if kind == TOOL and exposure.withholds(name, folded):
        return False
    if not guarded:
        return True
    if not _PLAIN_NAME.fullmatch(name):
        return False
    if data is not None:
        known = data.folded_tools if kind == TOOL else data.folded_prompts
        if folded in known:
            return False  # another spelling of what the backend has: use its own name
    if kind == TOOL and name not in limited.get(folded, (name,)):
        return False  # another spelling of a tool with a limit of its own
    return view is None or view.decide_folded(kind, exposure.backend, folded).allowed


def may_guess_uri(kind: str, route: Route, exposure: Exposure, view: View | None) -> bool:
    """Whether a URI missing from the catalog (`route`: where it would go, under the backend's
    own, normalised URI) may be forwarded: only with `forward_unknown`, and not when the URI,
    case-folded, is one the policy does not allow this caller (a server matching URIs without
    regard to case)."""
    if not exposure.forward_unknown:
        return False
    return view is None or view.decide_folded(kind, route.backend, fold(route.name)).allowed


def judged(view: View, kind: str, backend: str, name: str, readings: tuple[str, ...]) -> Verdict:
    """The policy's decision on a target read every way a server may read it (a URI's
    `uris.readings`): refused when any reading is."""
    verdict = view.decide(kind, backend, name)
    for reading in readings:
        verdict = strictest(verdict, view.decide(kind, backend, reading))
    return verdict


class NotificationGate:
    """Client notifications with a request's method (a `tools/call` without an id) are dropped:
    passed on, they would run on the backend unjudged by the policy and unanswered. Each is
    counted (`rejections`, by reason); only the first is logged, so a client sending many
    cannot flood the log."""

    def __init__(self, rejections: Counter[str]) -> None:
        self._rejections = rejections
        self._told = False

    def accepts(self, msg: Message) -> bool:
        method = msg["method"]
        if method.startswith("notifications/"):
            return True
        self._rejections["request_as_notification"] += 1
        if not self._told:
            self._told = True
            log.warning(
                "a client sent a notification with the request method %.64r: dropped (and so "
                "is every other such notification, without another log line)",
                method,
            )
        return False
