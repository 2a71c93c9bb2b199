"""The client: :class:`Model`, one policy for structure, retries, rate and usage.

A :class:`Model` holds its parts, each an object with its own state:

* :class:`~planrun.model._request.Requests`: how structure is asked for (and the fallback
  a rejected schema leads to) and the one place a request's keyword arguments are built;
* :class:`~planrun.model._transport.Transport`: the SDK client of each event loop, and the
  one place a request leaves;
* :mod:`planrun.model._reply`: what is read of an answer (``_Reply.of``, usage and how it
  was served) and the result made of it (:func:`completion_of`);
* :class:`~planrun.model._accounting.Accounting`: the budget's reservations, the rate
  limiter and the usage recorded on the meter.

The model itself keeps the call's settings and runs a call: its retries, its fallback,
live or in a batch.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

import openai
from pydantic import BaseModel
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from planrun.core import PermanentError, PlanrunError, TaskContext, TransientError
from planrun.core.scheduling import RetryPolicy
from planrun.model._accounting import Accounting
from planrun.model._batch import Batcher, TakenBack
from planrun.model._batch import parsed_line as _parsed_line
from planrun.model._errors import rejects_schema
from planrun.model._limits import Limiter
from planrun.model._prompts import RenderedPrompt
from planrun.model._reply import (
    Completion,
    Mode,
    _Reply,
    _SchemaRejected,
    completion_of,
    own_error,
    request_error,
)
from planrun.model._request import (
    PROMPT_HEADER,
    Api,
    Messages,
    Requests,
    SchemaMode,
    Structured,
    _Call,
    chat_messages,
)
from planrun.model._schema import check_max_tokens
from planrun.model._tiers import FLEX_TIMEOUT_S, Tiers, heartbeats, send_at_tier, tier_refusal
from planrun.model._transport import DEFAULT_TIMEOUT, UNSET, Transport, _Unset, request_timeout
from planrun.model._usage import Reservation, Usage
from planrun.obs import tracing

if TYPE_CHECKING:
    from planrun.core.scheduling import TierChoice

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

log = logging.getLogger("planrun.model")

DEFAULT_MODEL = "gpt-4o-mini"
DEFAULT_COMPLETION_ESTIMATE = 1024
"""The output bound of a call with no result schema and no ``max_tokens`` of its own or
of its Model (a structured call's bound is :func:`~planrun.model.output_bound` of its
schema). Every call sends its bound, and the budget and the limiter reserve it."""

M = TypeVar("M", bound=BaseModel)


class Model:
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
    closed when that loop shuts down (why: see :class:`~planrun.model._transport.Transport`).
    A given ``client=`` serves the first loop that uses it; other loops get a copy of it
    (same key, address, headers, timeout) with a fresh connection pool.
    """

    _batcher: Batcher | None = None
    """Set on the twin :meth:`batched` makes: its calls go to the Batch API."""

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
        self.model = model or os.environ.get("PLANRUN_MODEL") or DEFAULT_MODEL
        self._requests = Requests(self.model, structured=structured, schema=schema,
                                  compat=compat, api=api)
        self.timeout = request_timeout(timeout)
        self._transport = Transport(api_key=api_key, base_url=base_url, client=client,
                                    timeout=self.timeout,
                                    responses=self._requests.api == "responses")
        self._accounting = Accounting(self.model, limiter)
        self._tiers = Tiers()
        """The tiers the provider rejected for this model (sent no more)."""
        self.retry = RetryPolicy.of(retry)
        self.meter = meter if meter is not None else Usage()
        self.max_tokens = check_max_tokens(max_tokens, "Model")
        self.temperature = temperature
        self._rng = rng or random.Random()

    def __repr__(self) -> str:
        return (
            f"Model(model={self.model!r}, base_url={self.base_url!r}, "
            f"structured={self.structured!r})"
        )

    @property
    def structured(self) -> Structured:
        """How a result schema is asked for (see the class's arguments)."""
        return self._requests.structured

    @property
    def schema(self) -> SchemaMode:
        """``full`` or ``portable`` (see the class's arguments)."""
        return self._requests.schema

    @property
    def compat(self) -> bool:
        """Whether ``max_tokens`` is sent beside ``max_completion_tokens``."""
        return self._requests.compat

    @property
    def api(self) -> Api:
        """``chat`` or ``responses``."""
        return self._requests.api

    @property
    def limiter(self) -> Limiter | None:
        """The limiter awaited before every request, if any."""
        return self._accounting.limiter

    @limiter.setter
    def limiter(self, limiter: Limiter | None) -> None:
        self._accounting.limiter = limiter

    @property
    def base_url(self) -> str:
        """Where requests go."""
        return self._transport.base_url

    @property
    def json_schema_supported(self) -> bool:
        """False once the server has rejected a ``json_schema`` and JSON mode is used for it."""
        return not self._requests.fell_back

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

    async def aclose(self) -> None:
        """Close the HTTP client of the running loop (other loops close theirs at shutdown)."""
        await self._transport.aclose()

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
        prompt_cache_key: str | None = None,
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
        prompt_cache_key: str | None = None,
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
        prompt_cache_key: str | None = None,
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
        in a batch and the run's ledger records the batch under its id; its ``tier`` is sent
        as ``service_tier`` (:mod:`planrun.model._tiers`), and ``prompt_cache_key`` as such.

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
        target = self._requests.target(result_model, schema_name)
        bound = max_tokens or self.max_tokens or (
            target.bound if target is not None else DEFAULT_COMPLETION_ESTIMATE)
        call = _Call(chat_messages(messages), target, prompt_hash, idempotency_key,
                     meter if meter is not None else self.meter,
                     self.timeout if timeout is None else timeout, bound,
                     self.temperature if temperature is None else temperature, validate,
                     prompt_name=prompt_name, task=task, prompt_cache_key=prompt_cache_key)
        call.level = self._requests.level(call)
        retrying = _retrying(self.retry, self._rng)
        with tracing.model_call(self.model, call.messages, base_url=self.base_url,
                                secrets=self._transport.secrets, max_tokens=call.max_tokens,
                                temperature=call.temperature,
                                structured=call.target is not None) as traced:
            return traced.done(await retrying(self._attempt, call))

    async def _attempt(self, call: _Call) -> Completion[Any]:
        """One attempt of ``call``: a request, again in JSON mode while the server rejects
        how the schema was asked for (unless the model is ``strict``)."""
        while True:
            try:
                return await self._request(call)
            except _SchemaRejected as exc:
                if self._requests.only_strict or call.level >= 2:
                    raise PermanentError(str(exc)) from exc.__cause__
                self._requests.fall_back(call)
                log.warning(
                    "the model API at %s rejected the %s response schema %r (%s); using JSON "
                    "mode%s with local validation for it from now on",
                    self.base_url,
                    "strict" if call.level == 1 else "JSON-mode",
                    call.target.name if call.target is not None else "",
                    exc,
                    " with the schema in the request" if call.level == 1 else "",
                )

    async def _request(self, call: _Call) -> Completion[Any]:
        params = self._requests.params(call)
        prompt_estimate = self._requests.prompt_estimate(params)
        choice = call.task.tier if call.task is not None else None
        if self._batcher is None or (choice is not None and choice.tier != "batch"):
            return await self._tiered(call, params, prompt_estimate, choice)
        try:
            return await self._batched(call, params, prompt_estimate)
        except TakenBack as taken:
            log.info("a batched call goes live: %s", taken)
        async with self._batcher.live_gate():  # as many at once as the workers' capacity
            return await self._live(call, params, prompt_estimate)

    async def _tiered(self, call: _Call, params: dict[str, Any], prompt_estimate: int,
                      choice: TierChoice | None) -> Completion[Any]:
        """The request at the tier ``choice`` names (none: as it is; see
        :func:`~planrun.model._tiers.send_at_tier`)."""
        if choice is None:
            return await self._live(call, params, prompt_estimate)
        if choice.tier == "flex" and call.timeout is not None:
            call.timeout = max(call.timeout, FLEX_TIMEOUT_S)  # flex answers slowly
        async with heartbeats(call.task if choice.tier == "flex" else None):
            return await send_at_tier(
                choice, params, lambda sent, tier: self._live(call, sent, prompt_estimate, tier),
                self._tiers, self.retry, self._rng, model=self.model, base_url=self.base_url)

    async def _live(self, call: _Call, params: dict[str, Any], prompt_estimate: int,
                    tier: str = "default") -> Completion[Any]:
        """One live request: reserved (at ``tier``'s price), rate limited, sent, counted."""
        accounting = self._accounting
        reservation = await accounting.reserve(call, prompt_estimate, tier=tier)
        try:
            counted = await accounting.acquire(prompt_estimate, call.max_tokens)
            reply = await self._send(call, params, counted, reservation)
            record = accounting.record(call, reply)
            reservation.used(record)
            await accounting.answered(prompt_estimate, reply)
            return completion_of(call, reply, record)
        finally:
            await reservation.aclose()

    async def _send(self, call: _Call, params: dict[str, Any], counted: int,
                    reservation: Reservation) -> _Reply:
        """One HTTP request to the model API (see :meth:`Transport.send`)."""
        call.attempts += 1
        try:
            return await self._transport.send(params, call.timeout)
        except AssertionError:
            raise  # a test harness refusing the request (respx's "not mocked"), not the API
        except Exception as exc:
            tier = str(params.get("service_tier") or "default")
            raise await self._failed(call, exc, counted, reservation, tier=tier) from exc

    async def _batched(self, call: _Call, params: dict[str, Any],
                       prompt_estimate: int) -> Completion[Any]:
        """The request as a line of a Batch API job, reserved and counted at batch prices;
        :class:`TakenBack` when it is to be sent live instead."""
        batcher = self._batcher
        assert batcher is not None
        price = batcher.options.price
        body = {k: v for k, v in params.items() if k not in ("extra_headers", "timeout")}
        url = self._requests.batch_url()
        reservation = await self._accounting.reserve(call, prompt_estimate, price=price,
                                                     tier="batch")
        try:
            call.attempts += 1
            try:
                raw = await batcher.send(self._transport, body, url, call.idempotency_key,
                                         call.task,
                                         late=lambda line: self._late(call, line, price))
            except TakenBack:
                call.attempts -= 1
                raise
            except openai.APIStatusError as exc:
                raise await self._failed(call, exc, 0, reservation, live=False) from exc
            reply = _Reply.of(raw, self.base_url)
            record = self._accounting.record(call, reply, price=price, tier="batch")
            reservation.used(record)
            return completion_of(call, reply, record)
        finally:
            await reservation.aclose()

    def _late(self, call: _Call, line: Mapping[str, Any], price: float) -> None:
        """A batch line that came back after its call went live: billed, so counted."""
        try:
            body = (line.get("response") or {}).get("body") or {}
            raw = _parsed_line(body, self._requests.batch_url())
            self._accounting.record(call, _Reply.of(raw, self.base_url), price=price,
                                    tier="batch")
        except Exception:  # a line we cannot read is not counted; the call is done anyway
            log.warning("a late batch line could not be read; its usage is not counted")

    async def _failed(self, call: _Call, exc: BaseException, counted: int,
                      reservation: Reservation, live: bool = True,
                      tier: str = "default") -> PlanrunError:
        """Meter, tell the limiter (of a live request sent at ``tier``), and turn ``exc``
        into the planrun error to raise."""
        if live:
            await self._accounting.refused(counted, exc)
        about_tier = tier_refusal(exc) if live else None
        if about_tier is not None:  # not billed, and not a rate limit: the limiter is spared
            reservation.used(self._accounting.record_error(call, about_tier, tier))
            return about_tier
        own = own_error(exc)
        if own is not None:
            # A planrun error raised beneath the SDK (a fixture miss in a replaying
            # transport) is not a connection problem: never retried, never translated.
            return own
        error = request_error(call, exc, secrets=self._transport.secrets,
                              server=self._transport.server)
        reservation.used(self._accounting.record_error(call, error))
        if live:
            await self._accounting.penalize(error, self.retry.base)
        if call.target is not None and call.level < 2 and rejects_schema(exc):
            return _SchemaRejected(str(error))
        return error


