"""The audit log: one JSON line per client request (`audit:`), saying who asked (the caller's
identity, as the front end established it), what (method, name or URI, JSON-RPC id), where it
went (the backend), how it ended (outcome, error code), how long it took, and the trace id.

Written when the request's observation ends (otel.py's `_end_server`), where the backend the
dispatcher routed to and the span's trace id are known, so both front ends and both eras are
covered by one call. A line is encoded here and appended with one `write(2)` (records.LineFile,
the tap's rotating file); credentials never reach it: neither the request's headers nor the
token are looked at, and arguments only when configured, through the tap's redaction rules.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import orjson

from gateway.config import AUDIT_STDERR, AuditConfig
from gateway.origin import Origin
from gateway.protocol import jsonrpc
from gateway.telemetry.api import Message
from gateway.telemetry.logs import utc_now
from gateway.telemetry.records import LineFile, Rule, compile_rules, redact

log = logging.getLogger("gateway.telemetry")

# Requests whose arguments the audit line can carry (`include_arguments`).
WITH_ARGUMENTS = ("tools/call", "prompts/get")
NAMED = ("tools/call", "prompts/get")
# Requests about a task (Tasks extension): their name is the tool that created the task, which
# only the dispatcher knows (from the sealed task id: core/tasks.py).
TASK_METHODS = ("tasks/get", "tasks/update", "tasks/cancel")


def _outcome(reply: Message | None) -> tuple[str, int | None]:
    if reply is None:
        return "cancelled", None
    if "error" in reply:
        return "error", jsonrpc.error_code(reply)
    result = reply.get("result")
    if isinstance(result, dict) and result.get("isError") is True:
        return "tool_error", None
    return "ok", None


def _subject(msg: Message) -> tuple[str | None, str | None]:
    """The name (tool, prompt) and URI (resource) a request is about, as the client gave them."""
    params = jsonrpc.params(msg)
    method = msg.get("method")
    if method in NAMED:
        name = params.get("name")
        return (name if isinstance(name, str) else None), None
    if method == "resources/read":
        uri = params.get("uri")
        return None, uri if isinstance(uri, str) else None
    if method == "completion/complete":
        ref = params.get("ref")
        if isinstance(ref, dict):
            name, uri = ref.get("name"), ref.get("uri")
            return (name if isinstance(name, str) else None), uri if isinstance(uri, str) else None
    return None, None


def entry(
    msg: Message,
    origin: Origin,
    reply: Message | None,
    backend: str | None,
    seconds: float,
    trace_id: str,
    arguments: Rule | None = None,
    max_arguments: int = 0,
    target: str | None = None,
) -> dict[str, Any]:
    """One audit record (pure but for the clock); `arguments`: the redaction rules when the
    request's arguments are to be included, and `max_arguments` their longest encoding;
    `target`: the tool the dispatcher routed a task method as."""
    identity = origin.identity
    name, uri = _subject(msg)
    if name is None and msg.get("method") in TASK_METHODS:
        name = target
    outcome, code = _outcome(reply)
    out: dict[str, Any] = {
        "time": utc_now(),  # e.g. 2026-08-01T12:00:00.123Z, as the log
        "frontend": origin.frontend,
        "peer": origin.peer,
        "subject": identity.subject if identity is not None else None,
        "client_id": identity.client_id if identity is not None else None,
        "issuer": identity.issuer if identity is not None else None,
        "auth": identity.method if identity is not None else None,
        "method": msg.get("method"),
        "name": name,
        "uri": uri,
        "backend": backend,
        "outcome": outcome,
        "code": code,
        "duration_ms": round(seconds * 1000, 3),
        "id": msg.get("id"),
        "trace_id": trace_id or None,
    }
    if arguments is not None and msg.get("method") in WITH_ARGUMENTS:
        shown = jsonrpc.params(redact(msg, arguments)).get("arguments")
        if shown is not None:
            out["arguments"] = _bounded(shown, max_arguments)
    return out


def _bounded(arguments: Any, limit: int) -> Any:
    """The arguments, encoded once (spliced into the line as they are), or only their size."""
    try:
        encoded = jsonrpc.dumps(arguments)
    except TypeError as exc:  # (orjson.JSONEncodeError) not what orjson produced
        return {"unencodable": str(exc)}
    if len(encoded) > limit:
        return {"truncated": True, "bytes": len(encoded)}
    return orjson.Fragment(encoded)


class AuditLog:
    """Appends audit records to a file (rotated by size) or to stderr.

    A file is opened here, so an unusable path fails at start-up (OSError); a later write error
    drops the line, logged once."""

    def __init__(self, config: AuditConfig) -> None:
        self.config = config
        self._rules = compile_rules(config.redact) if config.include_arguments else None
        self._max_arguments = config.max_arguments_bytes
        self._file = (
            None
            if config.path == AUDIT_STDERR
            else LineFile(config.path, config.max_bytes, config.backups, "audit log")
        )
        self._failed = False

    def record(
        self,
        msg: Message,
        origin: Origin,
        reply: Message | None,
        backend: str | None,
        seconds: float,
        trace_id: str,
        target: str | None = None,
    ) -> None:
        record = entry(
            msg,
            origin,
            reply,
            backend,
            seconds,
            trace_id,
            self._rules,
            self._max_arguments,
            target,
        )
        self._write(jsonrpc.dumps(record) + b"\n")

    def _write(self, line: bytes) -> None:
        if self._file is not None:
            self._file.write(line)
            return
        try:
            # The stream the gateway's own log lines go to, so lines never interleave.
            sys.stderr.write(line.decode())
            sys.stderr.flush()
        except (OSError, ValueError) as exc:
            if not self._failed:
                self._failed = True
                log.warning("audit log: cannot write to stderr (%s); dropping records", exc)

    def event(self, record: dict[str, Any]) -> None:
        """A line of its own for something that happened within a request (a hook's refusal or
        change: gateway/hooks/runner.py), stamped with the time."""
        self._write(jsonrpc.dumps({"time": utc_now(), **record}) + b"\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
