"""`subscriptions/listen` across backends (basic/patterns/subscriptions).

A client's listen becomes one listen per backend that can honour part of its filter. The gateway
waits for their acknowledgements, acknowledges the subset honoured under the client's own
subscription id, then relays notifications with that id and namespaced URIs. A backend stream that
ends (restart, dropped connection) is opened again without the client noticing. A reload extends
open listens to the added backends, within what each listen's acknowledgement told its client.

With a cluster bus (`core/changes.py`) what the backend streams hear is also handed to
`on_heard`, and notices from other replicas come in through `deliver`; `watch` is the replica's
own listen on a backend for its list changes and the resource URIs other replicas' listens are
subscribed to (`core/interest.py`), which learns of this replica's from `interest`, told by
`on_listens_changed` when open listens come and go.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectSendStream

from gateway import errors
from gateway.backends.base import GATEWAY_CALL, Backend, Call, NotificationSink
from gateway.config.model import DEFAULT_FAN_OUT_GRACE
from gateway.config.pins import DEFAULT_PIN_NOTIFY_WAIT
from gateway.core import tasks
from gateway.core.catalog import Catalogs
from gateway.protocol import jsonrpc, meta
from gateway.protocol.jsonrpc import Message
from gateway.routing.names import Naming
from gateway.routing.table import Exposure

log = logging.getLogger("gateway.listen")

ACKNOWLEDGED = meta.ACKNOWLEDGED
UPDATED = meta.RESOURCE_UPDATED
LIST_FLAGS = meta.LIST_FLAGS
# The notifications the gateway knows on a listen; with an extension's filter field, any other
# a backend sends there is that extension's, and relayed.
KNOWN = frozenset({ACKNOWLEDGED, UPDATED, *(m for _, m in LIST_FLAGS.values())})
# How long the client's acknowledgement waits for the backends' own at most. It is sent sooner:
# once every backend has acknowledged or failed (one that is down fails at once), or `grace`
# (fan_out.grace) after the last acknowledgement, so a silent backend delays it that much only.
ACK_TIMEOUT = 10.0
# Re-subscribing to a backend whose stream ended: quick first, doubling to a ceiling, reset once a
# stream has lasted a while.
FIRST_RETRY = 0.1
MAX_RETRY = 10.0
STABLE_AFTER = 30.0
# Notices from other replicas waiting for one listen's client: a client that does not read
# loses the excess (they are notices; what it has not read yet says the same).
REMOTE_QUEUE = 64
Readable = Callable[[str, str], bool]
Hidden = Callable[[str], frozenset[str]]
# The policy's say for one caller, taken anew when a reload extends its listen (the policy may
# have been reloaded too): (readable, hidden), either None for "no rule".
Judge = Callable[[], tuple[Readable | None, Hidden | None]]
Relay = Callable[[str, Message], Awaitable[None]]
# The filter fields the gateway splits per backend; any other (an extension's) goes to each.
RESOURCES = "resourceSubscriptions"
TASK_IDS = "taskIds"
SPLIT = frozenset({*LIST_FLAGS, RESOURCES, TASK_IDS})


@dataclass
class _Plan:
    """What one backend is asked for, and its URIs mapped back to the client's."""

    flags: dict[str, bool] = field(default_factory=dict)
    uris: dict[str, str] = field(default_factory=dict)  # backend URI -> client URI
    tasks: dict[str, str] = field(default_factory=dict)  # backend task id -> client task id
    extra: dict[str, Any] = field(default_factory=dict)  # extension fields, as the client's

    def filter(self) -> dict[str, Any]:
        out: dict[str, Any] = {**self.extra, **self.flags}
        if self.uris:
            out[RESOURCES] = list(self.uris)
        if self.tasks:
            out[TASK_IDS] = list(self.tasks)
        return out

    def __bool__(self) -> bool:
        return bool(self.flags or self.uris or self.tasks or self.extra)