def _retrying(policy: RetryPolicy, rng: random.Random) -> AsyncRetrying:
    """Tries of a call by ``policy``: a transient error is tried again after the policy's
    wait (never less than its ``Retry-After``), until the attempts are spent or the server
    asks for a wait longer than the policy waits out itself."""

    def stop(state: RetryCallState) -> bool:
        if state.attempt_number >= policy.attempts:
            return True
        retry_after = _retry_after(state)
        return retry_after is not None and retry_after > policy.max_retry_after

    def wait(state: RetryCallState) -> float:
        return policy.delay(state.attempt_number, _retry_after(state), rng)

    return AsyncRetrying(stop=stop, wait=wait, sleep=_sleep,
                         retry=retry_if_exception_type(TransientError),
                         before_sleep=_log_retry, reraise=True)


def _retry_after(state: RetryCallState) -> float | None:
    error = state.outcome.exception() if state.outcome else None
    return error.retry_after if isinstance(error, TransientError) else None


def _log_retry(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome else None
    wait = state.next_action.sleep if state.next_action else 0.0
    log.info("model call attempt %d failed (%s); retrying in %.3f s",
             state.attempt_number, error, wait)


async def _sleep(seconds: float) -> None:
    # Looked up at call time, so a virtual loop (or a patched asyncio.sleep) governs it.
    await asyncio.sleep(seconds)
