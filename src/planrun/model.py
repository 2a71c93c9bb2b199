"""One client for chat models, over the ``openai`` SDK: structured output, retries, limits, usage.

:class:`Model` is the only place planrun talks to a model API. One call of
:meth:`Model.complete` is::

    budget check ─► rate limiter ─► HTTP request ─► record usage ─► refusal? ─► parse + validate
         ▲                                  │
         └──── transient error: backoff ◄───┘   (tenacity; Retry-After honoured)

* **Structured output.** Given a pydantic model (or a raw JSON Schema), the request asks for
  ``response_format={"type": "json_schema", "strict": True, ...}`` with a schema made
  strict-compatible by :func:`strict_schema`; the reply is decoded and validated locally
  against the *original* model/schema, so constraints that strict mode cannot express are
  still enforced. When a server rejects ``json_schema`` (a 400 naming ``response_format``),
  ``structured="auto"`` falls back to JSON mode (``{"type": "json_object"}`` plus the schema
  in a system message, validated locally), logs a warning, flags ``Completion.fell_back`` and
  remembers it for later calls.
* **Errors.** :func:`translate_error` is the one map from SDK exceptions to planrun's:
  timeouts, connection errors, 408, 409, 429 and 5xx are transient (retried with exponential
  backoff and jitter, never sooner than the server's ``Retry-After``/``retry-after-ms``);
  400, 401, 403, 404, 422, ``context_length_exceeded`` and ``insufficient_quota`` are
  permanent (one request, then fail). The SDK's own retries are off (``max_retries=0``).
* **Waiting** is ``asyncio.sleep`` on the running loop, so under
  :class:`planrun.clock.VirtualClock` backoffs and rate limits take no real time.
* **Secrets.** The API key is never in ``repr()``, log lines or error messages.
"""

from __future__ import annotations

import asyncio
import email.utils
import inspect
import json
import logging
import os
import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar, overload

import jsonschema  # type: ignore[import-untyped]
import openai
from pydantic import BaseModel, ValidationError
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from planrun.errors import (
    ConfigError,
    ModelRefused,
    PermanentError,
    PlanrunError,
    RateLimited,
    TransientError,
    UsageError,
    WorkerError,
)
from planrun.limits import Limiter
from planrun.prompts import RenderedPrompt
from planrun.usage import Reservation, Usage, UsageRecord, estimate_tokens

__all__ = [
    "DEFAULT_MODEL",
    "PROMPT_HEADER",
    "Completion",
    "Model",
    "RetryPolicy",
    "StrictSchema",
    "retry_after_seconds",
    "strict_schema",
    "translate_error",
]

log = logging.getLogger("planrun.model")

DEFAULT_MODEL = "gpt-4o-mini"
PROMPT_HEADER = "X-Planrun-Prompt"
"""Request header naming the rendered prompt (``<name>:<hash>``); recorded by fixtures."""
DEFAULT_COMPLETION_ESTIMATE = 1024
"""Completion tokens assumed by the budget and the limiter when ``max_tokens`` is unset."""

Structured = Literal["auto", "json_schema", "json_mode"]
Mode = Literal["json_schema", "json_mode", "text"]
M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")
Decoder = Callable[[Any], Any]
Messages = str | RenderedPrompt | Sequence[Mapping[str, Any]]

# ---------------------------------------------------------------------------------------------
# Strict JSON Schema
# ---------------------------------------------------------------------------------------------

_KEEP = frozenset(
    {
        "description",
        "enum",
        "const",
        "pattern",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minItems",
        "maxItems",
    }
)
"""Keywords strict mode accepts as they are; everything else is rebuilt or dropped."""

_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
)
"""String formats strict mode accepts; other formats (``uri``, ``binary``, ...) are dropped."""

_ENCODED_NOTE = "Encoded as JSON text: this string holds a JSON value."


def _decode_json_text(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"a field sent as JSON text is not valid JSON: {exc}") from exc


