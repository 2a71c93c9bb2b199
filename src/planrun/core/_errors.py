"""Every error planrun raises, in one hierarchy.

    PlanrunError
     ├── UsageError            the caller misused the API or the CLI (bad argument, wrong loop)
     │    └── RunExists        a new run was given the id of a run the store already holds
     ├── PlanError
     │    └── InvalidPlan      a plan failed validation; ``.problems`` lists every problem
     ├── DispatchError
     │    ├── IllegalTransition  a status change the state machine forbids
     │    ├── StallError       task records stopped changing before the run finished
     │    ├── RunAborted       ``on_dead="abort_run"`` stopped the run
     │    └── RunInUse         another live process owns the run (its owner lease holds)
     ├── WorkerError           raised by (or on behalf of) a worker
     │    ├── TransientError   worth retrying: timeouts, connection errors, 408/409/429/5xx
     │    │    └── RateLimited  a 429, with the server's ``retry_after`` when it sent one
     │    └── PermanentError   retrying cannot help: 400/401/403/404/422, bad output, bad payload
     │         ├── BudgetExceeded  the run's token or money budget would be exceeded
     │         ├── ModelRefused    a refusal, a truncated (``length``) or filtered reply
     │         └── UnstorableValue a value (a result, a payload) that is not strict JSON
     ├── ConfigError           missing or invalid configuration (an API key, a model name)
     └── StoreError            a store could not read or write
          └── UnknownRun       the store holds no run of that id

Foreign errors (openai, sqlite3, psycopg) are translated into these at the adapter that
meets them, with ``raise ... from exc``; none leaves planrun untranslated.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from planrun.core._problem import Problem

__all__ = [
    "BudgetExceeded",
    "ConfigError",
    "DispatchError",
    "ErrorClass",
    "IllegalTransition",
    "InvalidPlan",
    "ModelRefused",
    "PermanentError",
    "PlanError",
    "PlanrunError",
    "RateLimited",
    "RunAborted",
    "RunExists",
    "RunInUse",
    "StallError",
    "StoreError",
    "TransientError",
    "UnknownRun",
    "UnstorableValue",
    "UsageError",
    "WorkerError",
    "classify",
]


class PlanrunError(Exception):
    """Base class of every planrun error."""


class UsageError(PlanrunError):
    """The caller misused planrun: a bad argument, an unknown strategy, a wrong event loop."""


class RunExists(UsageError):
    """A new run was given the id of a run the store already holds.

    ``plan_and_run`` refuses it before anything is decomposed or run; the store refuses it
    too (two processes starting the same id at once).
    """

    def __init__(self, run_id: str, where: str) -> None:
        self.run_id = run_id
        super().__init__(f"run {run_id!r} already exists in {where}; choose another run "
                         "id, or resume it")


class ConfigError(PlanrunError):
    """Configuration is missing or invalid (an API key, a model name, a store URL)."""


class PlanError(PlanrunError):
    """A problem with a plan."""


class InvalidPlan(PlanError):
    """A plan failed validation.

    ``problems`` holds every problem found, each with a stable ``code``, the task index and a
    message; ``raw_outputs`` holds the model output of each attempt when a decomposer made it,
    and ``attempts`` the problems of each of those attempts.
    """

    def __init__(
        self,
        problems: Sequence[Problem],
        raw_outputs: Sequence[str] = (),
        message: str | None = None,
        attempts: Sequence[Sequence[Problem]] = (),
    ) -> None:
        self.problems: list[Problem] = list(problems)
        self.raw_outputs: list[str] = list(raw_outputs)
        self.attempts: list[list[Problem]] = [list(a) for a in attempts] or [self.problems]
        """The problems of each attempt, oldest first (one entry unless a model repaired)."""
        if message is None:
            lines = [f"invalid plan: {len(self.problems)} problem(s)"]
            lines += [f"  {p}" for p in self.problems]
            message = "\n".join(lines)
        super().__init__(message)


class DispatchError(PlanrunError):
    """The supervisor could not carry a run through."""


class IllegalTransition(DispatchError):
    """A status change that the task state machine forbids."""


class StallError(DispatchError):
    """Task records stopped changing while some tasks were not finished."""


class RunAborted(DispatchError):
    """A task died under ``on_dead="abort_run"`` and the run was stopped."""


class RunInUse(DispatchError):
    """Another process owns the run: its owner lease has not expired.

    ``owner`` names that process and ``until`` (epoch seconds) is when its lease ends unless
    it renews it; a run has one owner at a time (see ``Store.acquire_run``).
    """

    def __init__(self, run_id: str, owner: str, until: float, now: float, *,
                 waited: float | None = None) -> None:
        self.run_id = run_id
        self.owner = owner
        self.until = until
        ends = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(until))
        if waited is not None:
            super().__init__(
                f"run {run_id} is owned by {owner}, a live process: it kept renewing its "
                f"lease while this one waited {waited:.0f} s; stop it first")
            return
        super().__init__(
            f"run {run_id} is owned by {owner}, whose lease ends at {ends} "
            f"(in {max(0.0, until - now):.0f} s) unless it renews it; if that process is "
            "gone, resume after then"
        )


class StoreError(PlanrunError):
    """A store could not read or write."""


class UnknownRun(StoreError):
    """The store holds no run of that id."""


class WorkerError(PlanrunError):
    """An error raised by a worker, or on its behalf, while doing a task."""


class TransientError(WorkerError):
    """A failure worth retrying with backoff: timeouts, connection errors, 408/409/429/5xx.

    ``retry_after`` (seconds), when set, is the earliest a retry may start.
    """

    def __init__(self, message: str = "", *, retry_after: float | None = None) -> None:
        super().__init__(message or self.__doc__ or "")
        self.retry_after = retry_after


class RateLimited(TransientError):
    """The server answered 429 Too Many Requests."""


class PermanentError(WorkerError):
    """A failure that retrying cannot fix: 4xx, output failing its model, invalid payload."""


class BudgetExceeded(PermanentError):
    """The run's token or money budget would be exceeded by the next call."""


class ModelRefused(PermanentError):
    """The model refused, was cut off (``finish_reason == "length"``) or was filtered."""


class UnstorableValue(PermanentError):
    """A value that cannot be stored as strict JSON (a ``datetime``, a ``set``, ``NaN``...).

    ``path`` locates the offending value inside the whole (``$``, ``$.rows[2].when``) and
    ``type_name`` names its type. Permanent: the same value fails the same way every time,
    so a store raises it at once instead of retrying.
    """

    def __init__(self, message: str, *, path: str = "$", type_name: str = "") -> None:
        super().__init__(message)
        self.path = path
        self.type_name = type_name


@dataclass(frozen=True)
class ErrorClass:
    """Names of the two error classes, as stored on a task record."""

    TRANSIENT = "transient"
    PERMANENT = "permanent"


def classify(exc: BaseException) -> str:
    """Return ``"transient"`` or ``"permanent"`` for an exception raised by a worker.

    planrun's own classes say what they are; ``TimeoutError`` and ``ConnectionError`` are
    transient; anything else is permanent, because retrying an unknown bug burns budget on the
    way to the same outcome.
    """
    if isinstance(exc, TransientError | TimeoutError | ConnectionError):
        return ErrorClass.TRANSIENT
    return ErrorClass.PERMANENT
