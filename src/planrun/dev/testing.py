"""Test doubles that ship with planrun: a fake OpenAI endpoint and an in-memory store.

:class:`InMemoryStore` is the SQL store over SQLite in memory, recording every statement.

:class:`FakeOpenAI` answers ``POST /chat/completions`` the way the OpenAI API does (ids,
``usage`` with token details, ``x-request-id`` and rate-limit headers, error bodies), with
content produced by *answerers*: per schema name (``classify_ticket``, ``plan``, ...) a
function from the request to the JSON the model should return, falling back to an instance
synthesised from the response schema. Everything is deterministic: the same request gets
the same reply, id and token counts, so two runs produce identical ledgers.

It takes an ``httpx2.Request`` and returns an ``httpx2.Response`` (httpx2 is the HTTP stack
the ``openai`` SDK sends through): :func:`~planrun.testing.answered_by` serves it to every
request made in a block, and the stand-in HTTP server that synthesises the project's
fixtures (``tools/standin.py``) serves it over HTTP::

    fake = FakeOpenAI(answers={"classify_ticket": lambda req: {...}})
    with answered_by(fake):
        report = plan_and_run(goal, app, model=Model(api_key="sk-test"))
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx2

from planrun.dev._batch_api import LATE_HEADER, FakeBatchAPI, json_object
from planrun.stores.memory import InMemoryStore

__all__ = ["LATE_HEADER", "ChatRequest", "FakeBatchAPI", "FakeOpenAI", "InMemoryStore", "Scripted",
           "error_body", "json_object", "synthesize"]

CREATED = 1_764_460_800  # 2025-11-30T00:00:00Z: fixed, so replies are reproducible


@dataclass(frozen=True)
class ChatRequest:
    """The parts of a request an answerer looks at (Chat Completions or Responses)."""

    body: Mapping[str, Any]

    @property
    def model(self) -> str:
        return str(self.body.get("model", ""))

    @property
    def is_responses(self) -> bool:
        """True for a Responses API request (``input`` instead of ``messages``)."""
        return "input" in self.body and "messages" not in self.body

    @property
    def messages(self) -> list[Mapping[str, Any]]:
        if self.is_responses:
            given = self.body.get("input")
            if isinstance(given, str):
                return [{"role": "user", "content": given}]
            return list(given or [])
        return list(self.body.get("messages") or [])

    @property
    def prompt(self) -> str:
        """The first user message's text (the rendered prompt)."""
        for m in self.messages:
            if m.get("role") == "user" and isinstance(m.get("content"), str):
                return str(m["content"])
        return ""

    @property
    def last_user(self) -> str:
        """The last user message's text (a repair request, when there is one)."""
        for m in reversed(self.messages):
            if m.get("role") == "user" and isinstance(m.get("content"), str):
                return str(m["content"])
        return ""

    @property
    def format(self) -> Mapping[str, Any]:
        """The requested output format: ``response_format``, or ``text.format`` (Responses)."""
        if self.is_responses:
            return dict((self.body.get("text") or {}).get("format") or {})
        return dict(self.body.get("response_format") or {})

    @property
    def format_type(self) -> str | None:
        """``json_schema``, ``json_object``, ``text`` or None."""
        kind = self.format.get("type")
        return str(kind) if kind else None

    @property
    def schema_name(self) -> str | None:
        fmt = self.format
        if fmt.get("type") == "json_schema":
            inner = fmt if self.is_responses else fmt.get("json_schema") or {}
            return str(inner.get("name"))
        schema = self.schema
        title = schema.get("title") if schema is not None else None
        return str(title) if title else None

    @property
    def schema(self) -> Mapping[str, Any] | None:
        """The response schema: sent as such, or (JSON mode) in the request or the prompt."""
        fmt = self.format
        if fmt.get("type") == "json_schema":
            inner = fmt if self.is_responses else fmt.get("json_schema") or {}
            schema: Mapping[str, Any] = inner.get("schema") or {}
            return schema
        if fmt.get("type") == "json_object":
            if isinstance(fmt.get("schema"), Mapping):
                return dict(fmt["schema"])
            return self._prompted_schema()
        return None

    def _prompted_schema(self) -> Mapping[str, Any] | None:
        marker = "JSON Schema:\n"
        for m in self.messages:
            text = m.get("content")
            if m.get("role") == "system" and isinstance(text, str) and marker in text:
                try:
                    found = json.loads(text.split(marker, 1)[1])
                except json.JSONDecodeError:
                    return None
                return found if isinstance(found, dict) else None
        return None

    @property
    def max_tokens(self) -> int | None:
        """The output cap a server that reads only ``max_tokens`` would apply."""
        value = self.body.get("max_tokens")
        return int(value) if isinstance(value, int) else None

    @property
    def repairs(self) -> int:
        """How many assistant turns the conversation holds (0 for a first request)."""
        return sum(1 for m in self.messages if m.get("role") == "assistant")