def _base_type(node: Mapping[str, Any]) -> str | None:
    """The one non-null type of a node, or None when it has none or several."""
    kind = node.get("type")
    if isinstance(kind, str):
        return kind
    if isinstance(kind, list):
        rest = [k for k in kind if k != "null"]
        return rest[0] if len(rest) == 1 else None
    return None


def _allows_null(node: Mapping[str, Any]) -> bool:
    kind = node.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    return any(_allows_null(b) for b in node.get("anyOf", ()))


def _nullable(node: dict[str, Any]) -> dict[str, Any]:
    if _allows_null(node):
        return node
    if "anyOf" in node:
        return {**node, "anyOf": [*node["anyOf"], {"type": "null"}]}
    if isinstance(node.get("type"), str) and not {"enum", "const", "$ref"} & node.keys():
        return {**node, "type": [node["type"], "null"]}
    return {"anyOf": [node, {"type": "null"}]}


def _is_free_form(node: Mapping[str, Any]) -> bool:
    """An object with no fixed properties, or a schema with no type at all (``Any``)."""
    if not {"type", "$ref", "anyOf", "oneOf", "allOf", "enum", "const"} & node.keys():
        return True
    if _base_type(node) != "object":
        return False
    extra = node.get("additionalProperties")
    if "patternProperties" in node or (extra is not None and extra is not False):
        return True
    return "properties" not in node and extra is not False


def _json_types(value: Any) -> set[str]:
    if value is None:
        return {"null"}
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int):
        return {"integer", "number"}
    if isinstance(value, float):
        return {"number"}
    if isinstance(value, str):
        return {"string"}
    return {"array"} if isinstance(value, list) else {"object"}


@dataclass(frozen=True)
class StrictSchema:
    """A JSON Schema made acceptable to ``strict`` structured output, and its way back.

    ``schema`` is what is sent. ``decode(reply)`` turns a reply that follows it into data
    that follows the original schema: free-form values sent as JSON text (``encoded`` lists
    their paths) are parsed, ``null``\\ s for originally optional properties are dropped (so
    defaults apply), and a non-object root wrapped as ``{"value": ...}`` is unwrapped.
    """

    schema: dict[str, Any]
    encoded: tuple[str, ...] = ()
    wrapped: bool = False
    decoder: Decoder | None = field(default=None, repr=False, compare=False)

    def decode(self, reply: Any) -> Any:
        """Map a reply to the shape of the original schema."""
        value = self.decoder(reply) if self.decoder is not None else reply
        if self.wrapped and isinstance(value, dict):
            return value.get("value")
        return value


