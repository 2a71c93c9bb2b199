"""The client: :class:`Model`, one policy for structure, retries, rate and usage."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Literal, overload

from pydantic import BaseModel
from tenacity import AsyncRetrying, retry_if_exception_type

from planrun.core import (
    TaskContext,
    TransientError,
)
from planrun.model._batch import Batcher
from planrun.model._client_setup import (
    DEFAULT_COMPLETION_ESTIMATE,
    DEFAULT_MODEL,
    DEFAULT_TIMEOUT,
    PROMPT_HEADER,
    Api,
    Completion,
    M,
    Messages,
    Mode,
    SchemaMode,
    Structured,
    _Call,
    _chat,
    _sleep,
)
from planrun.model._client_wire import _ModelWire
from planrun.model._prompts import RenderedPrompt
from planrun.model._schema import (
    check_max_tokens,
)
from planrun.model._usage import Usage
from planrun.obs import tracing

__all__ = [
    "DEFAULT_COMPLETION_ESTIMATE",
    "DEFAULT_MODEL",
    "DEFAULT_TIMEOUT",
    "PROMPT_HEADER",
    "Api",
    "Completion",
    "Messages",
    "Mode",
    "Model",
    "SchemaMode",
    "Structured",
]


class Model(_ModelWire):
    """An async chat model client: one policy for structure, retries, rate and usage.

    Configuration comes from the arguments; what is not given is read from the
    environment once, here: ``OPENAI_API_KEY``, ``OPENAI_BASE_URL``, ``PLANRUN_MODEL``
    (default ``gpt-4o-mini``), ``PLANRUN_TIMEOUT`` (seconds, default 60),
    ``PLANRUN_STRUCTURED``, ``PLANRUN_SCHEMA``, ``PLANRUN_COMPAT`` and ``PLANRUN_API``.
    Pass ``client=`` to use a ready ``openai.AsyncOpenAI`` (its SDK retries are switched
    off all the same). A missing key
    raises :class:`~planrun.core.ConfigError` now, before any task starts.

    Args:
        structured: how a result schema is asked for. ``"strict"`` (alias
            ``"json_schema"``): strict structured output, and a server that rejects it fails
            the call. ``"json_object"`` (alias ``"json_mode"``): JSON mode, with the schema
            in a system message and in ``response_format.schema`` (where llama-cpp-python
            and others enforce it). ``"auto"`` (default): strict, falling back to JSON mode
            *for that schema* when the server rejects it (OpenAI, vLLM, Ollama, llama.cpp and
            llama-cpp-python rejections are recognised; see :func:`rejects_schema`), and to
            JSON mode with the schema in the prompt only when even ``response_format.schema``
            is refused. Every reply is validated locally against the full schema.
        schema: ``"full"`` (default) sends the schema's validation keywords;
            ``"portable"`` strips :data:`VALIDATION_KEYWORDS` (``minItems``, ``pattern``,
            ``format``, ...) from what is sent, for models that reject them, and enforces
            them locally all the same.
        timeout: seconds one request may take (``None``: no limit); default
            ``$PLANRUN_TIMEOUT``, else :data:`DEFAULT_TIMEOUT`. A slow local model may need
            more; a request that runs out is transient (retried), and its error says how to
            raise the limit.
        compat: also send ``max_tokens`` beside ``max_completion_tokens`` (Ollama and
            llama-cpp-python read only the former). OpenAI's reasoning models reject it,
            so it is off by default.
        api: ``"chat"`` (default) for Chat Completions, ``"responses"`` for the Responses API
            (structured output through ``text.format``; same retries, fallback, limiter and
            usage).
        meter: the default :class:`~planrun.model.Usage` for calls that pass none.
        limiter: a :class:`~planrun.model.RateLimiter` (one process) or a
            :class:`~planrun.model.SharedRateLimiter` (every process of a run), awaited
            before every request (any :class:`~planrun.model.Limiter`).

    **Loops and threads.** One ``Model`` serves any number of calls from any event loops and
    threads: it keeps one SDK client per event loop, created on the loop's first call and
    closed when that loop shuts down. Each synchronous entry point (:func:`planrun.decompose`,
    :func:`planrun.plan_and_run`, a notebook cell) runs on a loop of its own, and an HTTP/1.1
    connection pool belongs to the loop that opened it, so sharing one pool across loops
    breaks ("Event loop is closed"). A single long-lived loop thread behind the sync API was
    the alternative; it was not chosen because waits (backoff, ``Retry-After``, the rate
    limiter, timeouts) must run on the caller's loop, where a
    :class:`~planrun.runtime.VirtualClock` can skip them, and a request in flight on another
    thread would be invisible to that clock. A given ``client=`` serves the first loop that
    uses it; other loops get a copy of it (same key, address, headers, timeout) with a fresh
    connection pool.
    """

    def batched(self, batcher: Batcher) -> Model:
        """This model sending its calls through ``batcher`` (the Batch API, at batch
        prices): same client, limiter, meter and settings. Calls a batch cannot serve in
        time go live as usual."""
        twin = copy.copy(self)
        twin._batcher = batcher
        return twin

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
        task: TaskContext | None = None,
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
        task: TaskContext | None = None,
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
        task: TaskContext | None = None,
    ) -> Completion[Any]:
        """Ask the model; return its reply, parsed and validated when a result is given.

        ``messages`` is a string (one user message), a :class:`RenderedPrompt` (whose hash
        becomes ``prompt_hash``) or chat messages. ``result_model`` is a pydantic model
        (``parsed`` is an instance) or a JSON Schema dict (``parsed`` is the JSON).
        ``validate=False`` skips local validation: ``parsed`` is the decoded JSON, or None
        when the reply is not JSON; the caller checks it (a repair loop wants the text).
        ``prompt_name`` (default: a :class:`RenderedPrompt`'s name) and ``prompt_hash`` are
        sent as the ``X-Planrun-Prompt: <name>:<hash>`` request header, which the API
        ignores and :mod:`planrun.dev.fixtures` stores, so a stale recording can name the
        template that changed. ``task`` is the attempt the call is for (a handler's
        ``ctx``): in batch mode (:meth:`batched`) its lease is renewed while the call waits
        in a batch and the run's ledger records the batch under its id.

        Every request is recorded on ``meter`` (default: the Model's) under its keys.
        Raises :class:`TransientError`/:class:`RateLimited` once retries are spent,
        :class:`PermanentError` for a rejected request or a reply that fails validation,
        :class:`ModelRefused` for a refusal, a ``length`` or ``content_filter`` stop, and
        :class:`BudgetExceeded` before a request the budget cannot afford.
        """
        if isinstance(messages, RenderedPrompt):
            prompt_hash = prompt_hash or messages.hash
            prompt_name = prompt_name or messages.name
        check_max_tokens(max_tokens, "Model.complete")
        target = self._target(result_model, schema_name)
        bound = max_tokens or self.max_tokens or (
            target.bound if target is not None else DEFAULT_COMPLETION_ESTIMATE)
        call = _Call(_chat(messages), target, prompt_hash, idempotency_key,
                     meter if meter is not None else self.meter,
                     self.timeout if timeout is None else timeout, bound,
                     self.temperature if temperature is None else temperature, validate,
                     prompt_name=prompt_name, task=task)
        call.level = self._level(call)
        retrying = AsyncRetrying(stop=self._stop, wait=self._wait, sleep=_sleep,
                                 retry=retry_if_exception_type(TransientError),
                                 before_sleep=self._log_retry, reraise=True)
        with tracing.model_call(self.model, call.messages, base_url=self.base_url,
                                secrets=self._secrets, max_tokens=call.max_tokens,
                                temperature=call.temperature,
                                structured=call.target is not None) as traced:
            return traced.done(await retrying(self._attempt, call))
