"""The redaction table (gateway/sensitive.py) and the `redact` hook (gateway/hooks/redact.py):
each kind found and replaced, and strings that merely look like one left alone."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from gateway.config.hooks import REDACT_KINDS, HookConfig
from gateway.hooks.api import HookEvent
from gateway.hooks.redact import Redactor
from gateway.sensitive import KINDS, Scanner, luhn

# (kind, a text holding one). Built from parts so no scanner of this repository's own flags
# the file: none of these is a live credential.
PEM = "-----BEGIN RSA " + "PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA " + "PRIVATE KEY-----"
SECRETS = [
    ("aws_access_key", "key=" + "AKIA" + "IOSFODNN7EXAMPLE" + " ok"),
    ("aws_access_key", "temp " + "ASIA" + "ZZZZZZZZZZZZZZZZ"),
    ("aws_secret_key", "aws_secret_access_key = " + "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
    ("github_token", "token " + "ghp_" + "a1B2" * 9),
    ("github_token", "github_pat_" + "11ABCDEFG0" * 4),
    ("slack_token", "xoxb-" + "123456789012-abcdefABCDEF"),
    ("openai_key", "OPENAI_API_KEY=" + "sk-proj-" + "Ab3" * 10),
    ("google_api_key", "AIza" + "SyA-1234567890abcdefghijklmnopqrstu"),
    (
        "jwt",
        "eyJhbGciOiJIUzI1NiJ9"
        + ".eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    ),
    ("bearer_token", "Authorization: Bearer " + "abcdefghijklmnop0123456789"),
    ("private_key", "here:\n" + PEM + "\nend"),
    ("email", "write to jane.doe+mcp@example.co.uk today"),
    ("card_number", "card 4111 1111 1111 1111 exp"),
    ("card_number", "amex 378282246310005."),
    ("card_number", "5555-5555-5555-4444"),
]
LOOK_ALIKES = [
    "order 4111111111111112 shipped",  # 16 digits failing the Luhn check
    "1234567890123456",  # likewise
    "user@localhost and not@mail and @handle and a@b",  # no dotted domain
    "AKIA" + "IOSFODNN7EXAMPL",  # one character short
    "XAKIA" + "IOSFODNN7EXAMPLE",  # inside a longer word
    "ghp_short",
    "sk-short",
    "bearer token",  # the word, no token
    "-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----",
    "version 1.2.3.4, phone +1 555 0100",
]


def test_the_configs_kinds_are_the_tables() -> None:
    assert REDACT_KINDS == KINDS


@pytest.mark.parametrize(
    ("kind", "text"), SECRETS, ids=[f"{k}-{i}" for i, (k, _) in enumerate(SECRETS)]
)
def test_each_kind_is_found_and_replaced(kind: str, text: str) -> None:
    counts: Counter[str] = Counter()
    out = Scanner().redact(text, counts)
    assert counts == Counter({kind: 1})
    assert f"[redacted:{kind}]" in out


@pytest.mark.parametrize("text", LOOK_ALIKES)
def test_what_merely_looks_like_a_secret_is_left_alone(text: str) -> None:
    counts: Counter[str] = Counter()
    assert Scanner().redact(text, counts) == text
    assert not counts


def test_luhn() -> None:
    assert luhn("4111 1111 1111 1111") and luhn("79927398713")
    assert not luhn("4111111111111112") and not luhn("79927398710")


def test_kinds_and_extra_patterns_from_the_config() -> None:
    scanner = Scanner(("email",), {"ticket": r"\bTCK-\d{6}\b"})
    counts: Counter[str] = Counter()
    out = scanner.redact("a@example.com TCK-123456 " + "AKIA" + "IOSFODNN7EXAMPLE", counts)
    assert out == "[redacted:email] [redacted:ticket] " + "AKIA" + "IOSFODNN7EXAMPLE"
    assert counts == Counter({"email": 1, "ticket": 1})


def event(result: dict[str, Any], method: str = "tools/call") -> HookEvent:
    return HookEvent("result", method, {"name": "t"}, result, "b", None, "stdio", {})


def test_the_hook_redacts_every_text_of_a_result_and_counts_by_kind() -> None:
    result: dict[str, Any] = {
        "content": [
            {"type": "text", "text": "mail jane@example.com"},
            {"type": "image", "mimeType": "image/png", "data": "jane@example.com"},  # (base64)
        ],
        "structuredContent": {"owner": {"email": "bob@example.org"}, "data": "x@example.net"},
        "_meta": {"note": "ops@example.com"},
    }
    e = event(result)
    new = Redactor(HookConfig(use="redact"))(e)
    assert new is not None
    assert new["content"][0]["text"] == "mail [redacted:email]"
    assert new["content"][1] is result["content"][1]
    assert new["structuredContent"] == {
        "owner": {"email": "[redacted:email]"},
        "data": "[redacted:email]",
    }
    assert new["_meta"] is result["_meta"]
    assert e.audit == Counter({"email": 3})
    assert result["content"][0]["text"] == "mail jane@example.com"  # (the original untouched)


def test_the_hook_redacts_prompt_messages() -> None:
    result = {
        "messages": [{"role": "user", "content": {"type": "text", "text": "card 4111111111111111"}}]
    }
    new = Redactor(HookConfig(use="redact"))(event(result, "prompts/get"))
    assert new is not None
    assert new["messages"][0]["content"]["text"] == "card [redacted:card_number]"


def test_a_clean_result_passes_as_it_is() -> None:
    e = event({"content": [{"type": "text", "text": "nothing to see, 4111111111111112"}]})
    assert Redactor(HookConfig(use="redact"))(e) is None
    assert not e.audit
