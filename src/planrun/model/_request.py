"""A model call's request: what the reply must be, and the keyword arguments sent."""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import jsonschema  # type: ignore[import-untyped]
from pydantic import BaseModel, ValidationError

from planrun.core import PermanentError, TaskContext, UsageError
from planrun.model._prompts import RenderedPrompt
from planrun.model._schema import StrictSchema, output_bound, portable_schema, strict_schema
from planrun.model._usage import Usage, estimate_tokens

__all__ = ["PROMPT_HEADER", "Api", "Messages", "Requests", "SchemaMode", "Structured"]

PROMPT_HEADER = "X-Planrun-Prompt"
"""Request header naming the rendered prompt (``<name>:<hash>``); recorded by fixtures."""

Structured = Literal["auto", "strict", "json_object", "json_schema", "json_mode"]
"""How a result schema is asked for (``json_schema``/``json_mode`` are the older spellings)."""
SchemaMode = Literal["full", "portable"]
Api = Literal["chat", "responses"]
Messages = str | RenderedPrompt | Sequence[Mapping[str, Any]]

_STRUCTURED = ("auto", "strict", "json_object", "json_schema", "json_mode")
_SCHEMA = ("full", "portable")
_APIS = ("chat", "responses")


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


def chat_messages(messages: Messages) -> list[dict[str, Any]]:
    """``messages`` as chat messages (a string is one user message)."""
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
    """The attempt the call is for (batch mode renews its lease while the call waits; its
    ``tier`` says which tier the call goes at)."""
    prompt_cache_key: str | None = None
    """Sent as ``prompt_cache_key``: calls that share it share a prompt prefix."""


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


def _prompt_header(name: str | None, prompt_hash: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.\-]", "_", name or "")[:64]
    return f"{safe}:{prompt_hash}"


class Requests:
    """Builds a model's requests: how structure is asked for (and the fallback a server's
    rejection of a schema leads to, remembered per schema), and the keyword arguments of
    the SDK's ``create``.

    :meth:`params` is the one place the request's keyword arguments are built, for Chat
    Completions and the Responses API alike, live or in a batch line: a new request field
    (a service tier, a prompt cache key) is added there.

    Args:
        model: the model name sent.
        structured, schema, compat, api: as :class:`~planrun.model.Model` takes them (None:
            from ``PLANRUN_STRUCTURED``, ``PLANRUN_SCHEMA``, ``PLANRUN_COMPAT``,
            ``PLANRUN_API``, else the default).
    """

    def __init__(self, model: str, *, structured: Structured | None, schema: SchemaMode | None,
                 compat: bool | None, api: Api | None) -> None:
        self.model = model
        self.structured: Structured = _choice(
            "structured", structured, "PLANRUN_STRUCTURED", _STRUCTURED, "auto")
        self.schema: SchemaMode = _choice("schema", schema, "PLANRUN_SCHEMA", _SCHEMA, "full")
        self.api: Api = _choice("api", api, "PLANRUN_API", _APIS, "chat")
        self.compat = _flag(compat, "PLANRUN_COMPAT")
        self._lock = threading.Lock()
        self._fallback: dict[str, int] = {}
        self._strict_cache: dict[tuple[type[BaseModel], str | None], _Target] = {}

    @property
    def only_strict(self) -> bool:
        """A rejected schema fails the call (no fallback to JSON mode)."""
        return self.structured in ("strict", "json_schema")

    @property
    def fell_back(self) -> bool:
        """Some schema was rejected by the server and is asked for in JSON mode."""
        return bool(self._fallback)

    def target(self, result: type[BaseModel] | Mapping[str, Any] | None,
               name: str | None) -> _Target | None:
        """What the reply must be (a pydantic model's is made once)."""
        if result is None:
            return None
        if isinstance(result, type) and issubclass(result, BaseModel):
            if (result, name) not in self._strict_cache:
                self._strict_cache[result, name] = _Target.of(result, name)
            return self._strict_cache[result, name]
        return _Target.of(result, name)

    def level(self, call: _Call) -> int:
        """How structure is asked for at first (see :attr:`_Call.level`)."""
        if call.target is None or self.only_strict:
            return 0
        start = 1 if self.structured in ("json_object", "json_mode") else 0
        return max(start, self._fallback.get(call.target.key, 0))

    def fall_back(self, call: _Call) -> None:
        """The server rejected how ``call`` asked for structure: the next level, for this
        call and every later call of its schema."""
        assert call.target is not None
        call.level += 1
        call.fell_back = True
        with self._lock:
            key = call.target.key
            self._fallback[key] = max(self._fallback.get(key, 0), call.level)

    def params(self, call: _Call) -> dict[str, Any]:
        """The keyword arguments of the SDK's ``create`` for ``call`` at its level."""
        if self.api == "responses":
            params = self._responses_params(call)
        else:
            params = self._chat_params(call)
        if call.temperature is not None:
            params["temperature"] = call.temperature
        if call.prompt_cache_key:
            params["prompt_cache_key"] = call.prompt_cache_key
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

    @staticmethod
    def prompt_estimate(params: Mapping[str, Any]) -> int:
        """The high estimate of a request's prompt tokens (its messages and schema)."""
        shape = params.get("response_format") or params.get("text")
        schema_text = json.dumps(shape) if shape else ""
        chat = params["messages"] if "messages" in params else params["input"]
        return estimate_tokens(chat, extra_text=schema_text)

    def batch_url(self) -> str:
        """The endpoint a batch line of this model names."""
        return "/v1/responses" if self.api == "responses" else "/v1/chat/completions"

    def _messages(self, call: _Call) -> list[dict[str, Any]]:
        if call.target is None or call.level == 0:
            return call.messages
        instructions = call.target.json_mode_instructions(self.schema == "portable")
        return [{"role": "system", "content": instructions}, *call.messages]

    def _chat_params(self, call: _Call) -> dict[str, Any]:
        params: dict[str, Any] = {"model": self.model, "messages": self._messages(call)}
        portable = self.schema == "portable"
        target = call.target
        if target is not None and call.level == 0:
            params["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": target.name,
                    "strict": True,
                    "schema": target.sent_schema(portable),
                },
            }
        elif target is not None and call.level == 1:
            params["response_format"] = {
                "type": "json_object",
                "schema": target.json_mode_schema(portable),
            }
        elif target is not None:
            params["response_format"] = {"type": "json_object"}
        params["max_completion_tokens"] = call.max_tokens
        if self.compat:
            params["max_tokens"] = call.max_tokens
        return params

    def _responses_params(self, call: _Call) -> dict[str, Any]:
        params: dict[str, Any] = {"model": self.model, "input": self._messages(call)}
        target = call.target
        if target is not None and call.level == 0:
            params["text"] = {
                "format": {
                    "type": "json_schema",
                    "name": target.name,
                    "strict": True,
                    "schema": target.sent_schema(self.schema == "portable"),
                }
            }
        elif target is not None:
            params["text"] = {"format": {"type": "json_object"}}
        params["max_output_tokens"] = call.max_tokens
        params["store"] = False
        return params
