"""The gateway's log on stderr: `text` for people, `json` (one object a line) for collectors.

Both write times in UTC with the zone, and both keep one record on one line as far as its
message goes: a child's stderr line or a client's string inside a message cannot start a line
that looks like another record (log injection). Text escapes control characters; JSON's own
string escaping does it there.
"""

from __future__ import annotations

import logging
import re
import sys
import types
from datetime import UTC, datetime
from typing import Any

import orjson

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# What a LogRecord has of its own; anything else on a record came from `extra=` and goes into
# a JSON line as a field of its own. (`message` and `asctime` are set by formatting.)
_RECORD_ATTRS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}

# C0 controls but tab, DEL, C1 controls, and the Unicode line and paragraph separators (some
# viewers break lines at them too).
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
_JSON_BREAKS = re.compile("[\x85\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r"}


def _escape_one(match: re.Match[str]) -> str:
    char = match.group()
    return _NAMED.get(char) or (
        f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"
    )


def escape(text: str) -> str:
    """`text` on one line: newlines as `\\n`, other control characters as `\\xNN`."""
    return _CONTROL.sub(_escape_one, text)


def rfc3339(seconds: float, timespec: str = "milliseconds") -> str:
    """`seconds` since the epoch as an RFC 3339 UTC time, `2026-12-06T05:41:43.123Z`."""
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec=timespec).replace("+00:00", "Z")


def utc_now(timespec: str = "milliseconds") -> str:
    """Now, as `rfc3339` writes it: the one time format of the log, access log and audit."""
    return datetime.now(UTC).isoformat(timespec=timespec).replace("+00:00", "Z")


def _plain(value: Any) -> str:
    return str(value).encode("utf-8", "backslashreplace").decode()


class TextFormatter(logging.Formatter):
    """`2026-12-06T05:41:43.123Z INFO gateway.app: message`: the classic look, UTC times with
    the zone, the record's line escaped. A traceback still follows on lines of its own (only a
    bug logs one: bad input is one line, never a traceback); `json` keeps it in the record."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return rfc3339(record.created)

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape(super().formatMessage(record))


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, then `exception`/`stack` when the
    record has them, then whatever the code passed with `extra=`."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": rfc3339(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exception"] = record.exc_text
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        for key, value in record.__dict__.items():
            if key not in _RECORD_ATTRS and key not in doc:
                doc[key] = value
        try:
            line = orjson.dumps(doc, default=str).decode()
        except (orjson.JSONEncodeError, TypeError):
            # What orjson refuses (a lone surrogate, an int over 64 bits) goes as an escaped
            # string: the record still comes out as one line rather than a traceback.
            line = orjson.dumps({key: _plain(value) for key, value in doc.items()}).decode()
        if not line.isascii():
            # Valid JSON unescaped, but line breaks to some readers (str.splitlines among them);
            # they can only be inside strings here, so escaping them keeps the same JSON.
            line = _JSON_BREAKS.sub(lambda m: f"\\u{ord(m.group()):04x}", line)
        return line


def setup(level: str, fmt: str = "text") -> None:
    """The root logger writes `level` and above to stderr in `fmt` (FORMATS). As
    `logging.basicConfig`, nothing changes if the root logger has handlers already (a test's
    capture, an embedding program's own)."""
    if logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler])
    if fmt == "json":
        # Python's warnings and an uncaught exception would otherwise be raw text on stderr.
        logging.captureWarnings(True)
        sys.excepthook = _log_uncaught


def _log_uncaught(
    kind: type[BaseException], exc: BaseException, tb: types.TracebackType | None
) -> None:
    logging.getLogger("gateway").critical("uncaught exception", exc_info=(kind, exc, tb))
