"""The request path's shortcuts in the telemetry (issue 34: fewer calls a request) give what the
general code gives: a reply's error type decided in place, and a duration recorded by the
recorder in place of `DurationHistogram.observe`."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.telemetry.api import error_type
from gateway.telemetry.otel import _error_type
from gateway.telemetry.recorder import DURATION_BUCKETS, DurationHistogram, Recorder

REPLIES: list[Any] = [
    None,
    {"jsonrpc": "2.0", "id": 1, "result": {}},
    {"jsonrpc": "2.0", "id": 1, "result": {"content": [], "isError": False}},
    {"jsonrpc": "2.0", "id": 1, "result": {"content": [], "isError": True}},
    {"jsonrpc": "2.0", "id": 1, "result": {"isError": "yes"}},
    {"jsonrpc": "2.0", "id": 1, "result": []},
    {"jsonrpc": "2.0", "id": 1, "result": None},
    {"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "bad"}},
    {"jsonrpc": "2.0", "id": 1, "error": {"message": "no code"}},
    {"jsonrpc": "2.0", "id": 1, "error": "not an object", "result": {}},
    {"jsonrpc": "2.0", "id": 1},
]


@pytest.mark.parametrize("reply", REPLIES)
def test_the_error_type_shortcut_agrees_with_error_type(reply: Any) -> None:
    assert _error_type(reply) == error_type(reply)


@pytest.mark.parametrize("seconds", [0.0, 0.0004, DURATION_BUCKETS[3], 0.7, 1e9])
@pytest.mark.parametrize("trace_id", ["", "0af7651916cd43dd8448eb211c80319c"])
def test_the_recorder_counts_as_observe_does(seconds: float, trace_id: str) -> None:
    recorder = Recorder()
    recorder.server("tools/call", "echo", "", seconds, trace_id)
    recorder.client("tools/call", "echo", "b", "", seconds, trace_id)
    for histogram, labels in (
        (recorder.server_duration, ("tools/call", "echo", "")),
        (recorder.client_duration, ("tools/call", "echo", "b", "")),
    ):
        expected = DurationHistogram("x", "x", histogram.labelnames, histogram.bounds)
        series = expected.series(labels)
        expected.observe(series, seconds, trace_id)
        got = histogram.by_labels[labels]
        assert got.counts == series.counts and got.sum == series.sum
        assert [e and e[:2] for e in got.exemplars] == [e and e[:2] for e in series.exemplars]
