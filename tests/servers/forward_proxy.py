"""A small forward HTTP proxy for tests, on 127.0.0.1: absolute-form requests (plain HTTP
through the proxy) and CONNECT tunnels (HTTPS through the proxy), to 127.0.0.1 only.

Every request head it receives from a client is recorded (`seen`: request line and headers),
so a test can tell what went through it. A plain request's head is passed on in origin form
without the Proxy-* headers, and from then on the two connections are joined byte for byte
(one upstream connection per client connection; later requests on it pass unrecorded). Usable
in-process (`async with ForwardProxy() as proxy`) or as a script:

    python tests/servers/forward_proxy.py   # prints `READY <port>`
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

# A request head larger than this is refused (431).
MAX_HEAD = 64 * 1024
ALLOWED_HOSTS = ("127.0.0.1", "localhost")


@dataclass
class Seen:
    request_line: str
    headers: dict[str, str] = field(default_factory=dict)


class ForwardProxy:
    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self.port = 0
        self._tasks: set[asyncio.Task[Any]] = set()

    async def __aenter__(self) -> ForwardProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, limit=MAX_HEAD)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        upstream: asyncio.StreamWriter | None = None
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            line, *lines = head.decode("latin-1").split("\r\n")
            headers = {}
            for item in lines:
                if item:
                    name, _, value = item.partition(":")
                    headers[name.strip().lower()] = value.strip()
            self.seen.append(Seen(line, headers))
            method, target, version = line.split(" ")
            if method == "CONNECT":
                host, _, port = target.rpartition(":")
                if host not in ALLOWED_HOSTS:
                    writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                    return
                up_reader, upstream = await asyncio.open_connection(host, int(port))
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                parts = urlsplit(target)
                if parts.scheme != "http" or parts.hostname not in ALLOWED_HOSTS:
                    writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                    return
                up_reader, upstream = await asyncio.open_connection(
                    parts.hostname, parts.port or 80
                )
                path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
                kept = "".join(f"{x}\r\n" for x in lines if x and not _hop_by_hop(x))
                upstream.write(f"{method} {path} {version}\r\n{kept}\r\n".encode("latin-1"))
            await writer.drain()
            await asyncio.gather(_pipe(reader, upstream), _pipe(up_reader, writer))
        except (
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ConnectionError,
            ValueError,
        ):
            pass
        except asyncio.CancelledError:
            # Only __aexit__ cancels: asyncio's stream server would report a handler that ends
            # cancelled as an error.
            pass
        finally:
            for end in (writer, upstream):
                if end is not None:
                    end.close()
            self._tasks.discard(task)


def _hop_by_hop(header_line: str) -> bool:
    """Headers meant for the proxy itself, which it does not pass on."""
    return header_line.lower().startswith("proxy-")


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(ConnectionError, OSError):
        if writer.can_write_eof():
            writer.write_eof()


async def _main() -> None:
    async with ForwardProxy() as proxy:
        print(f"READY {proxy.port}", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main())
    sys.exit(0)
