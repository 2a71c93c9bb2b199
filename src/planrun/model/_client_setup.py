"""A model client's settings and its HTTP clients, one connection pool per event loop."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import hashlib
import inspect
import json
import logging
import math
import os
import random
import re
import threading
import urllib.parse
import weakref
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

import jsonschema  # type: ignore[import-untyped]
import openai
from pydantic import BaseModel, ValidationError
from tenacity import RetryCallState

from planrun.core import (
    ConfigError,
    ModelRefused,
    PermanentError,
    TaskContext,
    TransientError,
    UsageError,
    register_secret,
)
from planrun.core.scheduling import RetryPolicy
from planrun.model._errors import (
    OutputTruncated,
    _redact,
)
from planrun.model._limiter import ProviderLimits
from planrun.model._limits import Limiter
from planrun.model._prompts import RenderedPrompt
from planrun.model._schema import (
    StrictSchema,
    check_max_tokens,
    output_bound,
    portable_schema,
    strict_schema,
)
from planrun.model._usage import Usage, UsageRecord

log = logging.getLogger("planrun.model")

DEFAULT_MODEL = "gpt-4o-mini"
PROMPT_HEADER = "X-Planrun-Prompt"
"""Request header naming the rendered prompt (``<name>:<hash>``); recorded by fixtures."""
DEFAULT_COMPLETION_ESTIMATE = 1024
"""The output bound of a call with no result schema and no ``max_tokens`` of its own or
of its Model (a structured call's bound is :func:`~planrun.model.output_bound` of its
schema). Every call sends its bound, and the budget and the limiter reserve it."""

Structured = Literal["auto", "strict", "json_object", "json_schema", "json_mode"]
"""How a result schema is asked for (``json_schema``/``json_mode`` are the older spellings)."""
SchemaMode = Literal["full", "portable"]
Api = Literal["chat", "responses"]
Mode = Literal["json_schema", "json_mode", "text"]
M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")
Messages = str | RenderedPrompt | Sequence[Mapping[str, Any]]

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


@dataclass(frozen=True)
class _Target:
    """What the reply must be: a pydantic model or a raw JSON Schema."""

    name: str
    strict: StrictSchema
    original: Mapping[str, Any]
    model: type[BaseModel] | None
    bound: int
    """The output bound a reply of this schema needs (:func:`output_bound`)."""

    @classmethod
    def of(cls, result: type[BaseModel] | Mapping[str, Any], name: str | None) -> _Target:
        if isinstance(result, type) and issubclass(result, BaseModel):
            original = result.model_json_schema()
            return cls(_schema_name(name or result.__name__), strict_schema(result), original,
                       result, output_bound(original))
        if isinstance(result, Mapping):
            return cls(_schema_name(name or str(result.get("title") or "result")),
                       strict_schema(result), result, None, output_bound(result))
        raise UsageError(
            f"result_model must be a pydantic model class or a JSON Schema dict, got {result!r}"
        )

    def validate(self, data: Any) -> Any:
        if self.model is not None:
            try:
                return self.model.model_validate(data)
            except ValidationError as exc:
                raise PermanentError(f"the reply does not match {self.name}: {exc}") from exc
        validator = jsonschema.validators.validator_for(self.original)(self.original)
        problems = [
            f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
            for e in validator.iter_errors(data)
        ]
        if problems:
            raise PermanentError(f"the reply does not match {self.name}: " + "; ".join(problems))
        return data

    @property
    def key(self) -> str:
        """Identifies the schema sent, so a server's rejection is remembered for it alone."""
        text = json.dumps(self.strict.schema, sort_keys=True)
        return f"{self.name}:{hashlib.sha256(text.encode()).hexdigest()[:16]}"

    def sent_schema(self, portable: bool) -> dict[str, Any]:
        """The strict schema as sent: without validation keywords when ``portable``."""
        return portable_schema(self.strict.schema) if portable else self.strict.schema

    def json_mode_schema(self, portable: bool) -> dict[str, Any]:
        """The schema JSON mode asks for (the original; a non-object root wrapped)."""
        schema: dict[str, Any] = {**self.original, "title": self.name}
        if self.strict.wrapped:
            defs = schema.pop("$defs", None)
            schema = {"title": self.name, "type": "object", "properties": {"value": schema},
                      "required": ["value"]}
            if defs is not None:
                schema["$defs"] = defs
        return portable_schema(schema) if portable else schema

    def json_mode_instructions(self, portable: bool = False) -> str:
        schema = self.json_mode_schema(portable)
        return (
            "Reply with one JSON object and nothing else. It must be valid against this "
            f"JSON Schema:\n{json.dumps(schema, separators=(',', ':'))}"
        )


def _schema_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64] or "result"


def _chat(messages: Messages) -> list[dict[str, Any]]:
    if isinstance(messages, str):
        chat: list[dict[str, Any]] = [{"role": "user", "content": messages}]
    elif isinstance(messages, RenderedPrompt):
        chat = list(messages.messages())
    else:
        chat = [dict(m) for m in messages]
    if not chat:
        raise UsageError("complete() needs at least one message")
    return chat


