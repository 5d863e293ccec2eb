"""`pins record|diff|approve` refusals (gateway/cli/pins.py): each names what is wrong in one
line, with no traceback; exit 2 for a config that cannot be used so, 1 for what the backends
say. The working paths (record, diff, approve against a real server) are in
tests/system/test_pins.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support import PYTHON, ROOT, run_cli, stdio_backend

RUGPULL = str(ROOT / "tests" / "servers" / "rugpull_server.py")


def config(tmp_path: Path, *, pins: bool = True) -> Path:
    (tmp_path / "state").mkdir(exist_ok=True)
    doc: dict[str, object] = {
        "listen": {"stdio": True},
        "backends": {"rug": stdio_backend([PYTHON, RUGPULL, str(tmp_path / "state")])},
    }
    if pins:
        doc["pins"] = {}
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize(
    ("args", "status", "said"),
    [
        (("approve", "nope"), 2, "has no backend 'nope'"),
        (("diff", "nope"), 2, "has no backend 'nope'"),
        (("approve", "rug", "missing"), 1, "lists no tool, prompt or template named 'missing'"),
    ],
)
def test_what_cannot_be_done_is_said_in_one_line(
    tmp_path: Path, args: tuple[str, ...], status: int, said: str
) -> None:
    done = run_cli("pins", args[0], "--config", str(config(tmp_path)), *args[1:])
    assert done.returncode == status, done.stderr
    assert said in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "pins.json").exists()


def test_a_config_without_pins_is_refused(tmp_path: Path) -> None:
    done = run_cli("pins", "record", "--config", str(config(tmp_path, pins=False)))
    assert done.returncode == 2
    assert "has no pins: section" in done.stderr and "Traceback" not in done.stderr


def test_a_pin_file_that_is_not_one_is_named(tmp_path: Path) -> None:
    path = config(tmp_path)
    (tmp_path / "pins.json").write_text("{")
    done = run_cli("pins", "diff", "--config", str(path))
    assert done.returncode == 2
    assert "pins.json: not JSON" in done.stderr and "Traceback" not in done.stderr