class _Strictifier:
    """Rebuilds a schema node by node, collecting a decoder for the reply alongside."""

    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root
        self.defs: dict[str, dict[str, Any]] = {}
        self.def_decoders: dict[str, Decoder | None] = {}
        self.encoded: list[str] = []

    def resolve(self, ref: str) -> tuple[str, Mapping[str, Any]]:
        if not ref.startswith("#/"):
            raise UsageError(f"strict_schema: only local $refs are supported, got {ref!r}")
        node: Any = self.root
        for part in ref[2:].split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        return ref.rsplit("/", 1)[-1], node

    def ref(self, ref: str) -> tuple[dict[str, Any], Decoder | None]:
        name, target = self.resolve(ref)
        if name not in self.def_decoders:
            self.def_decoders[name] = None  # a placeholder ends recursion
            self.defs[name], self.def_decoders[name] = self.convert(target, f"$defs/{name}")
        decoders = self.def_decoders

        def decode(value: Any) -> Any:
            inner = decoders[name]
            return inner(value) if inner is not None else value

        return {"$ref": f"#/$defs/{name}"}, decode

    def convert(self, node: Any, path: str) -> tuple[dict[str, Any], Decoder | None]:
        if node is True or not isinstance(node, Mapping):
            return self.encode({}, path)
        node = dict(node)
        all_of = node.pop("allOf", None)
        if all_of is not None:
            if len(all_of) != 1:
                return self.encode(node, path)
            node = {**all_of[0], **node}
        while "$ref" in node:
            # Strict mode refuses keywords beside a $ref: inline the target instead.
            if not _KEEP & node.keys():
                return self.ref(node["$ref"])
            _, target = self.resolve(node.pop("$ref"))
            node = {**target, **node}
        if "oneOf" in node:
            node["anyOf"] = node.pop("oneOf")
        if "anyOf" in node:
            return self.union(node, path)
        if _is_free_form(node):
            return self.encode(node, path)
        kind = _base_type(node)
        if kind == "object":
            return self.object(node, path)
        if kind == "array":
            return self.array(node, path)
        return self.scalar(node), None

    def scalar(self, node: Mapping[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in node.items() if k in _KEEP}
        if "type" in node:
            out["type"] = node["type"]
        if node.get("format") in _FORMATS:
            out["format"] = node["format"]
        return out

    def encode(self, node: Mapping[str, Any], path: str) -> tuple[dict[str, Any], Decoder]:
        self.encoded.append("/" + path)
        description = (
            f"{node['description']} ({_ENCODED_NOTE})" if node.get("description") else _ENCODED_NOTE
        )
        kind: str | list[str] = ["string", "null"] if _allows_null(node) else "string"
        return {"type": kind, "description": description}, _decode_json_text

    def object(self, node: Mapping[str, Any], path: str) -> tuple[dict[str, Any], Decoder | None]:
        required = set(node.get("required", ()))
        properties: dict[str, Any] = {}
        decoders: dict[str, Decoder] = {}
        optional: set[str] = set()
        for name, sub in node["properties"].items():
            converted, decoder = self.convert(sub, f"{path}/{name}" if path else name)
            if name not in required and not _allows_null(converted):
                converted, optional = _nullable(converted), optional | {name}
            properties[name] = converted
            if decoder is not None:
                decoders[name] = decoder
        out = self.scalar(node) | {
            "type": node["type"],
            "properties": properties,
            "required": list(properties),
            "additionalProperties": False,
        }
        if not decoders and not optional:
            return out, None

        def decode(value: Any) -> Any:
            if not isinstance(value, dict):
                return value
            return {
                key: decoders[key](item) if key in decoders and item is not None else item
                for key, item in value.items()
                if not (item is None and key in optional)
            }

        return out, decode

    def array(self, node: Mapping[str, Any], path: str) -> tuple[dict[str, Any], Decoder | None]:
        if "prefixItems" in node:
            return self.encode(node, path)
        items, decoder = self.convert(node.get("items", {}), f"{path}/*" if path else "*")
        out = self.scalar(node) | {"items": items}
        if decoder is None:
            return out, None
        item_decoder = decoder

        def decode(value: Any) -> Any:
            if not isinstance(value, list):
                return value
            return [item_decoder(v) if v is not None else v for v in value]

        return out, decode

    def union(self, node: Mapping[str, Any], path: str) -> tuple[dict[str, Any], Decoder | None]:
        branches = [self.convert(b, path) for b in node["anyOf"]]
        out: dict[str, Any] = {"anyOf": [b for b, _ in branches]}
        if node.get("description"):
            out["description"] = node["description"]
        if all(d is None for _, d in branches):
            return out, None
        # Plain branches are tried before JSON-text ones, so `str | dict[str, Any]` keeps a
        # string a string; an object goes to the first branch whose properties match its keys.
        ordered = sorted(branches, key=lambda b: b[1] is _decode_json_text)

        def decode(value: Any) -> Any:
            for schema, decoder in ordered:
                if self.accepts(schema, value):
                    return decoder(value) if decoder is not None else value
            return value

        return out, decode

    def accepts(self, schema: Mapping[str, Any], value: Any) -> bool:
        if "$ref" in schema:
            schema = self.defs.get(schema["$ref"].rsplit("/", 1)[-1], {})
        if "anyOf" in schema:
            return any(self.accepts(b, value) for b in schema["anyOf"])
        kinds = schema.get("type")
        allowed = {kinds} if isinstance(kinds, str) else set(kinds or ())
        if not allowed & _json_types(value):
            return False
        if isinstance(value, dict) and "properties" in schema:
            return set(schema["properties"]) == set(value)
        return True


def _inside_value(inner: Decoder) -> Decoder:
    def decode(reply: Any) -> Any:
        if isinstance(reply, dict) and reply.get("value") is not None:
            return {**reply, "value": inner(reply["value"])}
        return reply

    return decode


def strict_schema(model_or_schema: type[BaseModel] | Mapping[str, Any]) -> StrictSchema:
    """Make a pydantic model's (or a raw) JSON Schema acceptable to strict structured output.

    Every object gets ``additionalProperties: false`` and lists all its properties as
    required (optional ones become nullable; ``decode`` drops their ``null`` so defaults
    apply). ``$defs`` are kept (``definitions`` moved there); a ``$ref`` with sibling
    keywords and a one-element ``allOf`` are inlined; ``oneOf`` becomes ``anyOf``.
    Keywords strict mode rejects (``default``, ``title``, ``minLength``, unsupported
    ``format`` values, ...) are dropped; local validation against the original still
    enforces them.

    Free-form values (``dict[str, Any]``, ``{"type": "object"}`` without properties,
    ``Any``) cannot be expressed in strict mode. They are sent as **strings holding JSON
    text** and parsed back by ``decode``, so the rest of the schema keeps strict's
    guarantees. A non-object root is wrapped as ``{"value": ...}``.
    """
    if isinstance(model_or_schema, type) and issubclass(model_or_schema, BaseModel):
        source: Mapping[str, Any] = model_or_schema.model_json_schema()
    elif isinstance(model_or_schema, Mapping):
        source = model_or_schema
    else:
        raise UsageError(f"strict_schema needs a pydantic model or a dict, got {model_or_schema!r}")
    work = _Strictifier(source)
    schema, decoder = work.convert(source, "")
    if "$ref" in schema:
        schema = dict(work.defs[schema["$ref"].rsplit("/", 1)[-1]])
    wrapped = _base_type(schema) != "object" or "properties" not in schema
    if wrapped:
        schema = {
            "type": "object",
            "properties": {"value": schema},
            "required": ["value"],
            "additionalProperties": False,
        }
        decoder = None if decoder is None else _inside_value(decoder)
    if work.defs:
        schema = {**schema, "$defs": work.defs}
    return StrictSchema(schema, tuple(work.encoded), wrapped, decoder)


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------

_KEY_PATTERN = re.compile(r"\bsk-[A-Za-z0-9_\-*]{6,}")


def _redact(text: str, secrets: Sequence[str] = ()) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[redacted]")
    return _KEY_PATTERN.sub("sk-[redacted]", text)


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
    detail = _redact(str(body.get("message") or exc.message), secrets)
    message = f"HTTP {status}{f' ({code})' if code else ''} from the model API: {detail}"
    retry_after = retry_after_seconds(exc.response.headers)
    if code in ("context_length_exceeded", "insufficient_quota"):
        return PermanentError(message)
    if status == 429:
        return RateLimited(message, retry_after=retry_after)
    if status in (408, 409) or status >= 500:
        return TransientError(message, retry_after=retry_after)
    return PermanentError(message)


def translate_error(exc: BaseException, *, secrets: Sequence[str] = ()) -> WorkerError:
    """Map an exception met while calling the API to planrun's error classes.

    Timeouts, connection errors, 408, 409, 429 and 5xx -> :class:`TransientError`
    (:class:`RateLimited` for 429, with ``retry_after`` from the headers); everything
    else -> :class:`PermanentError`, including a 429 ``insufficient_quota`` and a 400
    ``context_length_exceeded``. planrun's own errors pass through. ``secrets`` (and
    anything shaped like an OpenAI key) are redacted from the message.
    The caller raises the result ``from exc``.
    """
    if isinstance(exc, WorkerError):
        return exc
    if isinstance(exc, openai.APITimeoutError | asyncio.TimeoutError | TimeoutError):
        return TransientError("the model API request timed out")
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


def _prompt_header(name: str | None, prompt_hash: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.\-]", "_", name or "")[:64]
    return f"{safe}:{prompt_hash}"


def _rejects_json_schema(exc: BaseException | None) -> bool:
    if not isinstance(exc, openai.BadRequestError):
        return False
    text = f"{exc.param or ''} {exc.message}".lower()
    return "response_format" in text or "json_schema" in text


# ---------------------------------------------------------------------------------------------
# Retry policy
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """How transient errors are retried: ``attempts`` requests at most, exponential backoff.

    The n-th retry waits ``min(cap, base * 2**(n-1))``, of which the fraction ``jitter``
    is random (0: exact; 0.5: between half and all of it), and never less than the
    server's ``Retry-After``. A server asking for more than ``max_retry_after`` seconds
    ends the retries at once: the error (with its ``retry_after``) goes to the caller,
    whose scheduler is better placed to wait that long.
    """

    attempts: int = 4
    base: float = 0.5
    cap: float = 30.0
    jitter: float = 0.5
    max_retry_after: float = 120.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise UsageError(f"RetryPolicy.attempts must be >= 1, got {self.attempts}")
        if not 0 <= self.jitter <= 1:
            raise UsageError(f"RetryPolicy.jitter must be in [0, 1], got {self.jitter}")

    @classmethod
    def of(cls, retry: int | RetryPolicy) -> RetryPolicy:
        """Normalise a number of attempts or a policy."""
        return retry if isinstance(retry, RetryPolicy) else cls(attempts=retry)

    def backoff(self, retry_number: int, rng: random.Random | None = None) -> float:
        """Wait before retry ``retry_number`` (1 for the first retry), with jitter."""
        full = min(self.cap, self.base * 2.0 ** (retry_number - 1))
        draw = rng.random() if rng is not None else random.random()
        return full * (1.0 - self.jitter * draw)

    def delay(
        self, retry_number: int, retry_after: float | None, rng: random.Random | None = None
    ) -> float:
        """The wait: backoff, but never shorter than ``retry_after``."""
        return max(self.backoff(retry_number, rng), retry_after or 0.0)


# ---------------------------------------------------------------------------------------------
# The client
# ---------------------------------------------------------------------------------------------


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

    @classmethod
    def of(cls, result: type[BaseModel] | Mapping[str, Any], name: str | None) -> _Target:
        if isinstance(result, type) and issubclass(result, BaseModel):
            return cls(
                _schema_name(name or result.__name__),
                strict_schema(result),
                result.model_json_schema(),
                result,
            )
        if isinstance(result, Mapping):
            return cls(
                _schema_name(name or str(result.get("title") or "result")),
                strict_schema(result),
                result,
                None,
            )
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

    def json_mode_instructions(self) -> str:
        schema = self.original
        if self.strict.wrapped:
            schema = {"type": "object", "properties": {"value": schema}, "required": ["value"]}
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
    max_tokens: int | None
    temperature: float | None
    validate: bool
    attempts: int = 0
    fell_back: bool = False
    prompt_name: str | None = None


class Model:
    """An async chat model client: one policy for structure, retries, rate and usage.

    Configuration comes from the arguments; what is not given is read from the
    environment once, here: ``OPENAI_API_KEY``, ``OPENAI_BASE_URL`` and ``PLANRUN_MODEL``
    (default ``gpt-4o-mini``). Pass ``client=`` to use a ready ``openai.AsyncOpenAI``
    (its SDK retries are switched off all the same). A missing key raises
    :class:`~planrun.errors.ConfigError` now, before any task starts.

    ``meter`` is the default :class:`~planrun.usage.Usage` for calls that pass none;
    ``limiter`` a :class:`~planrun.limiter.RateLimiter` (one process) or a
    :class:`~planrun.limits.SharedRateLimiter` (every process of a run), awaited before
    every request (any :class:`~planrun.limits.Limiter`).
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        client: openai.AsyncOpenAI | None = None,
        timeout: float | None = 60.0,
        retry: int | RetryPolicy = 4,
        structured: Structured = "auto",
        limiter: Limiter | None = None,
        meter: Usage | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if structured not in ("auto", "json_schema", "json_mode"):
            raise UsageError(
                f"structured must be 'auto', 'json_schema' or 'json_mode', got {structured!r}"
            )
        self.model = model or os.environ.get("PLANRUN_MODEL") or DEFAULT_MODEL
        self._client = (
            client.with_options(max_retries=0)
            if client is not None
            else self._new_client(api_key, base_url, timeout)
        )
        self._secrets = tuple(
            s for s in (api_key, getattr(self._client, "api_key", None)) if isinstance(s, str) and s
        )
        self.timeout = timeout
        self.retry = RetryPolicy.of(retry)
        self.structured: Structured = structured
        self.limiter = limiter
        self.meter = meter if meter is not None else Usage()
        self.max_tokens = max_tokens
        self.temperature = temperature
        self._rng = rng or random.Random()
        self._json_schema_rejected = False
        self._strict_cache: dict[tuple[type[BaseModel], str | None], _Target] = {}

    @staticmethod
    def _new_client(
        api_key: str | None, base_url: str | None, timeout: float | None
    ) -> openai.AsyncOpenAI:
        key = api_key or os.environ.get("OPENAI_API_KEY")
        if not key:
            raise ConfigError(
                "OPENAI_API_KEY is not set: pass api_key= to Model or set the OPENAI_API_KEY "
                "environment variable"
            )
        url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        return openai.AsyncOpenAI(api_key=key, base_url=url, timeout=timeout, max_retries=0)

    def __repr__(self) -> str:
        return (
            f"Model(model={self.model!r}, base_url={str(self._client.base_url)!r}, "
            f"structured={self.structured!r})"
        )

    @property
    def base_url(self) -> str:
        """Where requests go."""
        return str(self._client.base_url)

    @property
    def json_schema_supported(self) -> bool:
        """False once the server has rejected ``json_schema`` and JSON mode is used instead."""
        return not self._json_schema_rejected

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self._client.close()

    async def __aenter__(self) -> Model:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @overload
    async def complete(
        self,
        messages: Messages,
        *,
        result_model: type[M],
        schema_name: str | None = None,
        prompt_hash: str | None = None,
        prompt_name: str | None = None,
        idempotency_key: str | None = None,
        meter: Usage | None = None,
        timeout: float | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        validate: Literal[True] = True,
    ) -> Completion[M]: ...

    @overload
    async def complete(
        self,
        messages: Messages,
        *,
        result_model: type[BaseModel] | Mapping[str, Any] | None = None,
        schema_name: str | None = None,
        prompt_hash: str | None = None,
        prompt_name: str | None = None,
        idempotency_key: str | None = None,
        meter: Usage | None = None,
        timeout: float | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        validate: bool = True,
    ) -> Completion[Any]: ...

    async def complete(
        self,
        messages: Messages,
        *,
        result_model: type[BaseModel] | Mapping[str, Any] | None = None,
        schema_name: str | None = None,
        prompt_hash: str | None = None,
        prompt_name: str | None = None,
        idempotency_key: str | None = None,
        meter: Usage | None = None,
        timeout: float | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        validate: bool = True,
    ) -> Completion[Any]:
        """Ask the model; return its reply, parsed and validated when a result is given.

        ``messages`` is a string (one user message), a :class:`RenderedPrompt` (whose hash
        becomes ``prompt_hash``) or chat messages. ``result_model`` is a pydantic model
        (``parsed`` is an instance) or a JSON Schema dict (``parsed`` is the JSON).
        ``validate=False`` skips local validation: ``parsed`` is the decoded JSON, or None
        when the reply is not JSON; the caller checks it (a repair loop wants the text).
        ``prompt_name`` (default: a :class:`RenderedPrompt`'s name) and ``prompt_hash`` are
        sent as the ``X-Planrun-Prompt: <name>:<hash>`` request header, which the API
        ignores and :mod:`planrun.fixtures` stores, so a stale recording can name the
        template that changed.

        Every request is recorded on ``meter`` (default: the Model's) under its keys.
        Raises :class:`TransientError`/:class:`RateLimited` once retries are spent,
        :class:`PermanentError` for a rejected request or a reply that fails validation,
        :class:`ModelRefused` for a refusal, a ``length`` or ``content_filter`` stop, and
        :class:`BudgetExceeded` before a request the budget cannot afford.
        """
        if isinstance(messages, RenderedPrompt):
            prompt_hash = prompt_hash or messages.hash
            prompt_name = prompt_name or messages.name
        call = _Call(
            _chat(messages),
            self._target(result_model, schema_name),
            prompt_hash,
            idempotency_key,
            meter if meter is not None else self.meter,
            self.timeout if timeout is None else timeout,
            max_tokens or self.max_tokens,
            self.temperature if temperature is None else temperature,
            validate,
            prompt_name=prompt_name,
        )
        retrying = AsyncRetrying(
            stop=self._stop,
            wait=self._wait,
            retry=retry_if_exception_type(TransientError),
            sleep=_sleep,
            before_sleep=self._log_retry,
            reraise=True,
        )
        return await retrying(self._attempt, call)

    def _target(
        self, result: type[BaseModel] | Mapping[str, Any] | None, name: str | None
    ) -> _Target | None:
        if result is None:
            return None
        if isinstance(result, type) and issubclass(result, BaseModel):
            if (result, name) not in self._strict_cache:
                self._strict_cache[result, name] = _Target.of(result, name)
            return self._strict_cache[result, name]
        return _Target.of(result, name)

    def _mode(self, call: _Call) -> Mode:
        if call.target is None:
            return "text"
        if self.structured == "json_mode" or (
            self.structured == "auto" and self._json_schema_rejected
        ):
            return "json_mode"
        return "json_schema"

    async def _attempt(self, call: _Call) -> Completion[Any]:
        mode = self._mode(call)
        try:
            return await self._request(call, mode)
        except PermanentError as exc:
            fallback = mode == "json_schema" and self.structured == "auto"
            if not (fallback and _rejects_json_schema(exc.__cause__)):
                raise
            self._json_schema_rejected = call.fell_back = True
            log.warning(
                "the model API at %s rejected a json_schema response_format (%s); using JSON "
                "mode with local validation from now on",
                self.base_url,
                exc,
            )
            return await self._request(call, "json_mode")

    def _params(self, call: _Call, mode: Mode) -> dict[str, Any]:
        params: dict[str, Any] = {"model": self.model, "messages": call.messages}
        if call.target is not None and mode == "json_schema":
            params["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": call.target.name,
                    "strict": True,
                    "schema": call.target.strict.schema,
                },
            }
        elif call.target is not None:
            instructions = {"role": "system", "content": call.target.json_mode_instructions()}
            params["messages"] = [instructions, *call.messages]
            params["response_format"] = {"type": "json_object"}
        if call.max_tokens is not None:
            params["max_completion_tokens"] = call.max_tokens
        if call.temperature is not None:
            params["temperature"] = call.temperature
        headers: dict[str, str] = {}
        if call.idempotency_key:
            headers["Idempotency-Key"] = call.idempotency_key
        if call.prompt_hash:
            headers[PROMPT_HEADER] = _prompt_header(call.prompt_name, call.prompt_hash)
        if headers:
            params["extra_headers"] = headers
        if call.timeout is not None:
            params["timeout"] = call.timeout
        return params

    async def _request(self, call: _Call, mode: Mode) -> Completion[Any]:
        params = self._params(call, mode)
        response_format = params.get("response_format")
        schema_text = json.dumps(response_format) if response_format else ""
        prompt_estimate = estimate_tokens(params["messages"], extra_text=schema_text)
        completion_estimate = call.max_tokens or DEFAULT_COMPLETION_ESTIMATE
        estimate = prompt_estimate + completion_estimate
        reservation = await call.meter.areserve(self.model, prompt_estimate, completion_estimate)
        try:
            if self.limiter is not None:
                await self.limiter.acquire(estimate)
            reply = await self._send(call, params, estimate, reservation)
            record = self._record(call, reply)
            reservation.used(record)
            if self.limiter is not None:
                await _settled(self.limiter.reconcile(estimate, record.total_tokens))
            return self._finish(call, mode, reply, record)
        finally:
            await reservation.aclose()

    async def _send(
        self, call: _Call, params: dict[str, Any], estimate: int, reservation: Reservation
    ) -> Any:
        call.attempts += 1
        try:
            create = self._client.chat.completions.create(**params)
            return await asyncio.wait_for(create, call.timeout)
        except (openai.OpenAIError, asyncio.TimeoutError) as exc:
            own = _own_error(exc)
            if own is not None:
                if self.limiter is not None:
                    await _settled(self.limiter.reconcile(estimate, 0))
                # A planrun error raised beneath the SDK (a fixture miss in a replaying
                # transport) is not a connection problem: never retried, never translated.
                raise own from None
            error = translate_error(exc, secrets=self._secrets)
            reservation.used(call.meter.record(self.model, prompt_hash=call.prompt_hash,
                                               error=type(error).__name__))
            if self.limiter is not None:
                await _settled(self.limiter.reconcile(estimate, 0))
                if isinstance(error, RateLimited):
                    await _settled(self.limiter.penalize(error.retry_after or self.retry.base))
            raise error from exc

    def _record(self, call: _Call, reply: Any) -> UsageRecord:
        usage = reply.usage
        details = getattr(usage, "prompt_tokens_details", None)
        return call.meter.record(
            reply.model or self.model,
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
            cached_tokens=(details.cached_tokens or 0) if details else 0,
            prompt_hash=call.prompt_hash,
            request_id=getattr(reply, "_request_id", None),
        )

    def _finish(
        self, call: _Call, mode: Mode, reply: Any, record: UsageRecord
    ) -> Completion[Any]:
        request_id = record.request_id
        if not reply.choices:
            raise PermanentError("the model API returned no choices")
        choice = reply.choices[0]
        text = choice.message.content or ""
        _check_refusal(choice.message.refusal, choice.finish_reason)
        parsed = self._parse(call, mode, text)
        return Completion(
            parsed,
            text,
            record,
            reply.model,
            choice.finish_reason,
            request_id,
            call.prompt_hash,
            mode,
            call.fell_back,
            call.attempts,
        )

    def _parse(self, call: _Call, mode: Mode, text: str) -> Any:
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

    def _stop(self, state: RetryCallState) -> bool:
        if state.attempt_number >= self.retry.attempts:
            return True
        retry_after = _retry_after(state)
        return retry_after is not None and retry_after > self.retry.max_retry_after

    def _wait(self, state: RetryCallState) -> float:
        return self.retry.delay(state.attempt_number, _retry_after(state), self._rng)

    def _log_retry(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        wait = state.next_action.sleep if state.next_action else 0.0
        log.info(
            "model call attempt %d failed (%s); retrying in %.3f s",
            state.attempt_number,
            error,
            wait,
        )


def _retry_after(state: RetryCallState) -> float | None:
    error = state.outcome.exception() if state.outcome else None
    return error.retry_after if isinstance(error, TransientError) else None


def _check_refusal(refusal: str | None, finish_reason: str) -> None:
    if refusal:
        raise ModelRefused(f"the model refused: {refusal}")
    if finish_reason == "length":
        raise ModelRefused(
            "the reply was cut off at the token limit (finish_reason='length'); "
            "raise max_tokens or shorten the input"
        )
    if finish_reason == "content_filter":
        raise ModelRefused(
            "the reply was withheld by the content filter (finish_reason='content_filter')"
        )


async def _settled(outcome: Any) -> None:
    """Await what a limiter's ``reconcile``/``penalize`` returned, when it is awaitable."""
    if inspect.isawaitable(outcome):
        await outcome


async def _sleep(seconds: float) -> None:
    # Looked up at call time, so a virtual loop (or a patched asyncio.sleep) governs it.
    await asyncio.sleep(seconds)
