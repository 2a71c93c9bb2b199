"""The one map from what the SDK and the transport raise to planrun's errors, and the
recognition of a server's refusal of a response schema."""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import json
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import openai

from planrun.core import (
    ModelRefused,
    PermanentError,
    PlanrunError,
    RateLimited,
    TransientError,
    WorkerError,
    redact,
)


class OutputTruncated(ModelRefused):
    """The reply reached its output bound before it ended (``finish_reason == "length"``).

    ``bound`` is the bound the call sent, ``text`` the reply so far and
    ``reasoning_tokens`` what a reasoning model spent of the bound thinking. Permanent: the
    same call stops at the same place; raise the kind's ``max_tokens`` (or the Model's).
    The request is counted in usage with ``error="OutputTruncated"``.
    """

    def __init__(self, bound: int, text: str = "", reasoning_tokens: int = 0) -> None:
        thinking = (f", {reasoning_tokens} of them on reasoning" if reasoning_tokens else "")
        super().__init__(
            f"the reply was cut off at its output bound of {bound} tokens{thinking} "
            "(finish_reason='length'); raise max_tokens for this kind or the Model, or "
            "shorten the input")
        self.bound = bound
        self.text = text
        self.reasoning_tokens = reasoning_tokens

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.bound, self.text, self.reasoning_tokens))


def _redact(text: str, secrets: Sequence[str] = ()) -> str:
    return redact(text, secrets)


