"""What the JSON-lines files the gateway writes (the traffic tap, the audit log) share: the
redaction rules, and an append-only file rotated by size.

`LineFile.write` is called from the event loop, so it does one `write(2)` of one complete line
and never fsyncs: the line reaches the page cache at once (a reader following the file sees it
live) without waiting for the disk, and a crash never leaves half a line.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.origin import HeaderFields
from gateway.sensitive import REDACTED as REDACTED  # (one marker for every redacted value)

log = logging.getLogger("gateway.telemetry")

WILDCARD = "*"
# Credentials that must never reach a recording, whatever the config says.
ALWAYS_REDACTED_HEADERS = frozenset(
    {"authorization", "cookie", "proxy-authorization", "set-cookie"}
)
# Recordings hold what clients and servers said; only the gateway's user may read them.
FILE_MODE = 0o600


# --- redaction --------------------------------------------------------------------------------


@dataclass
class Rule:
    """One level of the redaction rules: the keys below it, and whether it is itself redacted."""

    redact: bool = False
    children: dict[str, Rule] = field(default_factory=dict)


def compile_rules(paths: Iterable[str]) -> Rule:
    root = Rule()
    for path in paths:
        node = root
        for key in path.split("."):
            node = node.children.setdefault(key, Rule())
        node.redact = True
    return root


def redact(value: Any, rules: Rule) -> Any:
    """`value` with every value the rules name replaced; copies only what it changes."""
    if not rules.children:
        return value
    if isinstance(value, dict):
        keys: Iterable[Any] = value if WILDCARD in rules.children else rules.children
        out: dict[str, Any] | None = None
        for key in keys:
            if key not in value:
                continue
            new = _apply(value[key], str(key), rules)
            if new is not value[key]:
                out = dict(value) if out is None else out
                out[key] = new
        return value if out is None else out
    if isinstance(value, list):
        copied: list[Any] | None = None
        for i, item in enumerate(value):
            new = _apply(item, str(i), rules)
            if new is not item:
                copied = list(value) if copied is None else copied
                copied[i] = new
        return value if copied is None else copied
    return value


def _apply(value: Any, key: str, rules: Rule) -> Any:
    found = (rules.children.get(key), rules.children.get(WILDCARD))
    matching = [r for r in found if r is not None]
    if any(r.redact for r in matching):
        return REDACTED
    for rule in matching:
        value = redact(value, rule)
    return value


def redact_headers(headers: HeaderFields, names: frozenset[str]) -> dict[str, Any]:
    """Headers as recorded: listed names (lower case) redacted; a repeated name becomes a list."""
    out: dict[str, Any] = {}
    fields = headers.items() if isinstance(headers, Mapping) else headers
    for raw_name, value in fields:
        name = str(raw_name)  # aiohttp's case-insensitive `istr` keys are not plain str to orjson
        shown = REDACTED if name.lower() in names else str(value)
        if name in out:
            held = out[name]
            out[name] = [*held, shown] if isinstance(held, list) else [held, shown]
        else:
            out[name] = shown
    return out


# --- the file ---------------------------------------------------------------------------------


class LineFile:
    """Appends whole lines to `path`, rotating by size: path -> path.1 -> ... -> path.{backups}.

    Opening happens here, so an unusable path fails at start-up (OSError). Later write errors (a
    full disk) are logged once, as `what`, and the line is dropped: recording never breaks a call.
    """

    def __init__(self, path: str | Path, max_bytes: int, backups: int, what: str) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.backups = backups
        self.what = what
        # Called from the event loop, but a backend might one day record from a thread.
        self._lock = threading.Lock()
        self._failed = False
        self._fd: int | None = self._open()
        self._size = os.fstat(self._fd).st_size

    def write(self, line: bytes) -> None:
        with self._lock:
            try:
                if self._fd is None:
                    return
                if self._size and self._size + len(line) > self.max_bytes:
                    self._rotate()
                os.write(self._fd, line)
                self._size += len(line)
            except OSError as exc:
                if not self._failed:
                    log.warning(
                        "%s: cannot write %s (%s); dropping records", self.what, self.path, exc
                    )
                    self._failed = True

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)

    def _rotate(self) -> None:
        """Each file moves one up, overwriting the oldest; no backups: start afresh."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        for i in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
        if self.backups:
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink(missing_ok=True)
        self._fd = self._open()
        self._size = 0

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