Answer = Callable[[ChatRequest], Any]
"""An answerer: the JSON value (or, for a string result, the text) the model replies with."""


def error_body(
    status: int,
    message: str,
    *,
    code: str | None = None,
    param: str | None = None,
    type: str | None = None,
) -> dict[str, Any]:
    """An OpenAI-style error body, typed and with the ``param`` the real API gives.

    A 429 says which limit was hit (``type`` ``"tokens"`` when the message names tokens
    per minute, else ``"requests"``; ``insufficient_quota`` for a spent quota), and a
    ``context_length_exceeded`` 400 names ``param: "messages"``, as the API does.
    """
    kind = type or {
        400: "invalid_request_error", 401: "invalid_request_error", 403: "permission_error",
        404: "invalid_request_error", 409: "conflict_error", 422: "invalid_request_error",
    }.get(status, "server_error")
    if status == 429 and type is None:
        if code == "insufficient_quota":
            kind = "insufficient_quota"
        else:
            kind = "tokens" if "tokens per min" in message.lower() else "requests"
    if param is None and code == "context_length_exceeded":
        param = "messages"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass
class Scripted:
    """A reply that is not a plain success: an HTTP error, a refusal, or a cut-off reply."""

    status: int = 200
    error: str = ""
    code: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    refusal: str | None = None
    finish_reason: str = "stop"
    content: str | None = None
    param: str | None = None


