"""The lines `run`, `connect` and `expose` end a failed start with (gateway/cli/startup.py),
made from what the start found: each is one line, names what to do, and speaks the command's
flags, never the config keys it did not type. The processes that meet them are in
test_first_hour.py; here every branch, quickly."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.app import StartupError, Unreachable
from gateway.backends.fallback import Answer
from gateway.cli import startup
from gateway.cli.serving import _listening, _loader
from gateway.cli.startup import (
    MAX_HELD,
    PLAIN,
    HeldLogs,
    Wording,
    explain,
    login_impossible,
    refused,
    unreached,
)
from gateway.config import Config, HttpListen, Listen

URL = "http://127.0.0.1:9/mcp"
JSONRPC_404 = b'{"jsonrpc":"2.0","id":"x","error":{"code":-32601,"message":"no"}}'


def single(line: str) -> str:
    assert "\n" not in line and line == line.strip()
    return line


def test_a_port_in_use_names_the_flag_typed_or_the_flag_to_use() -> None:
    taken = StartupError("listen.http: ...", in_use="127.0.0.1:8080")
    typed = single(explain(taken, Wording(port="--port 8080")))
    assert typed.startswith("--port 8080: 127.0.0.1:8080 is already in use")
    assert "choose another port with --port" in typed and "listen.http" not in typed
    configured = single(explain(taken, PLAIN))
    assert configured.startswith("listen.http: 127.0.0.1:8080 ") and "--port" in configured


def test_an_admin_port_in_use_keeps_the_configs_wording() -> None:
    taken = StartupError("listen.admin: 127.0.0.1:9464 is in use")
    assert explain(taken, Wording(port="--port 1")) == "listen.admin: 127.0.0.1:9464 is in use"


def test_a_child_that_did_not_start_is_named_with_its_stderr_on_one_line() -> None:
    down = Unreachable("srv", "child exited with code 3; stderr: boom\nsecond line")
    line = single(explain(down, Wording(command=["node", "srv.js"])))
    assert line.startswith("the server `node srv.js` did not start: child exited with code 3")
    assert "boom second line" in line and "--wait" in line and "--env" in line


def test_a_long_command_is_cut_in_the_line() -> None:
    down = Unreachable("srv", "child exited with code 1")
    line = explain(down, Wording(command=["python", "-c", "x" * 500]))
    assert len(line) < 300 and "…" in line


def test_a_refusal_after_the_start_says_the_server_started() -> None:
    refusal = Unreachable("srv", "tools/list: -32603 internal error", answered=True)
    line = single(explain(refusal, Wording(command=["srv"])))
    assert "started, but its first answers failed" in line and "did not start" not in line


def test_connects_refusals_speak_its_flags() -> None:
    refusal = Unreachable(
        "remote",
        "offers no registration; configure auth.client_id (or client_metadata_url)",
        answered=True,
    )
    line = single(explain(refusal, Wording(url=URL)))
    assert "--client-id (or --client-metadata-url)" in line and "auth." not in line
    pinned = Unreachable(
        "remote",
        "x names no authorization server (y); pin one with auth.authorization_server "
        "(connect: --authorization-server)",
        answered=True,
    )
    assert "pin one with --authorization-server" in explain(pinned, Wording(url=URL))
    down = single(explain(Unreachable("remote", "cannot connect: refused"), Wording(url=URL)))
    assert down.startswith(f"{URL} cannot be reached: cannot connect") and "--wait" in down


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("refused", "nothing listens at"),
        ("dns", "cannot resolve the host '127.0.0.1'"),
        ("tls", "TLS with"),
        ("timeout", "no answer from http://127.0.0.1:9/mcp within 10s"),
        ("other", "cannot reach"),
    ],
)
def test_each_way_of_not_being_reached_has_its_line(kind: str, expected: str) -> None:
    line = single(unreached(URL, Answer(unreached=kind, reason="why\nnot"), 10.0))
    assert expected in line
    assert any(hint in line for hint in ("--wait", "check the URL", "is the server"))


@pytest.mark.parametrize(
    ("status", "body", "path"),
    [(404, b"Not Found", True), (410, b"", True), (405, b"", True), (405, JSONRPC_404, False)],
)
def test_a_missing_endpoint_asks_for_the_path(status: int, body: bytes, path: bool) -> None:
    line = refused(URL, Answer(status=status, body=body), token=False, auth="oauth")
    assert (line == f"got HTTP {status} from {URL}: is the path right?") is path


def test_a_wrong_path_with_a_transport_chosen_mentions_auto() -> None:
    line = refused(URL, Answer(status=404), token=False, auth="oauth", transport="http")
    assert line is not None and "--transport auto" in single(line)


@pytest.mark.parametrize("status", [200, 400, 403, 500, 503])
def test_other_answers_are_the_gateways_to_handle(status: int) -> None:
    assert refused(URL, Answer(status=status), token=False, auth="none") is None


def test_a_401_says_whose_the_token_is() -> None:
    given = refused(URL, Answer(status=401), token=True, auth="oauth")
    assert given is not None and "refused the token given with -H" in single(given)
    wanted = refused(URL, Answer(status=401), token=False, auth="none")
    assert wanted is not None and "pass -H 'Authorization: Bearer …'" in single(wanted)
    assert "let connect log in" in wanted
    assert refused(URL, Answer(status=401), token=False, auth="oauth") is None  # (it logs in)


def test_a_login_that_cannot_begin_names_the_flags() -> None:
    pinned = single(login_impossible(URL, "names no authorization server", no_issuer=True))
    assert "-H 'Authorization: Bearer …'" in pinned and "--authorization-server" in pinned
    other = login_impossible(URL, "metadata names another issuer", no_issuer=False)
    assert "--authorization-server" not in other


@pytest.fixture
def root_handler() -> Iterator[logging.Handler]:
    """The root logger with one handler of the test's own, as `logs.setup` leaves it."""
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    seen = CollectingHandler()
    root.handlers, root.level = [seen], logging.INFO
    try:
        yield seen
    finally:
        root.handlers, root.level = before, level


class CollectingHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_held_logs_are_written_once_the_start_is_decided(root_handler: CollectingHandler) -> None:
    held = HeldLogs()
    logging.getLogger("gateway.test").info("one")
    logging.getLogger("gateway.test").debug("below the handler's level")
    assert root_handler.messages == []
    held.pass_on()
    assert root_handler.messages == ["one"]
    logging.getLogger("gateway.test").info("two")  # (the handlers are back)
    assert root_handler.messages == ["one", "two"]


def test_held_logs_of_a_failed_start_are_dropped(root_handler: CollectingHandler) -> None:
    held = HeldLogs()
    logging.getLogger("gateway.test").warning("backend x: down; retrying in the background")
    held.discard()
    held.pass_on()  # (a second end changes nothing)
    assert root_handler.messages == []
    logging.getLogger("gateway.test").error("the one line")
    assert root_handler.messages == ["the one line"]


def test_held_logs_keep_the_latest_past_their_bound(root_handler: CollectingHandler) -> None:
    held = HeldLogs()
    for i in range(MAX_HELD + 5):
        logging.getLogger("gateway.test").info("%d", i)
    held.pass_on()
    assert len(root_handler.messages) == MAX_HELD and root_handler.messages[-1] == str(MAX_HELD + 4)


def config(http: HttpListen | None) -> Config:
    return Config(listen=Listen(http=http, stdio=http is None), backends=(), source="test")


def test_host_and_port_replace_the_configs_address_only() -> None:
    base = config(HttpListen(host="127.0.0.1", port=8080, path="/x"))
    moved = _listening(base, "0.0.0.0", 9000)
    assert moved.listen.http == HttpListen(host="0.0.0.0", port=9000, path="/x")
    assert _listening(base, None, 0).listen.http == HttpListen(port=0, path="/x")
    assert _listening(base, None, None) is base
    stdio = config(None)
    assert _listening(stdio, None, 1) is stdio


def test_a_reload_keeps_the_port_given(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(
        "listen:\n  http: {port: 8080}\nbackends:\n  a: {http: {url: 'http://127.0.0.1:1/mcp'}}\n"
    )
    again = _loader(path, None, None, 9001)()
    assert again.listen.http is not None and again.listen.http.port == 9001


def test_one_line_makes_any_reason_one_line() -> None:
    assert startup.one_line(" a\n\tb\r\n c ") == "a b c"
