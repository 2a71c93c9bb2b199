"""A model call's answer: what planrun reads of a reply, the result made of it, the errors."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import openai

from planrun.core import ModelRefused, PermanentError, PlanrunError, WorkerError
from planrun.model._errors import (
    MalformedReply,
    OutputTruncated,
    _own_error,
    _redact,
    _transport_error,
    translate_error,
)
from planrun.model._limiter import ProviderLimits
from planrun.model._request import _Call
from planrun.model._usage import UsageRecord

__all__ = ["Completion", "Mode", "completion_of", "own_error", "request_error", "served_tier"]

Mode = Literal["json_schema", "json_mode", "text"]
T = TypeVar("T")


@dataclass(frozen=True)
class Completion(Generic[T]):
    """The outcome of one :meth:`Model.complete` call."""

    parsed: T | None
    """The validated result model instance, the parsed JSON (raw schema), or None (text)."""
    text: str
    """The reply's text exactly as received."""
    usage: UsageRecord
    """Tokens and cost of the request that produced this reply."""
    model: str
    finish_reason: str
    request_id: str | None
    prompt_hash: str | None
    mode: Mode = "text"
    """How structure was requested: ``json_schema``, ``json_mode`` or ``text``."""
    fell_back: bool = False
    """True when ``json_schema`` was rejected by the server and JSON mode was used."""
    attempts: int = 1
    """HTTP requests made for this call (retries and a JSON-mode fallback included)."""


class _SchemaRejected(PermanentError):
    """The server refused the response schema; :meth:`Model._attempt` falls back."""


def served_tier(named: object) -> str:
    """The tier an answer's ``service_tier`` names, as planrun prices it: ``flex`` and
    ``priority`` as named; anything else (``default``, ``auto``, ``scale``, nothing) is the
    default tier."""
    return str(named) if named in ("flex", "priority") else "default"


@dataclass(frozen=True)
class _Reply:
    """A Chat Completions or Responses reply, reduced to what planrun reads.

    :meth:`of` is the one place an answer is read: its text and stop, its usage (the
    tokens the meter records) and what the server says of how it served the request (the
    model that answered, the request id, the tier that served it, the ``x-ratelimit-*``
    headers; the latency is set by :meth:`Transport.send`). Another field an answer
    carries is read there.
    """

    model: str
    text: str
    refusal: str | None
    finish_reason: str
    answered: bool
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    request_id: str | None = None
    limits: ProviderLimits | None = None
    """What the response's ``x-ratelimit-*`` headers said, when it had any."""
    service_tier: str = "default"
    """The tier that served the request, as the answer's ``service_tier`` names it
    (``flex``, ``priority``; ``default`` for any other value or none)."""
    latency_s: float | None = None
    """Seconds from sending the request to its answer, when measured."""

    @classmethod
    def of(cls, raw: Any, base_url: str, limits: ProviderLimits | None = None) -> _Reply:
        request_id = getattr(raw, "_request_id", None)
        if isinstance(raw, openai.types.chat.ChatCompletion):
            return dataclasses.replace(cls._chat(raw, request_id), limits=limits)
        if isinstance(raw, openai.types.responses.Response):
            return dataclasses.replace(cls._responses(raw, request_id), limits=limits)
        shown = _redact(str(raw)[:200])
        raise PermanentError(
            f"the model API at {base_url} answered with something that is not a completion "
            f"(is the base URL right?): {shown!r}"
        )

    @classmethod
    def _chat(cls, raw: openai.types.chat.ChatCompletion, request_id: str | None) -> _Reply:
        usage = raw.usage
        prompt = getattr(usage, "prompt_tokens_details", None)
        completion = getattr(usage, "completion_tokens_details", None)
        choice = raw.choices[0] if raw.choices else None
        return cls(
            raw.model,
            (choice.message.content or "") if choice else "",
            choice.message.refusal if choice else None,
            (choice.finish_reason or "stop") if choice else "stop",
            choice is not None,
            usage.prompt_tokens if usage else 0,
            usage.completion_tokens if usage else 0,
            (prompt.cached_tokens or 0) if prompt else 0,
            (completion.reasoning_tokens or 0) if completion else 0,
            request_id,
            service_tier=served_tier(getattr(raw, "service_tier", None)),
        )

    @classmethod
    def _responses(cls, raw: openai.types.responses.Response, request_id: str | None) -> _Reply:
        usage = raw.usage
        refusal = next(
            (
                part.refusal
                for item in raw.output
                if item.type == "message"
                for part in item.content
                if part.type == "refusal"
            ),
            None,
        )
        reason = raw.incomplete_details.reason if raw.incomplete_details else None
        finish = {"max_output_tokens": "length", "content_filter": "content_filter"}.get(
            reason or "", "stop"
        )
        return cls(
            raw.model,
            raw.output_text,
            refusal,
            finish,
            bool(raw.output),
            usage.input_tokens if usage else 0,
            usage.output_tokens if usage else 0,
            usage.input_tokens_details.cached_tokens if usage else 0,
            usage.output_tokens_details.reasoning_tokens if usage else 0,
            request_id,
            service_tier=served_tier(getattr(raw, "service_tier", None)),
        )


