"""`make test-fast` selects by reading code (tests/fast.py): a function naming a starter of
processes or servers, itself or through `tests/` code it names, is slow; names in annotations
and a config's `.listen` are not starters. A test selected fast that starts something the
reading missed fails."""

from __future__ import annotations

import importlib
import importlib.util
import socket
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests import conftest, fast, support

SAMPLE = """
import subprocess

from tests.support import Proc


def spawns():
    subprocess.run(["true"])


def through_a_helper():
    return spawns()


def starts_a_proc():
    return Proc(["true"])


def reads_config(config):
    return config.listen.stdio


def listens(sock):
    sock.listen(0)


def annotated(p: subprocess.Popen[str]) -> subprocess.Popen[str]:
    return p


def pure():
    return 1 + 1


def calls_itself(n):
    return calls_itself(n - 1) if n else pure()
"""


@pytest.fixture
def sample(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """SAMPLE as a module of the test suite (tests/fast.py follows only `tests.*` code)."""
    path = tmp_path / "fast_sample.py"
    path.write_text(SAMPLE)
    spec = importlib.util.spec_from_file_location("tests.fast_sample", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "tests.fast_sample", module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("name", "starts"),
    [
        ("spawns", True),
        ("through_a_helper", True),
        ("starts_a_proc", True),
        ("listens", True),
        ("reads_config", False),
        ("annotated", False),
        ("pure", False),
        ("calls_itself", False),
    ],
)
def test_a_function_is_slow_when_it_names_a_starter(
    sample: ModuleType, name: str, starts: bool
) -> None:
    assert fast._starts(getattr(sample, name)) is starts


def test_this_test_is_fast_and_the_suites_starters_are_not(
    request: pytest.FixtureRequest,
) -> None:
    """The selection as pytest made it: this test is fast (it looks the helpers up by their
    names as strings, which the reading does not follow); the helpers that start the SDK
    server and a gateway, and the session fixture built on the first, read as starting."""
    assert request.node.get_closest_marker("fast") is not None
    helpers = vars(support)
    assert fast._starts(helpers["start_sdk_http"]) and fast._starts(helpers["start_gateway_http"])
    fixture = vars(conftest)["sdk_http"]
    assert fast._starts(getattr(fixture, "__wrapped__", fixture))


def test_a_fast_test_that_starts_something_anyway_fails() -> None:
    """The guard: what the reading missed (here hidden behind getattr, hence the noqa) fails
    the test."""
    popen = getattr(importlib.import_module("subprocess"), "Popen")  # noqa: B009
    with pytest.raises(AssertionError, match="STARTERS"):
        popen(["true"])
    with socket.socket() as sock:
        with pytest.raises(AssertionError, match="STARTERS"):
            getattr(sock, "listen")(0)  # noqa: B009
        with pytest.raises(AssertionError, match="STARTERS"):
            getattr(sock, "connect")(("192.0.2.1", 9))  # noqa: B009
