"""A real nginx (Debian's package, `make ci-deps`) on 127.0.0.1 in front of gateway replicas,
running the shipped deploy/nginx/mcp-gateway.conf with only its listen port rewritten and an
upstream file of the test's (in place of deploy/nginx/mcp-gateway-upstream.conf), inside a
minimal main config of the test's (paths in a temporary directory, no daemon, errors to
stderr)."""

from __future__ import annotations

import re
import shutil
import socket
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.support import ROOT, Proc, missing

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


def upstream_for(upstreams: Sequence[int]) -> str:
    """The shipped upstream file with the test's replicas."""
    text = UPSTREAM.read_text()
    servers = "".join(f"server 127.0.0.1:{p};\n" for p in upstreams)
    text, found = re.subn(r"(?:server 127\.0\.0\.1:\d+;\n)+", servers, text, count=1)
    assert found == 1, "the upstream's server lines moved"
    return text


@contextmanager
def nginx(directory: Path, upstreams: Sequence[int], port: int) -> Iterator[Proc]:
    if shutil.which(NGINX) is None and not Path(NGINX).exists():
        missing("nginx", "make ci-deps installs Debian's nginx")
    (directory / "site.conf").write_text(site_for(port))
    # Beside nginx.conf: nginx resolves a relative include against its config's directory.
    (directory / UPSTREAM_INCLUDE).write_text(upstream_for(upstreams))
    main = f"""
daemon off;
master_process off;
pid {directory}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
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