def completion_of(call: _Call, reply: _Reply, record: UsageRecord) -> Completion[Any]:
    """The result of ``call`` from its ``reply``: refused, cut short or withheld replies
    raise; the text is parsed and validated against the call's schema (unless the call
    said not to)."""
    if not reply.answered:
        raise PermanentError("the model API returned no choices")
    _check_refusal(reply, call.max_tokens)
    mode: Mode = "text" if call.target is None else "json_schema" if call.level == 0 \
        else "json_mode"
    parsed = _parse(call, mode, reply.text)
    return Completion(parsed, reply.text, record, reply.model, reply.finish_reason,
                      reply.request_id, call.prompt_hash, mode, call.fell_back, call.attempts)


def _check_refusal(reply: _Reply, bound: int) -> None:
    if reply.refusal:
        raise ModelRefused(f"the model refused: {reply.refusal}")
    if reply.finish_reason == "length":
        raise OutputTruncated(bound, reply.text, reply.reasoning_tokens)
    if reply.finish_reason == "content_filter":
        raise ModelRefused(
            "the reply was withheld by the content filter (finish_reason='content_filter')"
        )


def _parse(call: _Call, mode: Mode, text: str) -> Any:
    target = call.target
    if target is None:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if not call.validate:
            return None
        raise PermanentError(f"the reply is not valid JSON: {exc}") from exc
    try:
        if mode == "json_schema":
            data = target.strict.decode(data)
        elif target.strict.wrapped and isinstance(data, dict):
            data = data.get("value")
    except ValueError as exc:
        if not call.validate:
            return data
        raise PermanentError(f"the reply does not match {target.name}: {exc}") from exc
    return target.validate(data) if call.validate else data


def own_error(exc: BaseException) -> PlanrunError | None:
    """The planrun error ``exc`` is or carries that is raised as it is: not a request's
    failure to translate (a fixture miss raised beneath the SDK is never retried)."""
    if isinstance(exc, PlanrunError) and not isinstance(exc, WorkerError):
        return exc
    return _own_error(exc)


def request_error(call: _Call, exc: BaseException, *, secrets: tuple[str, ...],
                  server: str) -> WorkerError:
    """The planrun error a failed request of ``call`` is (secrets redacted; the same body
    that is not JSON twice is permanent)."""
    if isinstance(exc, openai.OpenAIError | asyncio.TimeoutError | WorkerError):
        error = translate_error(exc, secrets=secrets, timeout=call.timeout)
    else:
        error = _transport_error(exc, secrets, server)
    if isinstance(error, MalformedReply) and error.fingerprint is not None:
        seen = error.fingerprint in call.malformed  # the same page each time
        call.malformed.add(error.fingerprint)
        if seen:
            return error.repeated(server)
    return error