def retry_after_seconds(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds the server asked us to wait: ``retry-after-ms``, else ``Retry-After``.

    ``Retry-After`` may be seconds or an HTTP date (compared with wall time ``now``).
    Returns None when neither header is present or parseable.
    """
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _status_error(exc: openai.APIStatusError, secrets: Sequence[str]) -> WorkerError:
    status = exc.status_code
    body = exc.body if isinstance(exc.body, Mapping) else {}
    code = exc.code or body.get("code")
    code = code if isinstance(code, str) else None  # vLLM and llama.cpp put the status here
    detail = _redact(str(body.get("message") or exc.message), secrets).strip()
    message = f"HTTP {status}{f' ({code})' if code else ''} from the model API: {detail}"
    retry_after = retry_after_seconds(exc.response.headers)
    if code in ("context_length_exceeded", "insufficient_quota"):
        return PermanentError(message)
    if status == 429:
        return RateLimited(message, retry_after=retry_after)
    if status in (408, 409) or status >= 500:
        return TransientError(message, retry_after=retry_after)
    return PermanentError(message)


def translate_error(exc: BaseException, *, secrets: Sequence[str] = (),
                    timeout: float | None = None) -> WorkerError:
    """Map an exception met while calling the API to planrun's error classes.

    Timeouts, connection errors, 408, 409, 429 and 5xx -> :class:`TransientError`
    (:class:`RateLimited` for 429, with ``retry_after`` from the headers); everything
    else -> :class:`PermanentError`, including a 429 ``insufficient_quota`` and a 400
    ``context_length_exceeded``. planrun's own errors pass through. ``secrets`` (and
    anything shaped like an OpenAI key) are redacted from the message; ``timeout`` (the
    request's, in seconds) is named in a timeout's message. The caller raises the result
    ``from exc``.
    """
    if isinstance(exc, WorkerError):
        return exc
    if isinstance(exc, openai.APITimeoutError | asyncio.TimeoutError | TimeoutError):
        after = f" after {timeout:g} s" if timeout else ""
        return TransientError(
            f"the model API request timed out{after} (a slow model or server? raise the "
            "limit with --timeout S, PLANRUN_TIMEOUT=S or Model(timeout=S))")
    if isinstance(exc, openai.APIConnectionError):
        return TransientError(f"could not reach the model API: {_redact(str(exc), secrets)}")
    if isinstance(exc, openai.APIStatusError):
        return _status_error(exc, secrets)
    return PermanentError(
        f"model API call failed: {type(exc).__name__}: {_redact(str(exc), secrets)}"
    )


def _own_error(exc: BaseException) -> PlanrunError | None:
    """A non-worker planrun error that the SDK wrapped (it wraps transport errors), if any."""
    seen: set[int] = set()
    todo = [exc.__cause__, exc.__context__]
    while todo:
        node = todo.pop(0)
        if node is None or id(node) in seen:
            continue
        if isinstance(node, PlanrunError) and not isinstance(node, WorkerError):
            return node
        seen.add(id(node))
        todo += [node.__cause__, node.__context__]
    return None




_SCHEMA_REJECTIONS: tuple[tuple[frozenset[int], re.Pattern[str]], ...] = (
    # OpenAI: 400 naming response_format / json_schema (a model without structured output,
    # or an unknown ``response_format.schema`` in JSON mode).
    (frozenset({400, 422}), re.compile(r"response_format|json_schema")),
    # vLLM: 400 "The provided JSON schema contains features not supported by xgrammar".
    (frozenset({400}), re.compile(r"json schema contains features not supported")),
    # Ollama: 500 "invalid JSON schema in format".
    (frozenset({400, 500}), re.compile(r"invalid json schema in format")),
    # llama.cpp's llama-server: 400 "Failed to initialize samplers: failed to parse grammar".
    (frozenset({400, 500}), re.compile(r"failed to parse grammar|json schema conversion")),
    # llama-cpp-python's server: 500 with pydantic's "Input should be 'text' or
    # 'json_object'" on ('body', 'response_format', 'type') (matched by the first pattern
    # for 400/422; here for its 500).
    (frozenset({500}), re.compile(r"response_format.{0,40}type|input should be 'text' or")),
)
"""(statuses, message pattern) of each server's way of rejecting a response schema."""


def rejects_schema(exc: BaseException | None) -> bool:
    """True when ``exc`` is a server's refusal of the response schema (not of the request).

    Recognises OpenAI's 400 naming ``response_format``, vLLM's 400 ("... not supported by
    xgrammar"), Ollama's 500 ("invalid JSON schema in format"), llama.cpp's 400 ("failed to
    parse grammar") and llama-cpp-python's 500 (pydantic: ``response_format.type`` must be
    ``'text'`` or ``'json_object'``).
    """
    if not isinstance(exc, openai.APIStatusError):
        return False
    body = exc.body if isinstance(exc.body, Mapping) else {}
    param = getattr(exc, "param", None) or body.get("param") or ""
    text = f"{param} {body.get('message') or exc.message}".lower()
    return any(exc.status_code in statuses and pattern.search(text)
               for statuses, pattern in _SCHEMA_REJECTIONS)


_TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (OSError, EOFError, RuntimeError)
"""Raised beneath the SDK by a broken connection or a loop going away: worth a retry."""


class MalformedReply(TransientError):
    """The server's answer was not JSON: cut short on the way (a transport fault, worth a
    retry like a reset connection) or not an API answer at all (a proxy's page, which a
    retry does not mend: the same such body twice is :meth:`repeated`)."""

    def __init__(self, message: str, fingerprint: str | None) -> None:
        super().__init__(message)
        self.fingerprint = fingerprint
        """A digest of a body that is not JSON from the start or mid-way, to see it come
        back; None for a body cut short (JSON that stops at its end), which is retried
        like a reset connection until the retry policy runs out."""

    def repeated(self, server: str) -> PermanentError:
        """The permanent error for a server that gave this same body twice."""
        return PermanentError(
            f"the model API at {server} answered twice with the same body that is not JSON "
            f"(a proxy's or gateway's page? check the base URL): {self}")


def _malformed(exc: json.JSONDecodeError | UnicodeDecodeError, server: str,
               secrets: Sequence[str]) -> MalformedReply:
    body = exc.doc if isinstance(exc, json.JSONDecodeError) else bytes(exc.object).decode(
        "utf-8", "replace")
    shown = _redact(body[:80], secrets)
    cut = (isinstance(exc, json.JSONDecodeError) and exc.pos >= len(body.rstrip()) - 1) \
        or "Unterminated" in str(exc)
    return MalformedReply(
        f"the model API at {server} answered with a body that is not JSON "
        f"({'cut short, ' if cut else ''}{len(body)} characters: {shown!r}...; "
        f"{type(exc).__name__}: {_redact(str(exc), secrets)})",
        None if cut else hashlib.sha256(body.encode("utf-8", "replace")).hexdigest()[:16])


def _transport_error(exc: BaseException, secrets: Sequence[str],
                     server: str = "its base URL") -> WorkerError:
    """A planrun error for an exception the SDK let through (never a raw foreign one)."""
    detail = _redact(f"{type(exc).__name__}: {exc}", secrets)
    if isinstance(exc, json.JSONDecodeError | UnicodeDecodeError):
        return _malformed(exc, server, secrets)
    if isinstance(exc, _TRANSPORT_ERRORS) or _is_transport_error(exc):
        return TransientError(f"the connection to the model API failed: {detail}")
    return PermanentError(f"model API call failed: {detail}")


def _is_transport_error(exc: BaseException) -> bool:
    names = {c.__name__ for c in type(exc).__mro__}
    return bool(names & {"TransportError", "ClosedResourceError", "BrokenResourceError",
                         "EndOfStream", "NetworkError", "ProtocolError"})


