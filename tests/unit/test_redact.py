"""One redaction function: what it removes, and the log records it cleans."""

from __future__ import annotations

import logging

import pytest

from planrun.core._redact import redact, register_secret


def test_key_shaped_strings_of_every_kind_are_redacted() -> None:
    for key in ("sk-proj-abcDEF123456_-xyz", "sk-svcacct-0123456789abcdef", "sk-abcdefgh1234"):
        assert redact(f"header Bearer {key}.") == "header Bearer sk-[redacted]."
    assert redact("the word sk-ip and task-123456") == "the word sk-ip and task-123456"


def test_a_multi_line_message_keeps_its_lines() -> None:
    text = "HTTP 500:\nline two with sk-abcdefgh1234\nline three"
    assert redact(text) == "HTTP 500:\nline two with sk-[redacted]\nline three"


def test_the_environment_key_is_redacted_even_when_not_key_shaped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "ollama-local-gateway-key")
    assert redact("auth=ollama-local-gateway-key;") == "auth=[redacted];"


def test_a_longer_secret_is_replaced_before_a_shorter_one_inside_it() -> None:
    register_secret("abcdefgh-secret")
    register_secret("abcdefgh-secret-and-more")
    assert redact("x abcdefgh-secret-and-more y") == "x [redacted] y"


def test_planrun_log_records_are_redacted(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="planrun.model"):
        logging.getLogger("planrun.model").warning("retrying after %s", "key sk-abcdefgh1234")
        logging.getLogger("planrun.stores").warning("store said %s", "sk-zyxwvut98765")
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["retrying after key sk-[redacted]", "store said sk-[redacted]"]
