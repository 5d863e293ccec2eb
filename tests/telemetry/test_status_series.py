"""The status page's series (telemetry/status.py), on an injected clock: request rates,
percentiles, the window and the ring rolling over, and the bounded recent errors."""

from __future__ import annotations

import pytest

from gateway.app import Gateway
from gateway.config import parse
from gateway.telemetry.status import (
    MESSAGE_CHARS,
    RECENT_ERRORS,
    SLOT_SECONDS,
    SLOTS,
    WINDOW_SLOTS,
    Series,
    StatusBoard,
)


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def ok(rid: int = 1) -> dict[str, object]:
    return {"jsonrpc": "2.0", "id": rid, "result": {}}


CALL = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "t", "arguments":
        {"secret": "hunter2"}}}  # fmt: skip


def test_rate_and_percentiles_over_the_window() -> None:
    clock = Clock()
    series = Series()
    for ms in range(1, 101):  # 1..100 ms, in one slot
        series.observe(clock(), ms / 1000, error=ms > 95)
    out = series.summary(clock(), covered=50.0)
    assert out["requests"] == 100
    assert out["errors"] == 5
    assert out["rate_per_second"] == 2.0  # 100 requests over the 50 s lived
    # Read from buckets a factor of 1.25 apart: within 12% of the true value.
    assert out["p50_ms"] == pytest.approx(50, rel=0.12)
    assert out["p99_ms"] == pytest.approx(99, rel=0.12)


def test_the_rate_is_over_the_window_once_the_gateway_is_older() -> None:
    clock = Clock()
    series = Series()
    for _ in range(600):
        series.observe(clock(), 0.001, error=False)
    assert series.summary(clock(), covered=10_000.0)["rate_per_second"] == 2.0  # 600 / 300 s


def test_slots_older_than_the_window_leave_the_numbers_but_stay_in_the_chart() -> None:
    clock = Clock(0.0)
    series = Series()
    series.observe(clock(), 0.5, error=True)
    clock.now += WINDOW_SLOTS * SLOT_SECONDS  # the first slot is now just outside the window
    series.observe(clock(), 0.002, error=False)
    out = series.summary(clock(), covered=clock.now)
    assert (out["requests"], out["errors"]) == (1, 0)
    assert out["p99_ms"] == pytest.approx(2, rel=0.12)
    points = series.points(clock(), wall=1_700_000_000.0)
    assert len(points) == SLOTS
    assert [p["requests"] for p in points if p["requests"]] == [1, 1]
    assert points[-1]["t"] == 1_700_000_000.0  # the current slot starts now (clock at a bound)
    assert points[-1]["t"] - points[-2]["t"] == SLOT_SECONDS


def test_the_ring_rolls_over_and_a_reused_slot_starts_from_zero() -> None:
    clock = Clock(0.0)
    series = Series()
    for _ in range(7):
        series.observe(clock(), 10.0, error=True)
    clock.now += SLOTS * SLOT_SECONDS  # the same slot of the ring, a full turn later
    assert series.summary(clock(), covered=clock.now)["requests"] == 0
    assert all(p["requests"] == 0 for p in series.points(clock(), wall=0.0))
    series.observe(clock(), 0.001, error=False)
    out = series.summary(clock(), covered=clock.now)
    assert (out["requests"], out["errors"]) == (1, 0)
    assert out["p99_ms"] == pytest.approx(1, rel=0.12)  # the 10 s samples are gone


def test_no_requests_no_percentiles() -> None:
    out = Series().summary(0.0, covered=0.0)
    assert (out["requests"], out["rate_per_second"], out["p50_ms"], out["p99_ms"]) == (
        0, 0.0, None, None,
    )  # fmt: skip


def test_latencies_past_the_last_bound_read_as_the_last_bound() -> None:
    series = Series()
    series.observe(0.0, 10_000.0, error=False)
    assert series.summary(0.0, covered=1.0)["p99_ms"] > 200_000


def test_errors_are_recorded_by_code_with_their_message_and_nothing_of_the_request() -> None:
    clock = Clock()
    board = StatusBoard(clock, wall=lambda: 1_700_000_000.0)
    board.client("a", CALL, ok(), 0.01)
    board.client("a", CALL, {"id": 1, "error": {"code": -32602, "message": "bad\n  args"}}, 0.01)
    board.client("b", CALL, {"id": 1, "result": {"isError": True, "content": [
        {"type": "text", "text": "secret output"}]}}, 0.01)  # fmt: skip
    board.client("b", CALL, None, 0.01)
    board.down("b", "exited with code 3")
    records = [e.json() for e in board.errors]
    assert [(r["backend"], r["method"], r["code"]) for r in records] == [
        ("a", "tools/call", "-32602"),
        ("b", "tools/call", "tool_error"),
        ("b", "tools/call", "no_reply"),
        ("b", "", "down"),
    ]
    assert records[0]["message"] == "bad args"  # one line
    assert records[0]["time"] == "2023-11-14T22:13:20Z"
    text = repr(records)
    assert "hunter2" not in text and "secret output" not in text
    assert board.last_error["b"].code == "down"
    summary = board.series("a").summary(clock(), covered=10.0)
    assert (summary["requests"], summary["errors"]) == (2, 1)


def test_recent_errors_and_their_messages_are_bounded() -> None:
    board = StatusBoard(Clock())
    for i in range(RECENT_ERRORS + 10):
        board.client("a", CALL, {"id": 1, "error": {"code": i, "message": "x" * 1000}}, 0.01)
    assert len(board.errors) == RECENT_ERRORS
    assert board.errors[0].code == "10"  # the oldest ones went first
    assert len(board.errors[-1].message) == MESSAGE_CHARS


def test_a_removed_backend_is_forgotten() -> None:
    board = StatusBoard(Clock())
    board.client("gone", CALL, {"id": 1, "error": {"code": 1, "message": "m"}}, 0.01)
    board.client("kept", CALL, ok(), 0.01)
    board.forget(["kept"])
    assert "gone" not in board.last_error
    assert board.series("gone").summary(0.0, covered=1.0)["requests"] == 0


@pytest.mark.anyio
async def test_only_a_gateway_with_a_status_page_feeds_its_series() -> None:
    """The series are read only by the admin listener's status page (a restart's to add): a
    gateway without one does not feed them on every request; one with one does."""
    base = "backends: {b: {stdio: {command: x}}}\nlisten: {http: {host: 127.0.0.1, port: 0}"
    plain = Gateway(parse(base + "}\n"))
    assert plain.telemetry.status is None
    with_page = Gateway(parse(base + ", admin: {host: 127.0.0.1, port: 0}}\n"))
    assert with_page.telemetry.status is with_page.status