class FakeOpenAI:
    """A deterministic OpenAI chat endpoint; call it with an ``httpx2.Request``.

    Args:
        answers: schema name -> answerer (or a fixed value). Unnamed requests get an instance
            synthesised from their response schema (or ``"ok"`` without one).
        script: replies to serve first, in order, before any answerer (errors, refusals).
        model_suffix: appended to the requested model's name in replies (dated, as the API
            does).
        tiers: the ``service_tier`` values it serves as asked (the answer's ``service_tier``
            names them); any other request is served at ``default``.
        reject_tiers: ``service_tier`` values it rejects with the API's 400 naming
            ``service_tier`` (a server that does not sell the tier).
        count_schema: count the response format's schema in ``prompt_tokens``, as the
            API does (off: the counts the shipped cassettes were synthesized with).
    """

    def __init__(
        self,
        answers: Mapping[str, Answer | Any] | None = None,
        *,
        script: Sequence[Scripted] = (),
        model_suffix: str = "-2024-07-18",
        tiers: Collection[str] = ("flex", "priority"),
        reject_tiers: Collection[str] = (),
        count_schema: bool = False,
    ) -> None:
        self.count_schema = count_schema
        self.tiers = frozenset(tiers)
        self.reject_tiers = frozenset(reject_tiers)
        self.answers = dict(answers or {})
        self.script = list(script)
        self.model_suffix = model_suffix
        self.requests: list[ChatRequest] = []
        self.headers: list[Mapping[str, str]] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content or b"{}")
        chat = ChatRequest(body)
        self.requests.append(chat)
        self.headers.append(dict(request.headers))
        digest = hashlib.sha256(request.content or b"").hexdigest()
        headers = {
            "x-request-id": f"req_{digest[:24]}",
            "openai-processing-ms": "412",
            "x-ratelimit-limit-requests": "10000",
            "x-ratelimit-remaining-requests": "9999",
            "x-ratelimit-limit-tokens": "10000000",
            "x-ratelimit-remaining-tokens": "9990000",
            "x-ratelimit-reset-requests": "6ms",
            "x-ratelimit-reset-tokens": "0s",
        }
        asked = body.get("service_tier") if isinstance(body, dict) else None
        if asked is not None and asked in self.reject_tiers:
            error = error_body(400, f"Invalid value for 'service_tier': {asked!r} is not "
                               f"available for this model.", code="invalid_value",
                               param="service_tier")
            return httpx2.Response(400, json=error, headers=headers)
        scripted = self.script.pop(0) if self.script else None
        if scripted is not None and scripted.status != 200:
            headers.update(scripted.headers)
            body = error_body(scripted.status, scripted.error or "error", code=scripted.code,
                              param=scripted.param)
            return httpx2.Response(scripted.status, json=body, headers=headers)
        if request.url.path.endswith("/responses"):
            reply = self.response(chat, digest, scripted)
        else:
            reply = self.completion(chat, digest, scripted)
        return httpx2.Response(200, json=reply, headers=headers)

    def served_tier(self, chat: ChatRequest) -> str:
        """The tier that serves ``chat``: the one it asks for when served (:attr:`tiers`),
        else ``default``."""
        asked = chat.body.get("service_tier")
        return str(asked) if asked in self.tiers else "default"

    def content_for(self, chat: ChatRequest) -> str:
        """The text the fake model answers ``chat`` with."""
        name = chat.schema_name
        if name is not None and name in self.answers:
            answer = self.answers[name]
            value = answer(chat) if callable(answer) else answer
        elif chat.schema is not None:
            value = synthesize(chat.schema)
        elif chat.format_type == "json_object":
            value = self.answers.get("json_object", {"ok": True})
            value = value(chat) if callable(value) else value
        else:
            value = self.answers.get("text", "ok")
            value = value(chat) if callable(value) else value
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)

    def completion(
        self, chat: ChatRequest, digest: str, scripted: Scripted | None = None
    ) -> dict[str, Any]:
        """The chat.completion object for ``chat``."""
        refusal = scripted.refusal if scripted else None
        finish = scripted.finish_reason if scripted else "stop"
        if refusal is not None:
            content: str | None = None
        elif scripted is not None and scripted.content is not None:
            content = scripted.content
        else:
            content = self.content_for(chat)
        prompt_tokens, completion_tokens, cached = _token_counts(chat, content or refusal or "",
                                                            self.count_schema)
        return {
            "id": f"chatcmpl-{digest[:29]}",
            "object": "chat.completion",
            "created": CREATED,
            "model": f"{chat.model}{self.model_suffix}" if chat.model else "gpt-4o-mini",
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": refusal,
                            "annotations": []},
                "logprobs": None,
                "finish_reason": finish,
            }],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                              "accepted_prediction_tokens": 0,
                                              "rejected_prediction_tokens": 0},
            },
            "service_tier": self.served_tier(chat),
            "system_fingerprint": "fp_" + digest[29:39],
        }


    def response(
        self, chat: ChatRequest, digest: str, scripted: Scripted | None = None
    ) -> dict[str, Any]:
        """The Responses API ``response`` object for ``chat``."""
        refusal = scripted.refusal if scripted else None
        finish = scripted.finish_reason if scripted else "stop"
        if refusal is not None:
            part: dict[str, Any] = {"type": "refusal", "refusal": refusal}
            text = refusal
        else:
            text = (scripted.content if scripted is not None and scripted.content is not None
                    else self.content_for(chat))
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        prompt_tokens, output_tokens, cached = _token_counts(chat, text, self.count_schema)
        incomplete = {"length": "max_output_tokens", "content_filter": "content_filter"}.get(finish)
        model = f"{chat.model}{self.model_suffix}" if chat.model else "gpt-4o-mini"
        return {
            "id": f"resp_{digest[:48]}",
            "object": "response",
            "created_at": CREATED,
            "status": "incomplete" if incomplete else "completed",
            "error": None,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "instructions": None,
            "max_output_tokens": chat.body.get("max_output_tokens"),
            "model": model,
            "output": [{
                "type": "message",
                "id": f"msg_{digest[:48]}",
                "status": "incomplete" if incomplete else "completed",
                "role": "assistant",
                "content": [part],
            }],
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "service_tier": self.served_tier(chat),
            "store": bool(chat.body.get("store", True)),
            "temperature": chat.body.get("temperature", 1.0),
            "text": {"format": dict(chat.format) or {"type": "text"}},
            "tool_choice": "auto",
            "tools": [],
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": {
                "input_tokens": prompt_tokens,
                "input_tokens_details": {"cached_tokens": cached},
                "output_tokens": output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt_tokens + output_tokens,
            },
            "user": None,
            "metadata": {},
        }


