"""The gateway's observation outputs, opened from the config: the span exporter (an SDK
tracer provider), the traffic tap, the audit log and the access log.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING

from gateway.app.errors import StartupError
from gateway.config import AuditConfig, Config, TapConfig
from gateway.telemetry.audit import AuditLog
from gateway.telemetry.otlp_settings import Settings, UnsupportedProtocol
from gateway.telemetry.records import FILE_MODE
from gateway.telemetry.tap import Tap

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from gateway.telemetry.otlp import OtlpSpanProcessor


def tracer_provider(config: Config) -> tuple[TracerProvider, OtlpSpanProcessor] | None:
    """An SDK tracer provider whose spans the gateway exports itself (OTLP over HTTP,
    telemetry/otlp.py), when an endpoint is configured (in the config or the standard
    OTEL_EXPORTER_OTLP_* variables) and OTEL_SDK_DISABLED is not set. A protocol it does not
    speak (OTEL_EXPORTER_OTLP_PROTOCOL=grpc) stops the start."""
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    endpoint = config.telemetry.otlp_endpoint
    traces_url = f"{endpoint.rstrip('/')}/v1/traces" if endpoint else None
    try:
        settings = Settings.from_env(traces_url)
    except UnsupportedProtocol as exc:
        raise StartupError(str(exc)) from None
    if settings is None:
        return None
    # The SDK and the exporter only now: a gateway without tracing never loads them (0063).
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    from gateway.telemetry.otlp import OtlpSpanProcessor

    service = os.environ.get("OTEL_SERVICE_NAME") or config.telemetry.service_name
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    processor = OtlpSpanProcessor(settings)
    provider.add_span_processor(processor)
    return provider, processor


def open_tap(config: TapConfig) -> Tap:
    try:
        return Tap(config)
    except OSError as exc:
        raise StartupError(f"tap: cannot open {config.path}: {exc.strerror}") from None


def open_audit(config: AuditConfig) -> AuditLog:
    try:
        return AuditLog(config)
    except OSError as exc:
        raise StartupError(f"audit: cannot open {config.path}: {exc.strerror}") from None


def access_logger(config: Config) -> logging.Logger | None:
    target = config.telemetry.access_log
    if target is None:
        return None
    logger = logging.getLogger("gateway.access")
    logger.propagate = False  # one JSON line per request, not wrapped by the text log format
    logger.setLevel(logging.INFO)
    try:
        if target != "stderr":
            # The access log names callers, peers and tools: only the gateway's user may read
            # it, as the tap and audit files (FileHandler would create it 0644 under the usual
            # umask). An existing file keeps its mode: the operator's choice (a log shipper's
            # group, say), as it is for the tap and the audit log.
            os.close(os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE))
        handler: logging.Handler = (
            logging.StreamHandler(sys.stderr) if target == "stderr" else logging.FileHandler(target)
        )
    except OSError as exc:
        raise StartupError(f"telemetry.access_log: cannot open {target}: {exc.strerror}") from None
    handler.setFormatter(logging.Formatter("%(message)s"))
    for old in logger.handlers:  # a gateway made before in this process (tests, the CLI's checks)
        old.close()
    logger.handlers = [handler]
    return logger
