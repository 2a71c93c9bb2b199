"""Failure policy: what a failure, an expired lease or a death means.

:class:`FailurePolicy` owns the retry policy and the run's retry budget (and what of it was
spent), the reclaim limit, and ``on_dead``. It decides: retry at a time (backoff, the
server's ``Retry-After`` clamped), dead, or a stop of the run for its budget; a reclaim or a
death after an expired lease; what a death cancels (its dependents, or the whole run), and
when a death is handed to :class:`~planrun.core.scheduling._growth.Growth` to re-plan.
"""

from __future__ import annotations

import random

from planrun.core._errors import ErrorClass
from planrun.core._ledger import EventName as E
from planrun.core._task import Task
from planrun.core.scheduling._book import Book
from planrun.core.scheduling._common import (
    _CANCELLABLE,
    _CANCELLED,
    _DEAD,
    _FAILED,
    _IN_FLIGHT,
    _PENDING,
    OnDead,
)
from planrun.core.scheduling._dispatch import Routing
from planrun.core.scheduling._growth import Growth
from planrun.core.scheduling._outcome import Failure
from planrun.core.scheduling._ready import Readiness
from planrun.core.scheduling._retry import RetryPolicy

__all__ = ["FailurePolicy"]


class FailurePolicy:
    """What failures, expired leases and deaths mean in one run."""

    def __init__(self, book: Book, ready: Readiness, routing: Routing, growth: Growth, *,
                 retry: RetryPolicy, retry_budget: int | None, max_reclaims: int,
                 on_dead: OnDead, rng: random.Random) -> None:
        self.book = book
        self.tasks = book.tasks
        self.ready = ready
        self.routing = routing
        self.growth = growth
        self.retry = retry
        self.retry_budget = retry_budget
        self.retries_used = 0
        self.max_reclaims = max_reclaims
        self.on_dead: OnDead = on_dead
        self._rng = rng

    def fail(self, task_id: str, token: int, failure: Failure, now: float,
             worker: str | None) -> bool:
        """An attempt raised; decide retry, death or budget stop. False when fenced off."""
        book = self.book
        if not book.current(task_id, token, worker):
            return False
        task = self.tasks[task_id]
        if failure.budget:
            book.change(task, _CANCELLED, E.CANCELLED, worker, cause="budget",
                        error=failure.error, error_class=failure.error_class,
                        finished_at=now, lease=None, detail={"cause": "budget"})
            self.budget_stop(now)
            return True
        server_at = None if failure.retry_after is None else now + failure.retry_after
        attempts = task.attempts + 1
        at, error = self._decision(task, attempts, failure.error_class, failure.error,
                                   server_at, now)
        if at is None:
            dead = book.change(task, _DEAD, E.DEAD, worker, error=error,
                               error_class=failure.error_class, attempts=attempts,
                               finished_at=now, lease=None, detail={"error": error})
            self.after_death(dead, now)
        else:
            book.change(task, _FAILED, E.FAILED, worker, error=error,
                        error_class=failure.error_class, attempts=attempts, lease=None,
                        not_before=at, detail={"error": error, "retry_at": at})
            self._schedule_retry(task_id, at, worker)
        book.touch(now)
        return True

    def _decision(self, task: Task, attempts: int, error_class: str | None, error: str | None,
                  server_at: float | None, now: float) -> tuple[float | None, str]:
        """When a failed task is tried again (None: never), and the error to record."""
        error = error or "failed"
        if error_class != ErrorClass.TRANSIENT or attempts >= task.max_attempts:
            return None, error
        if self.book.stopping:
            return None, error
        if self.retry_budget is not None and self.retries_used >= self.retry_budget:
            return None, f"{error} (retry budget exhausted)"
        self.retries_used += 1
        at = now + self.retry.backoff(attempts, self._rng)
        if server_at is not None:
            at = max(at, min(server_at, now + self.retry.max_retry_after))
        return at, error

    def _schedule_retry(self, task_id: str, at: float, worker: str | None) -> None:
        if worker is not None:
            self.routing.avoid[task_id] = worker
        self.ready.delay(task_id, at, self.tasks[task_id].token)

    def decide_failed(self, task: Task, now: float) -> None:
        """A ``failed`` record nobody decided on yet (a worker's report, or a resume)."""
        # A failed record says a retry may follow: only a permanent error class rules it out.
        at, error = self._decision(task, task.attempts, task.error_class or ErrorClass.TRANSIENT,
                                   task.error, task.not_before, now)
        if at is None:
            dead = self.book.change(task, _DEAD, E.DEAD, task.assigned_to, error=error,
                                    finished_at=now, lease=None, detail={"error": error})
            self.after_death(dead, now)
            return
        self._schedule_retry(task.id, at, task.assigned_to)

    def retry_now(self, task: Task, now: float) -> None:
        """The retry time of ``task`` (failed) came: it is pending again."""
        self.book.change(task, _PENDING, E.RETRY, None, None, assigned_to=None,
                         not_before=None)
        self.ready.offer(task.id)
        self.book.touch(now)  # a record changed: the stall clock starts again

    def reclaim(self, task: Task, reason: str) -> None:
        """``task`` was in flight under a driver that died: pending again, no reclaim
        counted (its driver died, not it)."""
        self.book.change(task, _PENDING, E.RECLAIMED, task.assigned_to, {"reason": reason},
                         assigned_to=None, lease=None)
        self.ready.offer(task.id)

    def expire(self, task: Task, now: float) -> None:
        """The lease of ``task`` ran out while a worker held it: reclaimed, or dead after
        ``max_reclaims``."""
        if task.status not in _IN_FLIGHT:
            return
        worker = task.assigned_to
        book = self.book
        book.touch(now)
        if task.reclaims >= self.max_reclaims:
            error = f"reclaimed {task.reclaims} times without a result; giving up"
            dead = book.change(task, _DEAD, E.DEAD, worker, error=error,
                               error_class=ErrorClass.TRANSIENT, finished_at=now, lease=None,
                               detail={"error": error})
            self.after_death(dead, now)
            return
        # The token moves on: the reclaimed attempt's result can no longer be written.
        book.change(task, _PENDING, E.RECLAIMED, worker, {"reason": "lease expired"},
                    reclaims=task.reclaims + 1, assigned_to=None, lease=None,
                    token=task.token + 1)
        if worker is not None:
            self.routing.avoid[task.id] = worker
        self.ready.offer(task.id)

    def after_death(self, task: Task, now: float) -> None:
        """``task`` is dead: ``abort_run`` cancels the run; otherwise its dependents are
        cancelled, and under ``replan`` a replan of it is asked for."""
        if self.on_dead == "abort_run":
            facts = self.book.facts
            if facts.aborted_by is None:
                facts.aborted_by = task.id
            self.cancel_all(f"abort: {task.id} died", now)
            return
        dependents = self.ready.dependents
        stack = list(dependents.get(task.id, ()))
        seen: set[str] = set()
        while stack:
            dep_id = stack.pop()
            if dep_id in seen:
                continue
            seen.add(dep_id)
            stack.extend(dependents.get(dep_id, ()))
            dep = self.tasks.get(dep_id)
            if dep is not None and dep.status in _CANCELLABLE:
                self._cancel(dep, task.id, now)
        if self.on_dead == "replan":
            self.growth.ask_replan(task, seen)

    def _cancel(self, task: Task, cause: str, now: float) -> None:
        self.book.change(task, _CANCELLED, E.CANCELLED, None, {"cause": cause}, cause=cause,
                         finished_at=now, lease=None)

    def cancel_all(self, cause: str, now: float) -> None:
        """Every task not started or not final yet is cancelled with ``cause``."""
        for task in list(self.tasks.values()):
            if task.status in _CANCELLABLE:
                self._cancel(task, cause, now)

    def budget_stop(self, now: float) -> None:
        """The run's budget is spent: nothing more starts, what has not started is
        cancelled."""
        self.book.facts.budget_exhausted = True
        self.cancel_all("budget", now)
