"""A child process with asyncio streams on its stdin, stdout and stderr, on any event loop.

`asyncio.create_subprocess_exec` on uvloop leaves a second copy of each of the child's pipe ends
open in the child (uvloop does not implement `close_fds`): a child that closes its stdout then
never ends the gateway's read, since its copy keeps the pipe open. So the child is started by
`subprocess.Popen`, which closes every other descriptor in the child, and its pipes are handed
to the running loop; its exit is watched with a pidfd (Linux), else by a thread of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import IO


class Child:
    """What stdio.py uses of `asyncio.subprocess.Process`: pid, returncode, wait, the streams."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        stdin: asyncio.StreamWriter,
        stdout: asyncio.StreamReader,
        stderr: asyncio.StreamReader,
        transports: Sequence[asyncio.BaseTransport],
    ) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self._transports = transports
        loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = loop.create_future()
        self._watch(loop)

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def close(self) -> None:
        """Close the gateway's ends of the pipes (once the child has been reaped)."""
        for transport in self._transports:
            transport.close()

    def kill(self) -> None:
        """Stop it at once (with what it started), reap it and close the pipes."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self._reaped(self._popen.wait())  # (killed: a moment at most)
        self.close()

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # (not Linux, or a kernel before 5.3)
            threading.Thread(target=self._reap_in_thread, args=(loop,), daemon=True).start()
            return

        def exited() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            self._reaped(self._popen.wait())  # (it has exited: this does not block)

        loop.add_reader(pidfd, exited)

    def _reap_in_thread(self, loop: asyncio.AbstractEventLoop) -> None:
        code = self._popen.wait()
        with contextlib.suppress(RuntimeError):  # (the loop has closed meanwhile)
            loop.call_soon_threadsafe(self._reaped, code)

    def _reaped(self, code: int) -> None:
        if not self._exited.done():
            self._exited.set_result(code)


async def spawn(
    command: Sequence[str], *, env: Mapping[str, str], cwd: str | None, limit: int
) -> Child:
    """Start `command` in a session (and process group) of its own, with piped stdio; OSError
    when it cannot be started."""
    loop = asyncio.get_running_loop()
    # A synchronous fork and exec, as in asyncio's own subprocess support.
    popen = subprocess.Popen(  # noqa: ASYNC220
        list(command),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env),
        cwd=cwd,
        bufsize=0,
        start_new_session=True,
    )
    # The pipes are connected to the loop in a task of their own, never cut off midway: uvloop
    # gives a pipe's file object to its transport only once connected, so a cancellation there
    # would leave an open file object whose descriptor the transport has already closed (and
    # which, when collected, warns and closes that number again: by then maybe another file's).
    connecting = loop.create_task(_connect(popen, limit))
    try:
        return await asyncio.shield(connecting)
    except asyncio.CancelledError:
        # Cancelled meanwhile (the gateway stopping as a child starts): the child is stopped
        # and its pipes closed once connected.
        _abandoned.add(connecting)
        connecting.add_done_callback(_stop_abandoned)
        raise


# Children whose start was cancelled, until they are stopped (a task must be referenced).
_abandoned: set[asyncio.Task[Child]] = set()


def _stop_abandoned(connecting: asyncio.Task[Child]) -> None:
    _abandoned.discard(connecting)
    if connecting.cancelled() or connecting.exception() is not None:
        return  # (it stopped its child itself)
    connecting.result().kill()


async def _connect(popen: subprocess.Popen[bytes], limit: int) -> Child:
    loop = asyncio.get_running_loop()
    assert popen.stdin is not None and popen.stdout is not None and popen.stderr is not None
    pipes = (popen.stdout, popen.stderr, popen.stdin)  # (the order they are connected in)
    transports: list[asyncio.BaseTransport] = []
    try:
        readers = []
        for pipe in (popen.stdout, popen.stderr):
            reader = asyncio.StreamReader(limit=limit, loop=loop)
            reading, _ = await loop.connect_read_pipe(_reading(reader), pipe)
            transports.append(reading)
            readers.append(reader)
        # A StreamReaderProtocol is what gives a StreamWriter its flow control (drain).
        writing, protocol = await loop.connect_write_pipe(
            _reading(asyncio.StreamReader(loop=loop)), popen.stdin
        )
        transports.append(writing)
        stdin = asyncio.StreamWriter(writing, protocol, None, loop)
        return Child(popen, stdin, readers[0], readers[1], transports)
    except BaseException:
        # (Only when the loop itself is cancelling every task, as it closes.)
        for transport in transports:
            transport.close()
        for number, pipe in enumerate(pipes[len(transports) :]):
            # The first was being connected: its transport, closed, closes it (asyncio) or
            # has closed its descriptor only (uvloop: EBADF now, not a warning when collected).
            if number > 0 or _closed_beneath(pipe):
                with contextlib.suppress(OSError):
                    pipe.close()
        popen.kill()
        popen.wait()
        raise


def _closed_beneath(pipe: IO[bytes]) -> bool:
    """Whether the descriptor of a file object still open has been closed by another (an
    asyncio transport closes the file object itself, later)."""
    try:
        os.fstat(pipe.fileno())
    except ValueError:  # (the file object is closed)
        return False
    except OSError:
        return True
    return False


def _reading(reader: asyncio.StreamReader) -> Callable[[], asyncio.StreamReaderProtocol]:
    return lambda: asyncio.StreamReaderProtocol(reader)
