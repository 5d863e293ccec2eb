"""`shutdown.pre_stop_delay`: on SIGTERM the gateway turns unready (/readyz 503) at once, keeps
serving for the delay (the time a load balancer takes to stop sending to it), then shuts down
as before. SIGINT, and a second signal, do not wait. Real gateway processes."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import ConfigInvalid, Shutdown, parse
from tests.support import BOUND, DEMO_BACKEND, call, stdio_backend
from tests.support.probe import Started, post, start, status

# Long enough for the checks made within it on a loaded machine; short for the suite.
DELAY = 3.0


def _config(tmp_path: Path, delay: float) -> Path:
    path = tmp_path / "gateway.yaml"
    doc = {
        "listen": {
            "http": {"host": "127.0.0.1", "port": 0, "path": "/mcp"},
            "admin": {"host": "127.0.0.1", "port": 0},
        },
        "backends": {"demo": DEMO_BACKEND},
        "shutdown": {"pre_stop_delay": delay},
    }
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def _doc(shutdown: Any) -> str:
    backends = {"b": stdio_backend(["x"])}
    return yaml.safe_dump({"listen": {"stdio": True}, "backends": backends, "shutdown": shutdown})


def test_the_delay_is_0_unless_set() -> None:
    assert parse(_doc(None)).shutdown == Shutdown(pre_stop_delay=0.0)
    assert parse(_doc({"pre_stop_delay": 0})).shutdown.pre_stop_delay == 0.0
    assert parse(_doc({"pre_stop_delay": 7.5})).shutdown.pre_stop_delay == 7.5


@pytest.mark.parametrize("bad", [-1, "soon", True, [5]])
def test_a_bad_delay_is_refused_naming_its_key(bad: Any) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        parse(_doc({"pre_stop_delay": bad}))
    assert any("shutdown.pre_stop_delay" in p for p in caught.value.problems)


def _serves(gateway: Started, text: str) -> None:
    code, reply = post(gateway.mcp, call(1, "echo", text=text))
    assert code == 200 and reply["result"]["content"][0]["text"] == text, reply


@pytest.mark.slow
def test_after_sigterm_unready_at_once_still_serving_for_the_delay_then_gone(
    tmp_path: Path,
) -> None:
    gateway = start(_config(tmp_path, DELAY))
    proc = gateway.proc
    try:
        assert status(gateway.admin + "/readyz") == 200
        sent = time.monotonic()
        proc.popen.send_signal(signal.SIGTERM)
        proc.wait_for(r"received SIGTERM: unready, serving 3 s more")
        # Unready on both listeners, and yet a request is served as before.
        assert status(gateway.admin + "/readyz") == 503
        assert status(gateway.mcp.removesuffix("/mcp") + "/readyz") == 503
        assert status(gateway.admin + "/healthz") == 200  # alive: no restart for it
        _serves(gateway, "still here")
        assert proc.popen.poll() is None
        proc.wait_for(r"received SIGTERM, shutting down", timeout=DELAY + BOUND)
        assert time.monotonic() - sent >= DELAY
        assert proc.popen.wait(BOUND) == 0
    finally:
        proc.stop()


@pytest.mark.slow
def test_a_second_signal_ends_the_wait(tmp_path: Path) -> None:
    gateway = start(_config(tmp_path, 60))
    proc = gateway.proc
    try:
        proc.popen.send_signal(signal.SIGTERM)
        proc.wait_for(r"received SIGTERM: unready")
        proc.popen.send_signal(signal.SIGTERM)
        proc.wait_for(r"received SIGTERM, shutting down", timeout=BOUND)
        assert proc.popen.wait(BOUND) == 0
    finally:
        proc.stop()


@pytest.mark.slow
def test_sigint_does_not_wait(tmp_path: Path) -> None:
    """Someone at a terminal pressed Ctrl-C: the delay is for an orchestrator's SIGTERM."""
    gateway = start(_config(tmp_path, 60))
    proc = gateway.proc
    try:
        proc.popen.send_signal(signal.SIGINT)
        proc.wait_for(r"received SIGINT, shutting down", timeout=BOUND)
        assert proc.popen.wait(BOUND) == 0
        assert not any("unready" in line for line in proc.lines["stderr"])
    finally:
        proc.stop()
