"""The config's frozen objects for tool-definition pinning (`pins:` and `backends.NAME.pins:`,
docs/trusting-tools/pinning.md): a leaf of the package, like model.py; pins_loader.py reads
them."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config.key import key

# What a definition that differs from its pin (or has none) gets: hidden until approved, served
# with one warning, served and counted.
PIN_MODES = ("block", "warn", "allow")
# `block` when `pins:` is given without `on_change`: an operator who pins definitions wants a
# changed one stopped, and a default that only warns would let the rug pull through.
DEFAULT_PIN_MODE = "block"
DEFAULT_PIN_FILE = "pins.json"
# One `stat` a second: an approval is in force within a second, at no measurable cost.
DEFAULT_PIN_POLL_INTERVAL = 1.0
# A judgement is one list call to the backend: five seconds covers a slow one, and a backend
# slower than that is not allowed to hold its clients' notifications back longer.
DEFAULT_PIN_NOTIFY_WAIT = 5.0


@dataclass(frozen=True)
class PinsConfig:
    file: str = key(
        "string",
        "The pin file (JSON, written by `pins record` and `pins approve`), relative to the "
        "config file.",
        DEFAULT_PIN_FILE,
    )
    on_change: str = key(
        "string",
        "What a tool, prompt or template whose definition differs from its pin (or has none) "
        "gets: block hides it until approved, warn serves it and logs the change once, allow "
        "serves it and counts the change.",
        DEFAULT_PIN_MODE,
        choices=PIN_MODES,
    )
    poll_interval: float = key(
        "number",
        "Seconds between looks at the pin file for a change (an approval by `pins approve`).",
        DEFAULT_PIN_POLL_INTERVAL,
    )
    notify_wait: float = key(
        "number",
        "Seconds a pinned backend's list-changed notification waits, at most, for its new "
        "definitions to be loaded and judged before it is relayed to clients.",
        DEFAULT_PIN_NOTIFY_WAIT,
    )


@dataclass(frozen=True)
class BackendPins:
    # None: the top-level pins.on_change.
    on_change: str | None = key(
        "string",
        "This backend's own on_change (default: the top-level pins.on_change).",
        None,
        choices=PIN_MODES,
    )
