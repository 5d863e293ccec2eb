"""Where and how the gateway's spans are sent (telemetry/otlp.py): the config's traces URL or
the standard OTEL_* variables. Apart from the exporter, which is an SDK span processor, so that
deciding whether there is tracing at all loads nothing of the SDK (app/observe.py)."""

from __future__ import annotations

import logging
import math
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from opentelemetry.util.re import parse_env_headers
from yarl import URL

from gateway.proxies import env_proxy

# The exporter's logger: what these settings warn of is the export's business.
log = logging.getLogger("gateway.telemetry.otlp")

TRACES_PATH = "/v1/traces"
# OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL values: the one the exporter speaks, and the others the
# OpenTelemetry spec names (an OTLP/gRPC exporter is future work, as an optional extra).
PROTOCOL = "http/protobuf"
OTHER_PROTOCOLS = ("grpc", "http/json")


class UnsupportedProtocol(ValueError):
    """OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL asks for what the exporter does not speak: spans
    sent anyway would go as HTTP to, most likely, a gRPC port. The message is one line."""


@dataclass(frozen=True)
class Settings:
    """Where and how spans are sent, and the batching (the SDK's defaults and variables)."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 10.0  # one POST, seconds
    compression: str = "none"  # none | gzip | deflate
    tls: ssl.SSLContext | None = field(default=None, compare=False)
    schedule_delay: float = 5.0  # seconds
    max_queue_size: int = 2048
    max_export_batch_size: int = 512
    export_timeout: float = 30.0  # one batch, its retries included; and the flush at shutdown
    proxy: str | None = None  # the process's HTTP(S)_PROXY for `url`, unless NO_PROXY exempts it

    @classmethod
    def from_env(cls, url: str | None, env: Mapping[str, str] | None = None) -> Settings | None:
        """From the standard OTEL_* variables; `url`, the config's traces URL, wins over them.
        None: no endpoint anywhere, so no tracing; `UnsupportedProtocol` for a protocol other
        than http/protobuf."""
        env = os.environ if env is None else env

        def pick(name: str) -> str:
            # The traces-only variable replaces the general one, as in the SDK's exporter.
            return (env.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}") or "").strip() or (
                env.get(f"OTEL_EXPORTER_OTLP_{name}") or ""
            ).strip()

        if url is None:
            url = (env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or "").strip() or None
        if url is None:
            base = (env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "").strip()
            if not base:
                return None
            url = base.rstrip("/") + TRACES_PATH
        _check_protocol(env)  # (only once there is tracing: without it nothing is sent)
        headers = {
            k.lower(): v for k, v in parse_env_headers(pick("HEADERS"), liberal=True).items()
        }
        compression = pick("COMPRESSION").lower() or "none"
        if compression not in ("none", "gzip", "deflate"):
            log.warning("OTLP compression %r is not supported; sending uncompressed", compression)
            compression = "none"
        queue = _number(env, "OTEL_BSP_MAX_QUEUE_SIZE", 2048)
        batch = _number(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)
        if batch > queue:
            log.warning(
                "OTEL_BSP_MAX_EXPORT_BATCH_SIZE %d is more than OTEL_BSP_MAX_QUEUE_SIZE %d; "
                "using %d",
                batch,
                queue,
                queue,
            )
            batch = queue
        return cls(
            url=url,
            headers=headers,
            timeout=_seconds(env, pick("TIMEOUT")),
            compression=compression,
            tls=_tls(url, pick("CERTIFICATE"), pick("CLIENT_CERTIFICATE"), pick("CLIENT_KEY")),
            schedule_delay=_number(env, "OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000,
            max_queue_size=queue,
            max_export_batch_size=batch,
            export_timeout=_number(env, "OTEL_BSP_EXPORT_TIMEOUT", 30000) / 1000,
            proxy=env_proxy(URL(url), "OTLP export"),
        )


def _check_protocol(env: Mapping[str, str]) -> None:
    """Refuse a protocol other than http/protobuf, naming the variable that asks for it."""
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        value = (env.get(name) or "").strip()
        if not value:
            continue
        if value.lower() == PROTOCOL:
            return
        raise UnsupportedProtocol(
            f"{name}={value} is not supported: the gateway exports spans as OTLP "
            f"{PROTOCOL} only; set {name}={PROTOCOL} (or unset it) and point the endpoint at "
            "the collector's OTLP/HTTP port (4318 by default, not gRPC's 4317)"
        )


def _number(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if value <= 0:
        log.warning("%s=%r is not a positive integer; using %d", name, raw, default)
        return default
    return value


def _seconds(env: Mapping[str, str], raw: str) -> float:
    # The SDK's exporter reads this variable as seconds (a float), not the spec's milliseconds:
    # the same value must mean the same here.
    if not raw:
        return 10.0
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value <= 0:
        log.warning("OTLP timeout %r is not a positive number of seconds; using 10", raw)
        return 10.0
    return value


def _tls(url: str, ca: str, cert: str, key: str) -> ssl.SSLContext | None:
    if urlsplit(url).scheme != "https" or not (ca or cert):
        return None  # aiohttp's default verification, or plain HTTP
    try:
        context = ssl.create_default_context(cafile=ca or None)
        if cert:
            context.load_cert_chain(cert, key or None)
    except (OSError, ssl.SSLError) as exc:
        # Exports will then fail (and say so per batch) rather than the gateway not starting:
        # tracing is not worth an outage.
        log.warning("OTLP TLS files cannot be used (%s); verifying with the system's CAs", exc)
        return None
    return context