@dataclass
class _Call:
    """One complete() call, across its attempts."""

    messages: list[dict[str, Any]]
    target: _Target | None
    prompt_hash: str | None
    idempotency_key: str | None
    meter: Usage
    timeout: float | None
    max_tokens: int
    """The output bound sent (``max_completion_tokens``)."""
    temperature: float | None
    validate: bool
    attempts: int = 0
    fell_back: bool = False
    prompt_name: str | None = None
    level: int = 0
    """0: strict ``json_schema``; 1: JSON mode with the schema; 2: JSON mode, prompt only."""
    malformed: set[str] = field(default_factory=set)
    """Fingerprints of the bodies that were not JSON (:class:`MalformedReply`)."""
    task: TaskContext | None = None
    """The attempt the call is for (batch mode renews its lease while the call waits)."""


class _LoopClient:
    """The SDK client of one event loop, closed when that loop shuts down."""

    def __init__(self, client: openai.AsyncOpenAI) -> None:
        self.client = client
        self.closer = self._close_at_shutdown()

    async def _close_at_shutdown(self) -> AsyncGenerator[None, None]:
        # Started once on its loop, this generator is finalised by the loop's
        # shutdown_asyncgens() (asyncio.run, VirtualClock.run and asyncio.Runner call it
        # before closing), which closes the pooled connections while the loop still runs.
        try:
            yield
        finally:
            await self.client.close()


DEFAULT_TIMEOUT = 60.0
"""Seconds a model request may take unless ``timeout=`` or ``$PLANRUN_TIMEOUT`` says."""


class _Unset(enum.Enum):
    UNSET = "unset"


UNSET = _Unset.UNSET
"""A ``timeout`` not given: ``$PLANRUN_TIMEOUT``, else :data:`DEFAULT_TIMEOUT`."""