@dataclass(eq=False)
class _Listening:
    """One open client listen, as a reload or another replica's notice reaches it."""

    msg: Message
    call: Call  # the client's, which its backend listens are made for
    wanted: Mapping[str, Any]
    judge: Judge | None
    stream: _Stream
    relay: Relay
    tg: anyio.abc.TaskGroup
    remote: MemoryObjectSendStream[tuple[str, Message]]
    locate: tasks.Locate | None = None


class Subscriptions:
    def __init__(
        self,
        backends: Mapping[str, Backend],
        catalogs: Catalogs,
        exposures: Mapping[str, Exposure],
        naming: Naming,
        grace: float = DEFAULT_FAN_OUT_GRACE,
    ) -> None:
        self._backends = backends
        self.grace = grace
        self._catalogs = catalogs
        self._exposures = exposures
        self._naming = naming
        self._ids = itertools.count(1)
        self._closing = anyio.Event()
        self.active = 0
        self._open: set[_Listening] = set()
        # Set by core/changes.py with a cluster bus: every notification a backend stream
        # delivers (not acknowledgements), and the backends a reload added or replaced.
        self.on_heard: Callable[[str, Message], None] | None = None
        self.on_reconfigure: Callable[[list[str]], None] | None = None
        # Set by core/interest.py with a cluster bus: a listen opened, closed or was extended.
        self.on_listens_changed: Callable[[], None] | None = None
        # With a cluster bus, the virtual servers' (core/virtual.py): what other replicas tell
        # this one's listens reaches theirs too, and their interests are counted as its own.
        self.followers: list[Subscriptions] = []
        catalogs.on_late_arrival.append(self._late_arrival)
        catalogs.on_pins_changed.append(self._late_arrival)  # (told the same way)

    @property
    def backends(self) -> Mapping[str, Backend]:
        return self._backends

    def reconfigure(
        self, backends: Mapping[str, Backend], exposures: Mapping[str, Exposure], naming: Naming
    ) -> None:
        """A reloaded config: listens opened from now on plan over these backends, and open
        ones are extended to the backends added (or replaced: the old one's part has ended).
        Called once the route table is the new one, so URIs route to the added backends."""
        old = self._backends
        self._backends = backends
        self._exposures = exposures
        self._naming = naming
        added = [name for name, backend in backends.items() if old.get(name) is not backend]
        if not added:
            self._listens_changed()  # (a removed backend's URIs are no longer asked for)
            return
        for listening in list(self._open):
            self._extend(listening, added)
        if self.on_reconfigure is not None:
            self.on_reconfigure(added)
        self._listens_changed()

    def _extend(self, listening: _Listening, added: Collection[str]) -> None:
        """The added backends' part of an open listen. Once acknowledged, only what the
        acknowledgement told the client was honoured (basic/patterns/subscriptions: nothing
        beyond the agreed subset): its list flags, its URIs that now route to an added
        backend. Before, what the client asked, and the acknowledgement waits for it too."""
        stream = listening.stream
        asked = stream.honoured if stream.honoured is not None else listening.wanted
        readable, hidden = listening.judge() if listening.judge is not None else (None, None)
        plans = self._plan(asked, readable, hidden, only=added, locate=listening.locate)
        for backend, plan in plans.items():
            stream.add(backend, plan)
            listening.tg.start_soon(
                self._keep_listening, backend, plan, listening.msg, listening.relay, listening.call
            )

    def _late_arrival(self, backend: str) -> None:
        """A backend's first catalog has come in after merged lists went without it (it was
        down, or starting past fan_out.start_wait): each open listen is told the lists it
        asked about, and the backend has, changed (a client that listed with it already, its
        own list having found it up, refetches once more)."""
        caps = self._catalogs.capabilities(backend) or {}
        for listening in list(self._open):
            stream = listening.stream
            plan = stream.plans.get(backend)
            if plan is None:
                continue
            notes: list[Message] = [
                {"jsonrpc": "2.0", "method": method, "params": {}}
                for flag, (capability, method) in LIST_FLAGS.items()
                if plan.flags.get(flag) and capability in caps
            ]
            if notes:
                listening.tg.start_soon(stream.announce, backend, notes)

    def heard(self, backend: str, note: Message) -> None:
        """A notification from a backend (on a listen stream, or outside any request)."""
        if self.on_heard is not None:
            self.on_heard(backend, note)

    def deliver(self, backend: str, note: Message) -> None:
        """Another replica's notice of `backend`: to every open listen whose plan covers it,
        as if its own backend stream had delivered it. Never waits for a client."""
        for listening in self._open:
            if not listening.stream.covers(backend):
                continue
            try:
                listening.remote.send_nowait((backend, note))
            except anyio.WouldBlock:
                log.debug("a listen's client is not reading: a notice of %s dropped", backend)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass  # (the listen is ending)
        for follower in self.followers:
            follower.deliver(backend, note)

    def follow(self, leader: Subscriptions) -> None:
        """A virtual server's listens in a cluster: what their backend streams hear is
        published as the merged server's is, and other replicas' notices reach them."""
        self.on_heard = leader.on_heard
        self.on_listens_changed = leader.on_listens_changed
        leader.followers.append(self)

    def unfollow(self, leader: Subscriptions) -> None:
        if self in leader.followers:
            leader.followers.remove(self)

    def interest(self) -> dict[str, set[str]]:
        """The backend URIs this replica's open listens ask each backend for (the plans: only
        URIs the caller may read and the backend can subscribe to), for the other replicas'
        watches (core/interest.py)."""
        wanted: dict[str, set[str]] = {}
        for listening in self._open:
            for backend, plan in listening.stream.plans.items():
                if plan.uris and backend in self._backends:
                    wanted.setdefault(backend, set()).update(plan.uris)
        for follower in self.followers:
            for backend, uris in follower.interest().items():
                wanted.setdefault(backend, set()).update(uris)
        return wanted

    async def watch(self, backend: str, relay: Relay, uris: Collection[str] = ()) -> None:
        """The replica's own listen on a backend for the list changes it announces (or may:
        capabilities unknown yet count), so that a change is heard here even when no client
        of this replica listens (core/changes.py, with a cluster bus), and for `uris`, the
        backend URIs other replicas' listens are subscribed to, if the backend can subscribe.
        As the gateway's own request, like a catalog load. Ends with the backend (a reload)
        or at once when there is nothing to ask of it."""
        caps = self._catalogs.capabilities(backend)
        plan = _Plan({f: True for f, (c, _) in LIST_FLAGS.items() if _announces_changes(caps, c)})
        if _can_subscribe(caps):
            plan.uris = {uri: uri for uri in uris}
        if backend not in self._backends or not (plan.flags or plan.uris):
            return
        msg: Message = {"params": {"_meta": meta.gateway_meta(self._catalogs.client_info)}}
        await self._keep_listening(backend, plan, msg, relay, GATEWAY_CALL)

    def close_all(self) -> None:
        """End every listen with its graceful completion result (gateway shutdown)."""
        self._closing.set()

    def _plan(
        self,
        wanted: Mapping[str, Any],
        readable: Readable | None = None,
        hidden: Hidden | None = None,
        only: Collection[str] | None = None,
        locate: tasks.Locate | None = None,
    ) -> dict[str, _Plan]:
        """`locate`: where each of the client's task ids is (core/tasks.py); without it task
        ids are not asked for."""
        plans: dict[str, _Plan] = {}
        extra = {k: v for k, v in wanted.items() if k not in SPLIT}
        for backend in self._backends if only is None else only:
            caps = self._catalogs.capabilities(backend)
            unseen = hidden(backend) if hidden is not None else frozenset()
            plan = _Plan(extra=dict(extra))
            for flag, (capability, _) in LIST_FLAGS.items():
                if capability in unseen:
                    continue  # changes to a list the caller sees nothing of are not its business
                if wanted.get(flag) is True and _announces_changes(caps, capability):
                    plan.flags[flag] = True
            plans[backend] = plan
        for uri in wanted.get("resourceSubscriptions") or ():
            route = self._catalogs.table.resource(uri) if isinstance(uri, str) else None
            if (
                route is None
                or route.backend not in plans
                or (readable is not None and not readable(route.backend, route.name))
            ):
                continue  # a URI the caller may not read is left out like an unknown one
            if _can_subscribe(self._catalogs.capabilities(route.backend)):
                plans[route.backend].uris[route.name] = uri
        asked = wanted.get(TASK_IDS)
        for task_id in asked if isinstance(asked, list) else ():
            found = locate(task_id) if locate is not None and isinstance(task_id, str) else None
            if found is not None and found[0] in plans:
                plans[found[0]].tasks[found[1]] = task_id
        return {b: p for b, p in plans.items() if p}

    async def listen(
        self,
        msg: Message,
        sink: NotificationSink,
        call: Call,
        judge: Judge | None = None,
        locate: tasks.Locate | None = None,
    ) -> Message:
        """`judge`, the policy's say when there is one: `readable(backend, uri)`, whether the
        caller may read a resource, so be told of its updates; `hidden(backend)`, the
        capabilities whose lists it sees nothing of, so is not told of their changes."""
        client_id = msg["id"]
        found = jsonrpc.params(msg).get("notifications")
        wanted: Mapping[str, Any] = found if isinstance(found, dict) else {}
        readable, hidden = judge() if judge is not None else (None, None)
        plans = self._plan(wanted, readable, hidden, locate=locate)
        pinning = self._catalogs.pinning  # (`pins.notify_wait`: fixed while the process runs)
        wait = pinning.notify_wait if pinning is not None else DEFAULT_PIN_NOTIFY_WAIT
        stream = _Stream(client_id, plans, sink, self._catalogs.list_changed, self._show_task, wait)

        async def relay(backend: str, note: Message) -> None:
            if note.get("method") != ACKNOWLEDGED:
                self.heard(backend, note)
            await stream.relay(backend, note)

        send, receive = anyio.create_memory_object_stream[tuple[str, Message]](REMOTE_QUEUE)
        listening: _Listening | None = None
        self.active += 1
        try:
            with send, receive:
                async with anyio.create_task_group() as tg:
                    listening = _Listening(
                        msg, call, wanted, judge, stream, relay, tg, send, locate
                    )
                    self._open.add(listening)
                    self._listens_changed()
                    for backend, plan in plans.items():
                        tg.start_soon(
                            self._keep_listening, backend, plan, msg, relay, call, stream.failed
                        )
                    tg.start_soon(_relay_remote, receive, stream)
                    with anyio.move_on_after(ACK_TIMEOUT):
                        await stream.settled(self.grace, self._catalogs)
                    await stream.acknowledge()
                    await self._closing.wait()
                    tg.cancel_scope.cancel()
        finally:
            if listening is not None:
                self._open.discard(listening)
                self._listens_changed()
            self.active -= 1
        return jsonrpc.result(
            client_id, {"resultType": "complete", "_meta": {meta.SUBSCRIPTION_ID: client_id}}
        )

    def _show_task(self, backend: str, task: dict[str, Any], client_id: str) -> None:
        exposure = self._exposures.get(backend)
        if exposure is not None:
            tasks.show(task, client_id, self._naming, exposure)

    def _listens_changed(self) -> None:
        if self.on_listens_changed is not None:
            self.on_listens_changed()

    async def _keep_listening(
        self,
        backend: str,
        plan: _Plan,
        client_msg: Message,
        relay: Relay,
        call: Call,
        failed: Callable[[str], None] | None = None,
    ) -> None:
        """`failed`: told of each attempt that failed (the acknowledgement need not wait for
        a backend that is down)."""
        delay = FIRST_RETRY
        client_meta = jsonrpc.meta(client_msg)
        own_meta = {k: v for k, v in client_meta.items() if k != meta.PROGRESS_TOKEN}

        async def sink(note: Message) -> None:
            await relay(backend, note)

        # Until a reload removes or replaces the backend: its part of the stream then ends
        # (the client's other backends go on), since its name may now be another's.
        target = self._backends[backend]
        while self._backends.get(backend) is target:
            started = anyio.current_time()
            request = {
                "jsonrpc": "2.0",
                "id": f"gateway-listen-{next(self._ids)}",
                "method": "subscriptions/listen",
                "params": {"_meta": own_meta, "notifications": plan.filter()},
            }
            try:
                await target.request(request, sink, call, long_lived=True)
                log.info("backend %s closed a listen stream; listening again", backend)
            except errors.BackendError as exc:
                # A backend that is down was logged as such once, not at every attempt.
                level = logging.DEBUG if isinstance(exc, errors.BackendDown) else logging.WARNING
                log.log(
                    level, "listen on %s lost (%s); listening again in %.1fs", backend, exc, delay
                )
                if failed is not None:
                    failed(backend)
            if anyio.current_time() - started > STABLE_AFTER:
                delay = FIRST_RETRY
            await anyio.sleep(delay)
            delay = min(delay * 2, MAX_RETRY)


