"""The traffic tap: every JSON-RPC message on both hops, as JSON lines, and a summary of them.

`Tap.record` is called on the hot path from the event loop; it writes one complete line with one
`write(2)` and no fsync (records.LineFile), so `mcp-transparent-gateway tap --follow` sees calls
live. The redaction rules are records.py's too, shared with the audit log.

`summarize` and the `Summarizer` behind it are pure: they read lines, never the file.
"""

from __future__ import annotations

import heapq
import os
import time
from collections import Counter, deque
from collections.abc import Generator, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson

from gateway.config import TapConfig
from gateway.origin import HeaderFields
from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import Message
from gateway.sensitive import Scanner, redact_values
from gateway.telemetry.records import (
    ALWAYS_REDACTED_HEADERS,
    LineFile,
    compile_rules,
    redact,
    redact_headers,
)
from gateway.telemetry.records import REDACTED as REDACTED  # (what recordings show instead)

HOPS = ("frontend", "backend")
DIRECTIONS = ("in", "out")
# How many slowest calls `summarize` keeps unless told otherwise.
DEFAULT_TOP = 10
# How often `follow` looks for new lines when there are none: live enough for a person watching.
FOLLOW_POLL_SECONDS = 0.2


# --- recording --------------------------------------------------------------------------------


def _now() -> str:
    # RFC 3339 in UTC with microseconds, e.g. 2026-08-01T12:00:00.123456Z.
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


class Tap:
    """Appends one JSON line per message to `config.path`, rotating by size (records.LineFile:
    an unusable path fails at start-up, a later write error drops the message, logged once)."""

    def __init__(self, config: TapConfig) -> None:
        self.config = config
        self.path = Path(config.path)
        self._rules = compile_rules(config.redact)
        self._headers = ALWAYS_REDACTED_HEADERS | {h.lower() for h in config.redact_headers}
        self._file = LineFile(self.path, config.max_bytes, config.backups, "traffic tap")
        # `redact_secrets`: the redact hook's table over every string (gateway/sensitive.py).
        self._scanner = Scanner() if config.redact_secrets else None

    def record(
        self,
        hop: str,
        direction: str,
        msg: Message,
        headers: HeaderFields | None = None,
        backend: str | None = None,
    ) -> None:
        """Record one message as seen by the gateway: `hop` frontend|backend, `direction` in|out."""
        head: dict[str, Any] = {"ts": _now(), "hop": hop, "dir": direction}
        if backend is not None:
            head["backend"] = backend
        if headers is not None:
            head["headers"] = redact_headers(headers, self._headers)
        try:
            shown = redact(msg, self._rules)
            if self._scanner is not None:
                shown = redact_values(shown, self._scanner, Counter())
            body = jsonrpc.dumps(shown)
        except TypeError as exc:  # orjson.JSONEncodeError: not what orjson produced
            body = jsonrpc.dumps({"unencodable": str(exc), **_identity(msg)})
        if len(body) > self.config.max_message_bytes:
            body = jsonrpc.dumps({"truncated": True, "bytes": len(body), **_identity(msg)})
        # Splice the already encoded message in rather than encoding it a second time.
        self._file.write(orjson.dumps(head)[:-1] + b',"msg":' + body + b"}\n")

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Tap:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _identity(msg: Message) -> dict[str, Any]:
    return {k: msg[k] for k in ("method", "id") if k in msg}


# --- summary ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """A request on the frontend hop and its response: what a client saw."""

    started: str  # ts of the request, as recorded
    ms: float  # from the request coming in to the response going out
    method: str
    name: str | None  # tools/call and prompts/get: params.name
    id: Any
    error: int | None  # the error code, or None for a result
    # A result whose `isError` is true (a tool's own failure, schema/server/tools): no JSON-RPC
    # error, but not a success either (issue 36: the summary called it "ok").
    is_error: bool = False

    @property
    def outcome(self) -> str:
        if self.error is not None:
            return f"error {self.error}"
        return "error (isError)" if self.is_error else "ok"