def _timeout(value: float | _Unset | None) -> float | None:
    """The request timeout: as given, else from the environment, else the default."""
    if value is not UNSET:
        if value is not None and not value > 0:
            raise UsageError(f"timeout must be a positive number of seconds (or None), "
                             f"got {value!r}")
        return value
    text = os.environ.get("PLANRUN_TIMEOUT", "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not (seconds > 0 and math.isfinite(seconds)):
        raise UsageError(f"PLANRUN_TIMEOUT must be a positive number of seconds, not {text!r}")
    return seconds




class _PromptScale:
    """What the provider counts of a prompt, learnt from the replies' ``prompt_tokens``.

    :func:`estimate_tokens` is deliberately high (a character count), which is right for a
    budget but leaves part of a token limit unused; the limiter takes the estimate times
    the ratio of reported to estimated prompt tokens over recent calls (an exponentially
    weighted sum, so a new kind of prompt moves it within a few calls). Until a reply has
    reported usage the ratio is 1; it never goes below :attr:`FLOOR`.
    """

    FLOOR = 0.25
    DECAY = 0.9

    def __init__(self) -> None:
        self.reported = 0.0
        self.estimated = 0.0

    def scaled(self, estimate: int) -> int:
        if self.estimated <= 0:
            return estimate
        return math.ceil(estimate * max(self.FLOOR, self.reported / self.estimated))

    def learn(self, estimate: int, reported: int) -> None:
        if reported > 0 and estimate > 0:
            self.reported = self.reported * self.DECAY + reported
            self.estimated = self.estimated * self.DECAY + estimate


class _SchemaRejected(PermanentError):
    """The server refused the response schema; :meth:`Model._attempt` falls back."""


def served_tier(named: object) -> str:
    """The tier an answer's ``service_tier`` names, as planrun prices it: ``flex`` and
    ``priority`` as named; anything else (``default``, ``auto``, ``scale``, nothing) is the
    default tier."""
    return str(named) if named in ("flex", "priority") else "default"


@dataclass(frozen=True)
class _Reply:
    """A Chat Completions or Responses reply, reduced to what planrun reads."""

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


_STRUCTURED = ("auto", "strict", "json_object", "json_schema", "json_mode")
_SCHEMA = ("full", "portable")
_APIS = ("chat", "responses")


def _choice(name: str, value: Any, env: str, allowed: tuple[str, ...], default: str) -> Any:
    """An option from the argument, else the environment variable ``env``, else default."""
    chosen = value if value is not None else os.environ.get(env) or default
    if chosen not in allowed:
        source = f"{name}" if value is not None else f"{env}"
        raise UsageError(
            f"{source} must be one of {', '.join(repr(a) for a in allowed)}, got {chosen!r}"
        )
    return chosen


def _flag(value: bool | None, env: str) -> bool:
    if value is not None:
        return value
    text = os.environ.get(env, "").strip().lower()
    if text in ("", "0", "false", "no", "off"):
        return False
    if text in ("1", "true", "yes", "on"):
        return True
    raise UsageError(f"{env} must be 1 or 0 (true/false), got {text!r}")


def _retry_after(state: RetryCallState) -> float | None:
    error = state.outcome.exception() if state.outcome else None
    return error.retry_after if isinstance(error, TransientError) else None


def _check_refusal(reply: _Reply, bound: int) -> None:
    if reply.refusal:
        raise ModelRefused(f"the model refused: {reply.refusal}")
    if reply.finish_reason == "length":
        raise OutputTruncated(bound, reply.text, reply.reasoning_tokens)
    if reply.finish_reason == "content_filter":
        raise ModelRefused(
            "the reply was withheld by the content filter (finish_reason='content_filter')"
        )


async def _sleep(seconds: float) -> None:
    # Looked up at call time, so a virtual loop (or a patched asyncio.sleep) governs it.
    await asyncio.sleep(seconds)

def _prompt_header(name: str | None, prompt_hash: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.\-]", "_", name or "")[:64]
    return f"{safe}:{prompt_hash}"


async def _settled(outcome: Any) -> None:
    """Await what a limiter's ``reconcile``/``penalize`` returned, when it is awaitable."""
    if inspect.isawaitable(outcome):
        await outcome


class _ModelSetup:
    """A model client's settings and its HTTP clients, one connection pool per event loop."""

    def __init__(
        self,
        model: str | None = None,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        client: openai.AsyncOpenAI | None = None,
        timeout: float | _Unset | None = UNSET,
        retry: int | RetryPolicy = 4,
        structured: Structured | None = None,
        limiter: Limiter | None = None,
        meter: Usage | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        rng: random.Random | None = None,
        schema: SchemaMode | None = None,
        compat: bool | None = None,
        api: Api | None = None,
    ) -> None:
        self.structured: Structured = _choice(
            "structured", structured, "PLANRUN_STRUCTURED", _STRUCTURED, "auto"
        )
        self.schema: SchemaMode = _choice("schema", schema, "PLANRUN_SCHEMA", _SCHEMA, "full")
        self.api: Api = _choice("api", api, "PLANRUN_API", _APIS, "chat")
        self.compat = _flag(compat, "PLANRUN_COMPAT")
        self.model = model or os.environ.get("PLANRUN_MODEL") or DEFAULT_MODEL
        timeout = _timeout(timeout)
        self._template = (
            client.with_options(max_retries=0)
            if client is not None
            else self._new_client(api_key, base_url, timeout)
        )
        self._secrets = tuple(
            s
            for s in (api_key, getattr(self._template, "api_key", None))
            if isinstance(s, str) and s
        )
        for secret in self._secrets:
            register_secret(secret)
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopClient] = (
            weakref.WeakKeyDictionary()
        )
        self._template_used = False
        self._lock = threading.Lock()
        self.timeout = timeout
        self.retry = RetryPolicy.of(retry)
        self.limiter = limiter
        self.meter = meter if meter is not None else Usage()
        self.max_tokens = check_max_tokens(max_tokens, "Model")
        self.temperature = temperature
        self._rng = rng or random.Random()
        self._fallback: dict[str, int] = {}
        self._strict_cache: dict[tuple[type[BaseModel], str | None], _Target] = {}
        self._prompt_scale = _PromptScale()

    @staticmethod
    def _new_client(
        api_key: str | None, base_url: str | None, timeout: float | None
    ) -> openai.AsyncOpenAI:
        key = api_key or os.environ.get("OPENAI_API_KEY")
        if not key:
            raise ConfigError(
                "OPENAI_API_KEY is not set: pass api_key= to Model or set the OPENAI_API_KEY "
                "environment variable (a local server takes any key)"
            )
        url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        return openai.AsyncOpenAI(api_key=key, base_url=url, timeout=timeout, max_retries=0)

    def __repr__(self) -> str:
        return (
            f"Model(model={self.model!r}, base_url={self.base_url!r}, "
            f"structured={self.structured!r})"
        )

    @property
    def base_url(self) -> str:
        """Where requests go."""
        return str(self._template.base_url)

    @property
    def _server(self) -> str:
        """The server as errors name it: scheme, host and port of the base URL (no path,
        no user information)."""
        parts = urllib.parse.urlsplit(self.base_url)
        return f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}"

    @property
    def json_schema_supported(self) -> bool:
        """False once the server has rejected a ``json_schema`` and JSON mode is used for it."""
        return not self._fallback

    async def _client(self) -> openai.AsyncOpenAI:
        """The SDK client of the running loop (made on the loop's first call)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            entry = self._clients.get(loop)
            if entry is not None:
                return entry.client
            for old in [k for k in self._clients if k.is_closed()]:
                del self._clients[old]
            if self._template_used:
                client = self._template.copy(
                    http_client=openai.DefaultAsyncHttpxClient(timeout=self._template.timeout)
                )
            else:
                client, self._template_used = self._template, True
            entry = self._clients[loop] = _LoopClient(client)
        await entry.closer.__anext__()
        return entry.client

    async def aclose(self) -> None:
        """Close the HTTP client of the running loop (other loops close theirs at shutdown)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            entry = self._clients.pop(loop, None)
        if entry is not None:
            await entry.closer.aclose()
        elif not self._template_used:
            await self._template.close()