class _Stream:
    """One client's listen: collects acknowledgements, then relays what the client asked for."""

    def __init__(
        self,
        client_id: jsonrpc.RequestId,
        plans: dict[str, _Plan],
        sink: NotificationSink,
        invalidate: Callable[[str], anyio.Event | None],
        show_task: Callable[[str, dict[str, Any], str], None] | None = None,
        pin_wait: float = DEFAULT_PIN_NOTIFY_WAIT,  # pins: a list change waits this long at most
    ) -> None:
        self._id = client_id
        self._pin_wait = pin_wait
        self._show_task = show_task
        self.plans = plans
        self._sink = sink
        self._invalidate = invalidate
        self._acks: dict[str, dict[str, Any]] = {}
        self._failed: set[str] = set()  # backends whose listen failed before they acknowledged
        self._progress = anyio.Event()  # set (and replaced) at each acknowledgement
        self._held: list[Message] = []
        self._acknowledged = False
        # What the acknowledgement told the client was honoured (None until it is sent).
        self.honoured: dict[str, Any] | None = None
        self.all_acked = anyio.Event()
        if not plans:
            self.all_acked.set()

    def covers(self, backend: str) -> bool:
        return backend in self.plans

    def add(self, backend: str, plan: _Plan) -> None:
        """A backend's part added by a reload (or replaced: the old one's stream has ended)."""
        self.plans[backend] = plan

    async def relay(self, backend: str, note: Message) -> None:
        method = note.get("method")
        params = jsonrpc.params(note)
        if method == ACKNOWLEDGED:
            if backend not in self._acks:
                honoured = params.get("notifications")
                self._acks[backend] = honoured if isinstance(honoured, dict) else {}
                self._check_settled()
            return  # later acknowledgements are re-subscriptions the client never sees
        if isinstance(method, str) and method.endswith("/list_changed"):
            judged = self._invalidate(backend)
            if judged is not None:  # pins: the new definitions judged before the client hears
                with anyio.move_on_after(self._pin_wait):
                    await judged.wait()
        await self._show(backend, note)

    async def announce(self, backend: str, notes: list[Message]) -> None:
        """The gateway's own notices of the backend's lists (not the backend's: its catalog,
        just loaded, stays as it is)."""
        for note in notes:
            await self._show(backend, note)

    async def _show(self, backend: str, note: Message) -> None:
        shown = self._for_client(backend, note)
        if shown is None:
            return
        if not self._acknowledged:
            self._held.append(shown)  # nothing may precede the acknowledgement
            return
        await self._sink(shown)

    def _for_client(self, backend: str, note: Message) -> Message | None:
        plan = self.plans[backend]
        method = note.get("method")
        params = dict(jsonrpc.params(note))
        if method == UPDATED:
            uri = params.get("uri")
            if not isinstance(uri, str) or uri not in plan.uris:
                return None
            params["uri"] = plan.uris[uri]
        elif method == tasks.NOTIFICATION:
            own = params.get("taskId")
            if not isinstance(own, str) or own not in plan.tasks:
                return None
            params["taskId"] = plan.tasks[own]
            if self._show_task is not None:
                self._show_task(backend, params, plan.tasks[own])
        elif plan.extra and method not in KNOWN:
            pass  # an extension's notification, asked for by its filter field
        elif not any(plan.flags.get(f) and m == method for f, (_, m) in LIST_FLAGS.items()):
            return None
        note_meta = params.get("_meta")
        params["_meta"] = {
            **(note_meta if isinstance(note_meta, dict) else {}),
            meta.SUBSCRIPTION_ID: self._id,
        }
        return {"jsonrpc": "2.0", "method": method, "params": params}

    def failed(self, backend: str) -> None:
        """A backend's listen failed (down, refused, timed out): the acknowledgement does not
        wait for it; if it acknowledges later, its part is relayed all the same."""
        if backend in self.plans and backend not in self._acks and backend not in self._failed:
            self._failed.add(backend)
            self._check_settled()

    def _check_settled(self) -> None:
        if len(self._acks.keys() | self._failed) >= len(self.plans):
            self.all_acked.set()
        self._progress.set()
        self._progress = anyio.Event()

    async def settled(self, grace: float, catalogs: Catalogs) -> None:
        """Until every backend has acknowledged or failed, or, once one has acknowledged,
        `grace` seconds have passed with no news from the others (a backend still starting,
        its first catalog load under way, is waited for as merged lists wait for it: within
        fan_out.start_wait of its start)."""
        while not self.all_acked.is_set():
            progress = self._progress
            if not self._acks:
                await progress.wait()
                continue
            outstanding = self.plans.keys() - self._acks.keys() - self._failed
            left = max((catalogs.start_left(b) for b in outstanding), default=0)
            if left > 0:
                with anyio.move_on_after(left):
                    await first_of(progress, catalogs.changed)
                continue
            with anyio.move_on_after(grace) as timer:
                await progress.wait()
            if timer.cancelled_caught:
                return

    async def acknowledge(self) -> None:
        honoured: dict[str, Any] = {}
        uris: list[str] = []
        task_ids: list[str] = []
        for backend, ack in self._acks.items():
            plan = self.plans[backend]
            for flag in LIST_FLAGS:
                if ack.get(flag) is True:
                    honoured[flag] = True
            uris += [plan.uris[u] for u in ack.get(RESOURCES) or () if u in plan.uris]
            task_ids += [plan.tasks[t] for t in ack.get(TASK_IDS) or () if t in plan.tasks]
            for name, value in ack.items():
                if name in plan.extra and name not in SPLIT:
                    honoured.setdefault(name, value)
        if uris:
            honoured[RESOURCES] = uris
        if task_ids:
            honoured[TASK_IDS] = task_ids
        self.honoured = honoured
        params = {"_meta": {meta.SUBSCRIPTION_ID: self._id}, "notifications": honoured}
        await self._sink({"jsonrpc": "2.0", "method": ACKNOWLEDGED, "params": params})
        while self._held:  # relays arriving meanwhile join the queue, keeping their order
            held, self._held = self._held, []
            for note in held:
                await self._sink(note)
        self._acknowledged = True


async def first_of(*events: anyio.Event) -> None:
    """Until one of `events` is set."""

    async def wait(event: anyio.Event) -> None:
        await event.wait()
        tg.cancel_scope.cancel()

    async with anyio.create_task_group() as tg:
        for event in events:
            tg.start_soon(wait, event)


async def _relay_remote(
    receive: anyio.abc.ObjectReceiveStream[tuple[str, Message]], stream: _Stream
) -> None:
    """Other replicas' notices, one at a time, held like local ones until the acknowledgement."""
    async for backend, note in receive:
        await stream.relay(backend, note)


def _announces_changes(caps: Mapping[str, Any] | None, capability: str) -> bool:
    """Unknown capabilities (catalog not loaded) count as present: the backend's ack decides."""
    if caps is None:
        return True
    declared = caps.get(capability)
    return isinstance(declared, dict) and bool(declared.get("listChanged"))


def _can_subscribe(caps: Mapping[str, Any] | None) -> bool:
    if caps is None:
        return True
    resources = caps.get("resources")
    return isinstance(resources, dict) and bool(resources.get("subscribe"))
