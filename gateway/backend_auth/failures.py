"""The OAuth client's failure that reaches a request: no token could be had."""

from __future__ import annotations


class AuthFailed(Exception):
    """No token could be had: the message says why and what the operator can do (whoever
    reports it names the backend)."""