@dataclass(frozen=True)
class Summary:
    records: int = 0
    malformed: int = 0  # lines that are not a tap record, skipped
    methods: Mapping[str, int] = field(default_factory=dict)  # client requests (frontend, in)
    names: Mapping[str, int] = field(default_factory=dict)  # "tools/call echo" -> count
    errors: Mapping[int, int] = field(default_factory=dict)  # error responses to clients, by code
    tool_errors: int = 0  # results to clients with `isError: true`
    backend_calls: Mapping[str, int] = field(default_factory=dict)  # "backend method" -> count
    unanswered: int = 0  # frontend requests with no response (yet)
    slowest: tuple[Call, ...] = ()


NAMED_METHODS = ("tools/call", "prompts/get")


def _name(msg: Mapping[str, Any]) -> str | None:
    params = msg.get("params")
    if msg.get("method") in NAMED_METHODS and isinstance(params, dict):
        name = params.get("name")
        return name if isinstance(name, str) else None
    return None


def _is_error_result(msg: Mapping[str, Any]) -> bool:
    result = msg.get("result")
    return isinstance(result, dict) and result.get("isError") is True


def _error_code(msg: Mapping[str, Any]) -> int | None:
    error = msg.get("error")
    if isinstance(error, dict):
        code = error.get("code")
        return code if isinstance(code, int) else 0
    return None


class Summarizer:
    """Reads a recording line by line; `feed` returns each frontend call as it completes."""

    def __init__(self, top: int = DEFAULT_TOP) -> None:
        self.top = top
        self.records = 0
        self.malformed = 0
        self.methods: Counter[str] = Counter()
        self.names: Counter[str] = Counter()
        self.errors: Counter[int] = Counter()
        self.tool_errors = 0
        self.backend_calls: Counter[str] = Counter()
        # Requests waiting for their response, by (hop, backend, id, direction). A queue, not one
        # slot: HTTP clients each number their own requests, so ids repeat on the frontend hop.
        self._pending: dict[tuple[str, str, bytes, str], deque[dict[str, Any]]] = {}
        self._slowest: list[tuple[float, int, Call]] = []  # a min-heap of the `top` slowest
        self._seq = 0

    def feed(self, line: bytes | str) -> Call | None:
        if not line.strip():
            return None
        try:
            rec = orjson.loads(line)
            hop, direction, msg = rec["hop"], rec["dir"], rec["msg"]
            ts = datetime.fromisoformat(rec["ts"])
        except (orjson.JSONDecodeError, TypeError, KeyError, ValueError):
            self.malformed += 1
            return None
        if hop not in HOPS or direction not in DIRECTIONS or not isinstance(msg, dict):
            self.malformed += 1
            return None
        self.records += 1
        if "id" not in msg:
            return None  # a notification
        key = (hop, str(rec.get("backend") or ""), orjson.dumps(msg["id"]))
        if isinstance(msg.get("method"), str):
            self._request(hop, direction, rec, msg, ts)
            self._pending.setdefault((*key, direction), deque()).append(rec | {"_ts": ts})
            return None
        to_client = hop == "frontend" and direction == "out"
        code = _error_code(msg)
        if to_client and code is not None:
            self.errors[code] += 1  # paired or not: a -32700 answer has no request to pair
        is_error = to_client and _is_error_result(msg)
        if is_error:
            self.tool_errors += 1
        opposite = "out" if direction == "in" else "in"
        waiting = self._pending.get((*key, opposite))
        if not waiting:
            return None  # its request was before the recording began (or rotated away)
        request = waiting.popleft()
        if not waiting:
            del self._pending[(*key, opposite)]
        return self._complete(request, code, ts, is_error) if to_client else None

    def _request(
        self, hop: str, direction: str, rec: dict[str, Any], msg: dict[str, Any], ts: datetime
    ) -> None:
        method = msg["method"]
        if hop == "frontend" and direction == "in":
            self.methods[method] += 1
            name = _name(msg)
            if name is not None:
                self.names[f"{method} {name}"] += 1
        elif hop == "backend" and direction == "out":
            self.backend_calls[f"{rec.get('backend') or '?'} {method}"] += 1

    def _complete(
        self, request: dict[str, Any], code: int | None, ts: datetime, is_error: bool
    ) -> Call:
        asked = request["msg"]
        call = Call(
            started=request["ts"],
            ms=(ts - request["_ts"]).total_seconds() * 1000,
            method=asked["method"],
            name=_name(asked),
            id=asked["id"],
            error=code,
            is_error=is_error,
        )
        self._seq += 1
        entry = (call.ms, self._seq, call)
        if len(self._slowest) < self.top:
            heapq.heappush(self._slowest, entry)
        elif self.top:
            heapq.heappushpop(self._slowest, entry)
        return call

    def summary(self) -> Summary:
        unanswered = sum(
            len(q) for (hop, _, _, d), q in self._pending.items() if (hop, d) == ("frontend", "in")
        )
        return Summary(
            records=self.records,
            malformed=self.malformed,
            methods=dict(self.methods.most_common()),
            names=dict(self.names.most_common()),
            errors=dict(self.errors.most_common()),
            tool_errors=self.tool_errors,
            backend_calls=dict(self.backend_calls.most_common()),
            unanswered=unanswered,
            slowest=tuple(c for _, _, c in sorted(self._slowest, reverse=True)),
        )


