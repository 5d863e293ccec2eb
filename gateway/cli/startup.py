"""What `run`, `connect` and `expose` say when they cannot start: one line each, the true reason
and what to do, in the flags the user typed (`--port`, not `listen.http`), exit status 2.

`connect` asks its URL once before it starts (backends/fallback.py `examine`): a definite answer
(connection refused, an unknown host, a TLS failure, 404, a 401 it cannot log in past) ends it at
once; a URL that does not answer ends it after the connect timeout. `expose` learns what became
of its child from the gateway's own start (app/reach.py). `--wait` keeps today's way instead:
start anyway and retry in the background. The log lines of a start that fails are dropped
(`HeldLogs`): the one line says it all; a start that succeeds writes them as they came.
"""

from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from gateway import __version__
from gateway.app import StartupError, Unreachable
from gateway.backend_auth.wire import parse_challenge
from gateway.backends import fallback
from gateway.backends.fallback import Answer
from gateway.config import BackendConfig, HttpTarget, SseTarget

WAIT = "--wait keeps retrying instead"
# A command line as shown in a message: its start, enough to recognise it.
MAX_COMMAND = 80
# Records held while a start is decided (a child's chatter included); past it, the oldest go.
MAX_HELD = 1000
_SPACES = re.compile(r"\s+")
# The discovery asked after a 401: as the login's own (backend_auth/setup.py).
LOGIN_FETCH_TIMEOUT = 10.0
LOGIN_MAX_BYTES = 256 * 1024


def one_line(text: str) -> str:
    """Whatever a server put in a reason (its stderr, say), one line."""
    return _SPACES.sub(" ", text).strip()


@dataclass(frozen=True)
class Wording:
    """How a command names what the config would call a key: `port`, the `--port` flag as
    typed (None: `run` without it, whose address is its config's)."""

    port: str | None = None
    command: Sequence[str] = ()  # expose: the server's command line
    url: str | None = None  # connect: the server's URL


# What the OAuth client's messages call a config key, as `connect` spells it (its flags).
CONNECT_FLAGS = {
    "auth.authorization_server (connect: --authorization-server)": "--authorization-server",
    "auth.authorization_server": "--authorization-server",
    "auth.client_id": "--client-id",
    "auth.client_secret": "--client-secret",
    "auth.scopes": "--scope",
    "(or client_metadata_url)": "(or --client-metadata-url)",
}


# A config's own wording (`run` without --port).
PLAIN = Wording()


def explain(exc: StartupError, wording: Wording) -> str:
    """The one line for a start that failed."""
    if exc.in_use is not None:
        where = wording.port or "listen.http"
        return (
            f"{where}: {exc.in_use} is already in use: stop what listens there (another "
            "gateway?) or choose another port with --port (0 picks a free one)"
        )
    if isinstance(exc, Unreachable):
        reason = one_line(exc.reason)
        if wording.url is not None:
            for key, flag in CONNECT_FLAGS.items():
                reason = reason.replace(key, flag)
            if exc.answered:
                return f"{wording.url} refused the first requests: {reason}"
            return f"{wording.url} cannot be reached: {reason}; {WAIT}"
        if wording.command:
            shown = _shown(wording.command)
            if exc.answered:
                return f"the server `{shown}` started, but its first answers failed: {reason}"
            return (
                f"the server `{shown}` did not start: {reason}; check the command after -- "
                f"(and --env, --cwd); {WAIT}"
            )
    return one_line(str(exc))


def _shown(command: Sequence[str]) -> str:
    text = shlex.join(command)
    return text if len(text) <= MAX_COMMAND else text[: MAX_COMMAND - 1] + "…"


def unreached(url: str, answer: Answer, within: float) -> str:
    """The line for a URL that gave no answer at all."""
    kind, reason = answer.unreached, one_line(answer.reason)
    if kind == "refused":
        return (
            f"nothing listens at {url} (connection refused): is the server running, on that "
            f"port? {WAIT}"
        )
    if kind == "dns":
        host = urlsplit(url).hostname
        return f"cannot resolve the host {host!r} of {url} ({reason}): check the URL"
    if kind == "tls":
        return (
            f"TLS with {url} failed ({reason}): check the URL (https to a plain HTTP port?) or "
            "trust the server's CA (SSL_CERT_FILE)"
        )
    if kind == "timeout":
        return f"no answer from {url} within {within:g}s: is the server up, at that address? {WAIT}"
    return f"cannot reach {url} ({reason}): check the URL; {WAIT}"


