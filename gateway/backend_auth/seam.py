"""The OAuth client as the rest of the gateway sees it: whose token a request asks for, a
caller's login link, the login pages' paths and refusals. Apart from the client itself, so the
transports, the login gate and the login pages load none of it for backends without `auth:`
(docs/decisions/0064-lazy-imports.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

LOGIN_PATH = "/oauth/login"
CALLBACK_PATH = "/oauth/callback"


@dataclass(frozen=True)
class Caller:
    """Whose token: "" for the gateway's own; for token exchange, the caller's identity key and
    the token it presented."""

    user: str = ""
    subject_token: str | None = field(default=None, repr=False)
    who: tuple[str | None, str] | None = None  # (issuer, subject), for a per-user login link


GATEWAY = Caller()


class DeskError(Exception):
    """A login link or redirect that cannot be served: a status and one line for the page."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class LoginRequired(Exception):
    """A caller must log in to a backend before their request can go: the link to give them."""

    def __init__(self, backend: str, url: str, login_id: str) -> None:
        super().__init__(
            f"Log in to {backend} to continue: open {url}, then retry (the gateway keeps your "
            "login for this backend)"
        )
        self.backend = backend
        self.url = url
        self.login_id = login_id
