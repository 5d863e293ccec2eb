"""`pins:` and `backends.NAME.pins:` (docs/trusting-tools/pinning.md): the defaults when `pins:`
is given, the file relative to the config's folder, a backend's own `on_change`, and the
problems the loader names."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway.config import ConfigInvalid, describe, load, parse
from gateway.config.pins import (
    DEFAULT_PIN_MODE,
    DEFAULT_PIN_NOTIFY_WAIT,
    DEFAULT_PIN_POLL_INTERVAL,
)

BASE = {"listen": {"stdio": True}, "backends": {"a": {"stdio": {"command": "x"}}}}


def config_with(**extra: object) -> str:
    doc: dict[str, object] = {**BASE, **extra}
    return yaml.safe_dump(doc)


def test_without_pins_nothing_is_pinned() -> None:
    config = parse(config_with())
    assert config.pins is None and config.pin_mode(config.backends[0]) is None


def test_pins_given_empty_blocks_and_names_pins_json_beside_the_config(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "gateway.yaml"
    path.write_text(config_with(pins={}))
    config = load(path, {})
    assert config.pins is not None
    assert config.pins.file == str(tmp_path / "sub" / "pins.json")
    assert DEFAULT_PIN_MODE == "block" and config.pin_mode(config.backends[0]) == "block"
    assert config.pins.poll_interval == DEFAULT_PIN_POLL_INTERVAL == 1.0
    assert config.pins.notify_wait == DEFAULT_PIN_NOTIFY_WAIT == 5.0


def test_the_poll_interval_and_notify_wait_are_read() -> None:
    config = parse(config_with(pins={"poll_interval": 0.25, "notify_wait": 30}))
    assert config.pins is not None
    assert (config.pins.poll_interval, config.pins.notify_wait) == (0.25, 30.0)


def test_a_backend_overrides_the_top_level_mode(tmp_path: Path) -> None:
    backends = {
        "a": {"stdio": {"command": "x"}, "pins": {"on_change": "warn"}},
        "b": {"stdio": {"command": "x"}, "pins": {}},
        "c": {"stdio": {"command": "x"}},
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(
        config_with(backends=backends, pins={"file": "trust/p.json", "on_change": "allow"})
    )
    config = load(path, {})
    assert [config.pin_mode(b) for b in config.backends] == ["warn", "allow", "allow"]
    assert config.pins is not None and config.pins.file == str(tmp_path / "trust" / "p.json")


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        ({"pins": {"on_change": "ignore"}}, "pins.on_change: must be one of block, warn, allow"),
        ({"pins": {"watch": True}}, "pins.watch: unknown key"),
        ({"pins": {"poll_interval": 0}}, "pins.poll_interval: must be a positive number"),
        ({"pins": {"poll_interval": "1s"}}, "pins.poll_interval: must be a positive number"),
        ({"pins": {"notify_wait": -1}}, "pins.notify_wait: must be a positive number"),
        ({"pins": {"notify_wait": True}}, "pins.notify_wait: must be a positive number"),
        ({"pins": ["pins.json"]}, "pins: must be a mapping"),
        (
            {"backends": {"a": {"stdio": {"command": "x"}, "pins": {"on_change": "warn"}}}},
            "backends.a.pins: needs the top-level pins:",
        ),
        (
            {
                "pins": {},
                "backends": {"a": {"stdio": {"command": "x"}, "pins": {"on_change": 1}}},
            },
            "backends.a.pins.on_change: must be one of",
        ),
    ],
)
def test_what_the_loader_refuses(extra: dict[str, object], where: str) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        parse(config_with(**extra))
    assert any(where in problem for problem in caught.value.problems), caught.value.problems


def test_check_config_describes_the_pins() -> None:
    backends = {"a": {"stdio": {"command": "x"}, "pins": {"on_change": "warn"}}}
    lines = describe(parse(config_with(backends=backends, pins={"file": "/srv/p.json"})))
    assert "  pins         /srv/p.json, on change block (backends: a warn)" in lines.splitlines()
    assert "pins" not in describe(parse(config_with()))