def refused(
    url: str, answer: Answer, *, token: bool, auth: str, transport: str = "auto"
) -> str | None:
    """The line for an answer that is a definite no, or None (a 401 `connect` may log in past
    is for `login_impossible` to judge)."""
    status = answer.status
    if status in (404, 410) or (status == 405 and not answer.jsonrpc_error):
        other = ""
        if transport != "auto":  # (the other transport's URL, perhaps)
            other = " (or --transport auto, which tries both transports)"
        return f"got HTTP {status} from {url}: is the path right?{other}"
    if status != 401:
        return None
    if token:
        return (
            f"the server refused the token given with -H (HTTP 401 from {url}): pass a valid "
            "one, or leave out -H 'Authorization: …' and let connect log in"
        )
    if auth == "none":
        return (
            f"the server wants a token (HTTP 401 from {url}): pass -H 'Authorization: Bearer "
            "…' or let connect log in (leave out --auth none)"
        )
    return None


def login_impossible(url: str, why: str, *, no_issuer: bool) -> str:
    """The line for a 401 whose login cannot even begin (no authorization server to find)."""
    pin = " or name the issuer with --authorization-server URL" if no_issuer else ""
    return (
        f"the server wants a token (HTTP 401 from {url}) and connect cannot log in: "
        f"{one_line(why)}: pass -H 'Authorization: Bearer …'{pin}"
    )


class HeldLogs(logging.Handler):
    """The root logger's records, held while a start is decided, instead of its handlers:
    `pass_on` writes them (the start succeeded), `discard` drops them (it failed, and one line
    says why); either way the handlers are back."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self._root = logging.getLogger()
        self._handlers = list(self._root.handlers)
        self._records: list[logging.LogRecord] = []
        self._root.handlers = [self]

    def emit(self, record: logging.LogRecord) -> None:
        if len(self._records) >= MAX_HELD:
            del self._records[0]
        self._records.append(record)

    def _restore(self) -> list[logging.LogRecord]:
        if self._root.handlers == [self]:
            self._root.handlers = self._handlers
        records, self._records = self._records, []
        return records

    def pass_on(self) -> None:  # (not `release`: a Handler's lock has that name)
        for record in self._restore():
            for handler in self._handlers:
                if record.levelno >= handler.level:
                    handler.handle(record)

    def discard(self) -> None:
        self._restore()


async def first_answer(
    backend: BackendConfig, transport: str, *, token: bool
) -> tuple[BackendConfig, str | None]:
    """`connect`'s question before it starts: its backend on the transport the URL speaks, and
    the line that ends the start (None: start)."""
    settled, answer = await fallback.examine(backend, transport)
    url = backend_url(backend)
    if answer.unreached is not None:
        return settled, unreached(url, answer, backend.connect_timeout)
    auth = backend.auth
    kind = auth.type if auth is not None else "none"
    line = refused(url, answer, token=token, auth=kind, transport=transport)
    if line is None and answer.status == 401 and auth is not None:
        found = await login_problem(url, answer.challenges, auth.authorization_server)
        if found is not None:
            line = login_impossible(url, found[0], no_issuer=found[1])
    return settled, line


def backend_url(backend: BackendConfig) -> str:
    target = backend.target
    assert isinstance(target, HttpTarget | SseTarget)
    return target.url


async def login_problem(
    url: str, challenges: Sequence[str], issuer: str | None
) -> tuple[str, bool] | None:
    """Why a login at the server's authorization server cannot begin (and whether naming an
    issuer would do), or None: its discovery, as the login would do it. (The OAuth client is
    loaded only here, for a 401: 0064.)"""
    from gateway.backend_auth.discovery import DiscoveryFailed, discover
    from gateway.backend_auth.fetch import OAuthHttp

    http = OAuthHttp(LOGIN_FETCH_TIMEOUT, LOGIN_MAX_BYTES, f"mcp-gateway/{__version__}")
    try:
        await discover(http, url, parse_challenge(list(challenges)), issuer)
    except DiscoveryFailed as exc:
        return exc.detail, exc.no_issuer
    finally:
        await http.close()
    return None
