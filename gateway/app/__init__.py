"""Composition root: builds backends, the dispatcher and the front ends from a config, owns the
root task group and shuts everything down in order. The only package that wires concrete parts.

gateway.py   the Gateway: its parts, start (listeners, backends, catalogs) and shutdown
wiring.py    each backend's transport and layers, the login desk, limiters, names, exposures
cluster.py   the replicas' shared state over Redis (buckets, bus, session records, logins)
observe.py   spans, tap, audit and access logs, opened from the config
reload.py    what a reload may change: its plan, report and the retiring of old backends
pins.py      `pins:`: the pin file read, watched and shared in a cluster (0066)
views.py     what it shows of itself: backend states, status facts, queues, readiness, metrics
inventory.py `check-config --catalogs`: per server, its backends' items and tokens
process.py   the process: signals, SIGHUP and `--watch` reloads, the pid file, gc settings
servers.py   virtual servers (`servers:`): a dispatcher each over the shared backends
errors.py    StartupError, Unreachable
reach.py     a start that needs its backends reached (connect, expose)
"""

from gateway.app.cluster import shared_logins
from gateway.app.errors import StartupError, Unreachable
from gateway.app.gateway import HTTP_SHUTDOWN_GRACE, Gateway
from gateway.app.inventory import describe_catalogs, inventory
from gateway.app.process import run
from gateway.app.reload import Reloaded
from gateway.app.wiring import INFO, check_hooks

__all__ = [
    "HTTP_SHUTDOWN_GRACE",
    "INFO",
    "Gateway",
    "Reloaded",
    "StartupError",
    "Unreachable",
    "check_hooks",
    "describe_catalogs",
    "inventory",
    "run",
    "shared_logins",
]
