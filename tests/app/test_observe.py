"""The observation outputs opened from the config (gateway/app/observe.py): the access log's
file mode."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

from gateway.app.observe import access_logger
from gateway.config import parse

MINIMAL = "listen: {stdio: true}\nbackends:\n  a: {stdio: {command: x}}\n"


def _close(logger: logging.Logger | None) -> None:
    assert logger is not None
    for handler in logger.handlers:
        handler.close()
    logger.handlers = []


def test_a_new_access_log_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    """It names callers, peers and tools: mode 0600 whatever the umask, as the tap's files."""
    target = tmp_path / "access.log"
    config = parse(MINIMAL + f"telemetry: {{access_log: {target}}}\n", env={})
    logger = access_logger(config)
    try:
        logger.info("one line")  # type: ignore[union-attr]
    finally:
        _close(logger)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert target.read_text() == "one line\n"


def test_an_existing_access_log_keeps_its_mode_and_lines(tmp_path: Path) -> None:
    """An operator's chosen mode (a log shipper's group) is left alone; lines are appended."""
    target = tmp_path / "access.log"
    target.write_text("before\n")
    target.chmod(0o640)
    config = parse(MINIMAL + f"telemetry: {{access_log: {target}}}\n", env={})
    logger = access_logger(config)
    try:
        logger.info("after")  # type: ignore[union-attr]
    finally:
        _close(logger)
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert target.read_text() == "before\nafter\n"
