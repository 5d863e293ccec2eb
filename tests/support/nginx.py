"""A real nginx (Debian's package, `make ci-deps`) on 127.0.0.1 in front of gateway replicas,
running the shipped deploy/nginx/mcp-gateway.conf with only its listen port rewritten and an
upstream file of the test's (in place of deploy/nginx/mcp-gateway-upstream.conf), inside a
minimal main config of the test's (paths in a temporary directory, no daemon, errors to
stderr, and optionally an access log naming the replica each request went to); and the
replicas themselves: gateway processes with one config each, on ports chosen before they
start, so one can be started again where it was."""

from __future__ import annotations

import re
import shutil
import signal
import socket
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.support import BOUND, ROOT, Proc, gateway_command, missing
from tests.support.oidc import free_ports

SITE = ROOT / "deploy" / "nginx" / "mcp-gateway.conf"
UPSTREAM = ROOT / "deploy" / "nginx" / "mcp-gateway-upstream.conf"
# What the site's upstream block includes, relative to nginx's config directory.
UPSTREAM_INCLUDE = "mcp-gateway-upstream.conf"
NGINX = "/usr/sbin/nginx"


def site_for(port: int) -> str:
    """The shipped site with the test's port (its upstream file is `upstream_for`'s)."""
    text = SITE.read_text()
    assert f"include {UPSTREAM_INCLUDE};" in text, "the upstream's include moved"
    text, found = re.subn(r"listen \d+;", f"listen 127.0.0.1:{port};", text, count=1)
    assert found == 1, "the listen line moved"
    return text


# The access log's line when a test asks for one: the replica (`$upstream_addr`: more than one,
# comma-separated, when nginx had to try another), then what the request was.
UPSTREAM_LOG = (
    "'$upstream_addr $status $request_method $request_uri $http_mcp_method $http_mcp_name'"
)


def upstream_for(upstreams: Sequence[int]) -> str:
    """The shipped upstream file with the test's replicas."""
    text = UPSTREAM.read_text()
    servers = "".join(f"server 127.0.0.1:{p};\n" for p in upstreams)
    text, found = re.subn(r"(?:server 127\.0\.0\.1:\d+;\n)+", servers, text, count=1)
    assert found == 1, "the upstream's server lines moved"
    return text


@contextmanager
def nginx(
    directory: Path, upstreams: Sequence[int], port: int, access_log: Path | None = None
) -> Iterator[Proc]:
    """nginx on 127.0.0.1:`port` in front of `upstreams`; with `access_log`, each request is a
    line there (`UPSTREAM_LOG`, read by `upstreams_logged`)."""
    if shutil.which(NGINX) is None and not Path(NGINX).exists():
        missing("nginx", "make ci-deps installs Debian's nginx")
    (directory / "site.conf").write_text(site_for(port))
    # Beside nginx.conf: nginx resolves a relative include against its config's directory.
    (directory / UPSTREAM_INCLUDE).write_text(upstream_for(upstreams))
    log = "access_log off;"
    if access_log is not None:
        log = f"log_format upstreams {UPSTREAM_LOG};\n    access_log {access_log} upstreams;"
    main = f"""
daemon off;
master_process off;
pid {directory}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 256; }}
http {{
    {log}
    client_body_temp_path {directory}/body;
    proxy_temp_path {directory}/proxy;
    fastcgi_temp_path {directory}/fastcgi;
    uwsgi_temp_path {directory}/uwsgi;
    scgi_temp_path {directory}/scgi;
    include {directory}/site.conf;
}}
"""
    (directory / "nginx.conf").write_text(main)
    proc = Proc([NGINX, "-p", str(directory), "-c", str(directory / "nginx.conf")])
    try:
        yield proc
    finally:
        proc.stop()


def wait_accepting(port: int, bound: float) -> None:
    """Until something accepts connections on 127.0.0.1:`port` (nginx says nothing when it
    is ready), within `bound` seconds."""
    deadline = time.monotonic() + bound
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=bound):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)  # (a port opening is not an event this process can wait on)


def upstreams_logged(access_log: Path, since: int = 0) -> list[list[str]]:
    """The access log's lines from line `since` on, each split into its fields (the replica's
    address first)."""
    lines = access_log.read_text().splitlines() if access_log.exists() else []
    return [line.split(" ") for line in lines[since:]]


@dataclass
class Replica:
    """One gateway process on a port of its own, its config in `config` (rewritten, then
    signalled, by reload tests)."""

    config: Path
    port: int
    proc: Proc | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    @property
    def address(self) -> str:
        """As nginx's `$upstream_addr` names it."""
        return f"127.0.0.1:{self.port}"

    def write(self, settings: dict[str, Any]) -> None:
        """The config: `settings` (backends, cluster, ...) with this replica's HTTP listener."""
        listen = {"http": {"host": "127.0.0.1", "port": self.port, "path": "/mcp"}}
        self.config.write_text(yaml.safe_dump({**settings, "listen": listen}))

    def start(self) -> None:
        """The process, once it listens (info level: a replica under load logs little)."""
        self.proc = Proc(gateway_command(self.config, "--log-level", "info"))
        try:
            self.proc.wait_for(r"listening on http://")
        except BaseException:
            self.stop()
            raise

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None:
            self.proc.stop(sig)

    @property
    def running(self) -> Proc:
        assert self.proc is not None, "not started"
        return self.proc


@contextmanager
def replicas(directory: Path, settings: dict[str, Any], count: int = 3) -> Iterator[list[Replica]]:
    """`count` gateways with one config (`settings`), started in turn, all stopped at the end."""
    with ExitStack() as stack:
        started: list[Replica] = []
        for i, port in enumerate(free_ports(count)):
            replica = Replica(directory / f"replica-{i}.yaml", port)
            replica.write(settings)
            stack.callback(replica.stop)
            replica.start()
            started.append(replica)
        yield started


@contextmanager
def behind_nginx(
    directory: Path, gateways: Sequence[Replica], access_log: Path | None = None
) -> Iterator[str]:
    """nginx with the shipped site in front of `gateways` (round robin in this order); its MCP
    URL once it accepts connections."""
    (port,) = free_ports(1)
    with nginx(directory, [g.port for g in gateways], port, access_log):
        wait_accepting(port, BOUND)
        yield f"http://127.0.0.1:{port}/mcp"