CACHE_MIN_TOKENS = 1024
"""Prompts shorter than this are never cached (as on the OpenAI API)."""
CACHE_STEP = 128
"""Cached prefixes grow in steps of this many tokens beyond the minimum."""


def cached_tokens_for(prompt_tokens: int) -> int:
    """The cached part of a prompt the way the API reports it: 0 below 1,024 tokens, then
    1,024 plus whole steps of 128 (here: about half of the rest is a cache hit)."""
    if prompt_tokens < CACHE_MIN_TOKENS:
        return 0
    steps = (prompt_tokens - CACHE_MIN_TOKENS) // (2 * CACHE_STEP)
    return CACHE_MIN_TOKENS + CACHE_STEP * steps


def prompt_tokens_of(chat: ChatRequest, count_schema: bool = False) -> int:
    """The prompt tokens the fake reports for a request: deterministic, from its length;
    with ``count_schema`` the response format's schema too, as the API counts it."""
    prompt_chars = sum(len(json.dumps(m.get("content", ""))) for m in chat.messages)
    fmt = chat.format
    if count_schema and fmt.get("type") not in (None, "text"):
        prompt_chars += len(json.dumps(fmt))
    return max(1, math.ceil(prompt_chars / 4)) + 7 * len(chat.messages)


def _token_counts(chat: ChatRequest, reply: str,
                  count_schema: bool = False) -> tuple[int, int, int]:
    """Prompt, completion and cached tokens: deterministic, from the text lengths."""
    prompt_tokens = prompt_tokens_of(chat, count_schema)
    completion_tokens = max(1, math.ceil(len(reply) / 4))
    return prompt_tokens, completion_tokens, cached_tokens_for(prompt_tokens)


def synthesize(schema: Mapping[str, Any], root: Mapping[str, Any] | None = None) -> Any:
    """A small valid instance of a JSON Schema (the subset structured output uses)."""
    root = root if root is not None else schema
    if "$ref" in schema:
        ref = str(schema["$ref"])
        node: Any = root
        for part in ref.lstrip("#/").split("/"):
            node = node[part]
        return synthesize(node, root)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            options = [o for o in schema[key] if o.get("type") != "null"] or schema[key]
            return synthesize(options[0], root)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props = schema.get("properties") or {}
        return {k: synthesize(v, root) for k, v in props.items()}
    if kind == "array":
        count = max(1, int(schema.get("minItems", 1)))
        return [synthesize(schema.get("items") or {}, root) for _ in range(count)]
    if kind == "string":
        if "JSON text" in str(schema.get("description", "")):
            return "{}"
        return "example"
    if kind == "integer":
        return int(schema.get("minimum", 0))
    if kind == "number":
        return float(schema.get("minimum", 0))
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    return {}