def summarize(lines: Iterable[bytes | str], top: int = DEFAULT_TOP) -> Summary:
    summarizer = Summarizer(top)
    for line in lines:
        summarizer.feed(line)
    return summarizer.summary()


def follow(
    path: Path, offset: int = 0, poll: float = FOLLOW_POLL_SECONDS
) -> Generator[bytes, None, None]:
    """Complete lines appended to `path` after `offset`, forever; survives rotation.

    When the file is rotated away (or truncated), what was left in the old one is read first,
    then the new file from its start. A line still being written is held until it is whole.
    """
    handle = path.open("rb")
    try:
        handle.seek(offset)
        partial = b""
        while True:
            chunk = handle.read()
            if chunk:
                *lines, partial = (partial + chunk).split(b"\n")
                yield from lines
                continue
            try:
                now = os.stat(path)
            except FileNotFoundError:
                now = None  # between the rename and the new file's creation
            mine = os.fstat(handle.fileno())
            if now is not None and (now.st_ino != mine.st_ino or now.st_size < handle.tell()):
                handle.close()
                handle = path.open("rb")
                partial = b""
                continue
            time.sleep(poll)
    finally:
        handle.close()


# --- text -------------------------------------------------------------------------------------


def _table(header: tuple[str, ...], rows: Iterable[tuple[object, ...]]) -> list[str]:
    """Left-aligned text, right-aligned numbers, two spaces between columns."""
    cells = [header, *(tuple("" if v is None else str(v) for v in row) for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    numeric = [all(_is_number(row[i]) for row in cells[1:]) for i in range(len(header))]
    out = []
    for row in cells:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(row, widths, numeric, strict=True)
        ]
        out.append("  " + "  ".join(parts).rstrip())
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def format_call(call: Call) -> str:
    """One completed call on one line, as `tap --follow` prints it."""
    outcome = call.outcome
    name = f" {call.name}" if call.name else ""
    ident = orjson.dumps(call.id).decode()
    return f"{call.started}  {call.method}{name}  id={ident}  {call.ms:.1f} ms  {outcome}"


def format_summary(summary: Summary) -> str:
    lines = [
        f"{summary.records} records, {summary.malformed} malformed lines skipped, "
        f"{sum(summary.methods.values())} client requests, {summary.unanswered} unanswered"
        + (f", {summary.tool_errors} results with isError" if summary.tool_errors else "")
    ]
    sections: list[tuple[str, tuple[str, ...], list[tuple[object, ...]]]] = [
        ("Client requests by method", ("method", "calls"), list(summary.methods.items())),
        ("Tools and prompts", ("name", "calls"), list(summary.names.items())),
        ("Errors returned to clients", ("code", "count"), list(summary.errors.items())),
        ("Backend requests", ("backend method", "calls"), list(summary.backend_calls.items())),
        (
            f"Slowest {len(summary.slowest)} (frontend: request in -> response out)",
            ("ms", "method", "name", "id", "started", "outcome"),
            [
                (
                    f"{c.ms:.1f}",
                    c.method,
                    c.name or "",
                    orjson.dumps(c.id).decode(),
                    c.started,
                    c.outcome,
                )
                for c in summary.slowest
            ],
        ),
    ]
    for title, header, rows in sections:
        if rows:
            lines += ["", title, *_table(header, rows)]
    return "\n".join(lines)
