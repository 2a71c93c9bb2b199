"""Secrets out of every text planrun stores or shows: one function, used at every boundary.

An error's text can quote a secret: an SDK error echoing a header, a tool echoing the request
it made, a worker that formats its configuration into a message. :func:`redact` replaces

* every secret registered with :func:`register_secret` (each :class:`~planrun.model.Model`
  registers its API key) and the ``OPENAI_API_KEY`` of the environment, verbatim; and
* anything shaped like an OpenAI key (``sk-`` followed by key characters), whoever's it is,

with ``[redacted]`` / ``sk-[redacted]``. It is applied where error text enters a task record
(the supervisor, the external workers, and every store when it writes a task or an event),
in model errors, in reports, at the CLI and in every log record of planrun's loggers
(:class:`RedactingFilter`), so a key reaches none of them.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterable

__all__ = ["LOGGERS", "MIN_SECRET_LENGTH", "RedactingFilter", "redact", "register_secret"]

MIN_SECRET_LENGTH = 8
"""Shorter strings are not registered: redacting ``"x"`` everywhere would garble text."""

KEY_PATTERN = re.compile(r"\bsk-[A-Za-z0-9_\-*]{6,}")
"""What an OpenAI key looks like (project, service-account and legacy keys alike)."""

_secrets: set[str] = set()
_lock = threading.Lock()


def register_secret(secret: str | None) -> None:
    """Redact ``secret`` from every later :func:`redact` (no-op for None or a short string)."""
    if secret and len(secret) >= MIN_SECRET_LENGTH:
        with _lock:
            _secrets.add(secret)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every known secret, ``secrets`` and any ``sk-...`` string replaced."""
    if not text:
        return text
    with _lock:
        known = set(_secrets)
    env_key = os.environ.get("OPENAI_API_KEY")
    if env_key and len(env_key) >= MIN_SECRET_LENGTH:
        known.add(env_key)
    known.update(s for s in secrets if s)
    for secret in sorted(known, key=len, reverse=True):  # longest first: no partial leftovers
        text = text.replace(secret, "[redacted]")
    return KEY_PATTERN.sub("sk-[redacted]", text)


class RedactingFilter(logging.Filter):
    """Redacts a log record's message (formatted with its arguments) before any handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, ()
        return True


LOGGERS = ("planrun", "planrun.model", "planrun.distributed", "planrun.supervisor",
           "planrun.stores", "planrun.fixtures", "planrun.usage", "planrun.cli")
"""planrun's loggers; each gets a :class:`RedactingFilter` when this module is imported."""

_FILTER = RedactingFilter()
for _name in LOGGERS:
    _logger = logging.getLogger(_name)
    if _FILTER not in _logger.filters:
        _logger.addFilter(_FILTER)
