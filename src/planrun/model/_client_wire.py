"""A model call on the wire: the request's parameters, sending it, reading the reply."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import openai
from pydantic import BaseModel
from tenacity import RetryCallState

from planrun.core import (
    PermanentError,
    PlanrunError,
    RateLimited,
    WorkerError,
)
from planrun.model._batch import Batcher, TakenBack
from planrun.model._batch import parsed_line as _parsed_line
from planrun.model._client_setup import (
    PROMPT_HEADER,
    Completion,
    Mode,
    _Call,
    _check_refusal,
    _ModelSetup,
    _prompt_header,
    _Reply,
    _retry_after,
    _SchemaRejected,
    _settled,
    _Target,
    log,
)
from planrun.model._errors import (
    MalformedReply,
    OutputTruncated,
    _own_error,
    _transport_error,
    rejects_schema,
    translate_error,
)
from planrun.model._limiter import ProviderLimits
from planrun.model._usage import Reservation, UsageRecord, estimate_tokens


class _ModelWire(_ModelSetup):
    """A model call on the wire: the request's parameters, sending it, reading the reply."""

    _batcher: Batcher | None = None
    """Set on the twin :meth:`Model.batched` makes: its calls go to the Batch API."""

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

    def _level(self, call: _Call) -> int:
        if call.target is None or self.structured in ("strict", "json_schema"):
            return 0
        start = 1 if self.structured in ("json_object", "json_mode") else 0
        return max(start, self._fallback.get(call.target.key, 0))

    async def _attempt(self, call: _Call) -> Completion[Any]:
        while True:
            try:
                return await self._request(call)
            except _SchemaRejected as exc:
                if self.structured in ("strict", "json_schema") or call.level >= 2:
                    raise PermanentError(str(exc)) from exc.__cause__
                assert call.target is not None
                call.level += 1
                call.fell_back = True
                with self._lock:
                    key = call.target.key
                    self._fallback[key] = max(self._fallback.get(key, 0), call.level)
                log.warning(
                    "the model API at %s rejected the %s response schema %r (%s); using JSON "
                    "mode%s with local validation for it from now on",
                    self.base_url,
                    "strict" if call.level == 1 else "JSON-mode",
                    call.target.name,
                    exc,
                    " with the schema in the request" if call.level == 1 else "",
                )

    def _params(self, call: _Call) -> dict[str, Any]:
        if self.api == "responses":
            params = self._responses_params(call)
        else:
            params = self._chat_params(call)
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

    async def _request(self, call: _Call) -> Completion[Any]:
        params = self._params(call)
        shape = params.get("response_format") or params.get("text")
        schema_text = json.dumps(shape) if shape else ""
        chat = params["messages"] if "messages" in params else params["input"]
        prompt_estimate = estimate_tokens(chat, extra_text=schema_text)
        if self._batcher is None:
            return await self._live(call, params, prompt_estimate)
        try:
            return await self._batched(call, params, prompt_estimate)
        except TakenBack as taken:
            log.info("a batched call goes live: %s", taken)
        async with self._batcher.live_gate():  # as many at once as the workers' capacity
            return await self._live(call, params, prompt_estimate)

    async def _live(self, call: _Call, params: dict[str, Any],
                    prompt_estimate: int) -> Completion[Any]:
        """One live request: reserved, rate limited, sent, counted."""
        # The budget reserves the high estimate and settles on the usage; the limiter
        # takes what the provider counts: the prompt's tokens (the estimate, scaled by what
        # replies reported of earlier prompts) plus the bound, whatever the reply uses.
        reservation = await call.meter.areserve(self.model, prompt_estimate, call.max_tokens)
        counted = self._prompt_scale.scaled(prompt_estimate) + call.max_tokens
        try:
            if self.limiter is not None:
                await self.limiter.acquire(counted)
            reply = await self._send(call, params, counted, reservation)
            record = self._record(call, reply)
            reservation.used(record)
            self._prompt_scale.learn(prompt_estimate, reply.prompt_tokens)
            await self._observe(reply.limits)
            return self._finish(call, reply, record)
        finally:
            await reservation.aclose()

    async def _batched(self, call: _Call, params: dict[str, Any],
                       prompt_estimate: int) -> Completion[Any]:
        """The request as a line of a Batch API job, reserved and counted at batch prices;
        :class:`TakenBack` when it is to be sent live instead."""
        batcher = self._batcher
        assert batcher is not None
        price = batcher.options.price
        body = {k: v for k, v in params.items() if k not in ("extra_headers", "timeout")}
        url = self._batch_url()
        reservation = await call.meter.areserve(self.model, prompt_estimate, call.max_tokens,
                                                price=price, tier="batch")
        try:
            call.attempts += 1
            try:
                raw = await batcher.send(self, body, url, call.idempotency_key, call.task,
                                         late=lambda line: self._late(call, line, price))
            except TakenBack:
                call.attempts -= 1
                raise
            except openai.APIStatusError as exc:
                raise await self._failed(call, exc, 0, reservation, live=False) from exc
            reply = _Reply.of(raw, self.base_url)
            record = self._record(call, reply, price=price, tier="batch")
            reservation.used(record)
            return self._finish(call, reply, record)
        finally:
            await reservation.aclose()

    def _batch_url(self) -> str:
        """The endpoint a batch line of this model names."""
        return "/v1/responses" if self.api == "responses" else "/v1/chat/completions"

    def _late(self, call: _Call, line: Mapping[str, Any], price: float) -> None:
        """A batch line that came back after its call went live: billed, so counted."""
        try:
            body = (line.get("response") or {}).get("body") or {}
            url = self._batch_url()
            raw = _parsed_line(body, url)
            self._record(call, _Reply.of(raw, self.base_url), price=price, tier="batch")
        except Exception:  # a line we cannot read is not counted; the call is done anyway
            log.warning("a late batch line could not be read; its usage is not counted")

    async def _observe(self, limits: ProviderLimits | None) -> None:
        """Hand the provider's ``x-ratelimit-*`` view to the limiter, when both exist."""
        observe = getattr(self.limiter, "observe", None)
        if limits is not None and observe is not None:
            await _settled(observe(limits))

    async def _send(self, call: _Call, params: dict[str, Any], estimate: int,
                    reservation: Reservation) -> _Reply:
        """One HTTP request to the model API: the single place planrun's traffic leaves."""
        call.attempts += 1
        try:
            client = await self._client()
            api: Any = client.responses if self.api == "responses" else client.chat.completions
            loop = asyncio.get_running_loop()
            sent = loop.time()
            if not hasattr(api, "with_raw_response"):  # a client of the caller's own making
                raw = await asyncio.wait_for(api.create(**params), call.timeout)
                return dataclasses.replace(_Reply.of(raw, self.base_url),
                                           latency_s=loop.time() - sent)
            response = await asyncio.wait_for(api.with_raw_response.create(**params),
                                              call.timeout)
            # The provider counted the request on arrival, so its view is as old as the
            # request's time in flight.
            took = loop.time() - sent
            limits = ProviderLimits.from_headers(response.headers, age=took)
            return dataclasses.replace(_Reply.of(response.parse(), self.base_url, limits),
                                       latency_s=took)
        except AssertionError:
            raise  # a test harness refusing the request (respx's "not mocked"), not the API
        except Exception as exc:
            raise await self._failed(call, exc, estimate, reservation) from exc

    async def _failed(self, call: _Call, exc: BaseException, estimate: int,
                      reservation: Reservation, live: bool = True) -> PlanrunError:
        """Meter, tell the limiter (of a live request), and turn ``exc`` into the planrun
        error to raise."""
        if self.limiter is not None and live:
            await _settled(self.limiter.reconcile(estimate, 0))
        response = getattr(exc, "response", None)
        if isinstance(exc, openai.APIStatusError) and response is not None and live:
            await self._observe(ProviderLimits.from_headers(response.headers))
        if isinstance(exc, PlanrunError) and not isinstance(exc, WorkerError):
            return exc
        own = _own_error(exc)
        if own is not None:
            # A planrun error raised beneath the SDK (a fixture miss in a replaying
            # transport) is not a connection problem: never retried, never translated.
            return own
        if isinstance(exc, openai.OpenAIError | asyncio.TimeoutError | WorkerError):
            error = translate_error(exc, secrets=self._secrets, timeout=call.timeout)
        else:
            error = _transport_error(exc, self._secrets, self._server)
        if isinstance(error, MalformedReply) and error.fingerprint is not None:
            seen = error.fingerprint in call.malformed  # the same page each time
            call.malformed.add(error.fingerprint)
            if seen:
                error = error.repeated(self._server)
        reservation.used(call.meter.record(self.model, prompt_hash=call.prompt_hash,
                                           error=type(error).__name__))
        if isinstance(error, RateLimited) and self.limiter is not None and live:
            await _settled(self.limiter.penalize(error.retry_after or self.retry.base))
        if call.target is not None and call.level < 2 and rejects_schema(exc):
            return _SchemaRejected(str(error))
        return error

    def _record(self, call: _Call, reply: _Reply, price: float | None = None,
                tier: str | None = None) -> UsageRecord:
        """Record what ``reply`` used, priced at the tier that served it (``tier`` for a
        Batch API line, else as the answer names it)."""
        truncated = reply.finish_reason == "length" and not reply.refusal
        return call.meter.record(
            reply.model or self.model,
            price=price,
            tier=tier or reply.service_tier,
            latency_s=reply.latency_s,
            prompt_tokens=reply.prompt_tokens,
            completion_tokens=reply.completion_tokens,
            cached_tokens=reply.cached_tokens,
            reasoning_tokens=reply.reasoning_tokens,
            prompt_hash=call.prompt_hash,
            request_id=reply.request_id,
            error=OutputTruncated.__name__ if truncated else None,
        )

    def _finish(self, call: _Call, reply: _Reply, record: UsageRecord) -> Completion[Any]:
        if not reply.answered:
            raise PermanentError("the model API returned no choices")
        _check_refusal(reply, call.max_tokens)
        mode: Mode = "text" if call.target is None else "json_schema" if call.level == 0 \
            else "json_mode"
        parsed = self._parse(call, mode, reply.text)
        return Completion(
            parsed,
            reply.text,
            record,
            reply.model,
            reply.finish_reason,
            reply.request_id,
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
