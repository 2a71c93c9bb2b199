"""Running one attempt of a task: the handler plumbing every driver shares.

Validate the payload with the kind's model, call the handler (a coroutine function on the
loop, a plain function on a thread), bound it by its timeout, check the result with the
kind's result model. What an error *means* is the scheduler's business
(:func:`planrun.core.scheduling.failure_of`); this module only runs the work.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable
from typing import Any

from pydantic import BaseModel, ValidationError

from planrun.core import Handler, KindSpec, PermanentError, Task, TaskContext
from planrun.stores.base import strict_json

__all__ = ["call", "call_handler", "checked", "is_coroutine_handler", "jsonable",
           "payload_for", "result_for", "run_attempt"]


async def run_attempt(spec: KindSpec, handler: Handler | None, task: Task, ctx: TaskContext,
                      limit: float | None, is_async: bool | None = None) -> Any:
    """The attempt's checked result; raises what the handler (or a check) raised.

    ``is_async``: whether ``handler`` is a coroutine function, when the caller knows.
    A timeout raises ``TimeoutError``; :func:`planrun.core.scheduling.timed_out` names it.
    """
    return checked(spec, task, await call(spec, handler, task, ctx, limit, is_async))


def call(spec: KindSpec, handler: Handler | None, task: Task, ctx: TaskContext,
         limit: float | None, is_async: bool | None = None) -> Awaitable[Any]:
    """The handler called on the task's payload, as one awaitable to hand to
    :func:`checked` once awaited (:func:`run_attempt` does both): for a coroutine function
    with no time limit, the handler's own coroutine (nothing in between to create, or to
    pass through each time it resumes); otherwise one that runs a plain function on a
    thread and bounds the call by ``limit``.

    Raises:
        PermanentError: the kind has no handler, or its payload model refuses the payload.
    """
    if handler is None:
        raise PermanentError(f"kind {task.kind!r} has no handler")
    payload = payload_for(spec, task)
    if is_async is None:
        is_async = _is_async(handler)
    if limit is None and is_async:
        return handler(payload, ctx)
    work = call_handler(handler, payload, ctx)
    return asyncio.wait_for(work, limit) if limit is not None else work


def checked(spec: KindSpec, task: Task, outcome: Any) -> Any:
    """What the handler returned, as the attempt's result: checked by the kind's result
    model, JSON-ready.

    Raises:
        PermanentError: the kind's result model refuses it.
        UnstorableValue: a result no store, ledger or report can carry (raised at once,
            naming the type, rather than a write failing later).
    """
    if outcome is None and spec.result_model is None:
        return None  # null is JSON, and there is no model to check it with
    result = result_for(spec, outcome)
    if result is not None:  # null is JSON; anything else is checked
        strict_json(result, f"task {task.id!r} result")
    return result


async def call_handler(handler: Handler, payload: Any, ctx: TaskContext) -> Any:
    """Call a handler: awaited when async, on a thread when synchronous."""
    if _is_async(handler):
        return await handler(payload, ctx)
    outcome = await asyncio.to_thread(handler, payload, ctx)
    if inspect.isawaitable(outcome):
        outcome = await outcome
    return outcome


def payload_for(spec: KindSpec, task: Task) -> Any:
    """The payload as the kind's model (a plain dict without one)."""
    if spec.payload_model is None:
        return dict(task.payload)
    try:
        return spec.payload_model.model_validate(dict(task.payload))
    except ValidationError as exc:
        raise PermanentError(f"invalid payload for {spec.name!r}: {exc}") from exc


def result_for(spec: KindSpec, result: Any) -> Any:
    """The result checked by the kind's result model, as JSON-ready data."""
    if spec.result_model is None and (result is None or type(result) in _PLAIN):
        return result  # nothing to check or to dump
    if spec.result_model is not None and not isinstance(result, spec.result_model):
        try:
            result = spec.result_model.model_validate(result)
        except ValidationError as exc:
            raise PermanentError(f"result of {spec.name!r} fails its model: {exc}") from exc
    if isinstance(result, BaseModel):
        return result.model_dump(mode="json")
    return result


_PLAIN = frozenset({str, int, float, bool, dict, list})
"""Result types that are no model to dump (their JSON check comes after)."""


def jsonable(value: Any) -> Any:
    """An effect's outcome as something a store can keep."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if value is None or isinstance(value, str | int | float | bool | list | dict):
        return value
    return repr(value)


async def maybe_await(value: Any | Awaitable[Any]) -> Any:
    """``value``, awaited when it is awaitable."""
    if inspect.isawaitable(value):
        return await value
    return value


def is_coroutine_handler(handler: Handler) -> bool:
    """True when calling ``handler`` returns a coroutine to await (else it runs on a
    thread)."""
    return _is_async(handler)


def _is_async(handler: Handler) -> bool:
    try:
        return _is_async_cached(handler)
    except TypeError:  # an unhashable callable object
        return _check_async(handler)


def _check_async(handler: Handler) -> bool:
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        type(handler).__call__
    )


_is_async_cached = functools.lru_cache(maxsize=1024)(_check_async)
