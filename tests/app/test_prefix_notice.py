"""Prefix mode `auto` prefixes a server's names once it has two backends: adding a second
backend renames the first one's tools. check-config's summary, the start-up log and a reload
that makes it so each say it in one line, naming the key that pins it (issue 36)."""

from __future__ import annotations

import logging
import re

import pytest
import yaml

from gateway.app import Gateway
from gateway.config import describe, parse
from gateway.config.describe import prefix_notices
from tests.support import PYTHON

DEMO = {"stdio": {"command": PYTHON, "args": ["-m", "gateway.demo.server"]}}
LISTEN = {"http": {"host": "127.0.0.1", "port": 0}}


def config_text(backends: dict[str, object], **extra: object) -> str:
    return yaml.safe_dump({"listen": LISTEN, "backends": backends, **extra}, sort_keys=False)


def notices_in(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "under prefix auto" in r.getMessage()]


def test_two_backends_under_auto_get_one_line_naming_the_key_that_pins_it() -> None:
    config = parse(config_text({"github": DEMO, "files": DEMO}))
    (notice,) = prefix_notices(config)
    assert "\n" not in notice and "github_search" in notice
    assert "namespacing: {prefix: always}" in notice and "namespacing: {prefix: never}" in notice
    assert f"  note: {notice}" in describe(config).splitlines()


@pytest.mark.parametrize(
    "backends, namespacing",
    [
        ({"github": DEMO}, None),
        ({"a": DEMO, "b": DEMO}, "always"),
        ({"a": DEMO, "b": DEMO}, "never"),
    ],
)
def test_no_line_where_nothing_is_renamed_behind_the_users_back(
    backends: dict[str, object], namespacing: str | None
) -> None:
    """One backend is shown as it is; `always` and `never` are pinned by the user already."""
    extra = {"namespacing": {"prefix": namespacing}} if namespacing else {}
    config = parse(config_text(backends, **extra))
    assert prefix_notices(config) == []
    assert "note:" not in describe(config)


def test_a_virtual_server_of_two_backends_names_its_own_key() -> None:
    servers = {
        "docs": {"path": "/docs", "backends": {"a": {"namespace": "kb"}, "b": {}}},
        "one": {"path": "/one", "backends": {"a": {}}},
    }
    config = parse(
        config_text({"a": DEMO, "b": DEMO}, servers=servers, namespacing={"prefix": "always"})
    )
    assert prefix_notices(config) == []  # the top level's `always` holds for the servers too
    config = parse(config_text({"a": DEMO, "b": DEMO}, servers=servers))
    merged, docs = prefix_notices(config)
    assert merged.startswith("2 backends")
    assert docs.startswith("server docs: ") and "kb_search" in docs
    assert "servers.docs.namespacing: {prefix: always}" in docs


@pytest.mark.anyio
async def test_the_start_up_log_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gateway")
    Gateway(parse(config_text({"github": DEMO, "files": DEMO})))
    (line,) = notices_in(caplog)
    assert re.search(r"^2 backends under prefix auto.*`namespacing: \{prefix: always\}`", line)


@pytest.mark.anyio
async def test_a_reload_that_adds_the_second_backend_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gateway")
    two = config_text({"github": DEMO, "files": DEMO})
    async with Gateway(parse(config_text({"github": DEMO}))) as gw:
        assert notices_in(caplog) == []
        assert await gw.reload(lambda: parse(two)) is not None
        assert len(notices_in(caplog)) == 1
        assert await gw.reload(lambda: parse(two)) is not None  # nothing renamed this time
        assert len(notices_in(caplog)) == 1
