"""The scheduling core, failure policy and leases: retry at a time, dead, reclaim."""

from __future__ import annotations

import heapq

from planrun.core._errors import ErrorClass
from planrun.core._ledger import EventName as E
from planrun.core._task import (
    Task,
)
from planrun.core.scheduling._base import (
    _CANCELLED,
    _DEAD,
    _FAILED,
    _IN_FLIGHT,
    _PENDING,
    _RUNNING,
    _WAITING,
)
from planrun.core.scheduling._dispatch import _Dispatch
from planrun.core.scheduling._outcome import Failure


class _Failing(_Dispatch):
    """Failure policy and leases: retry at a time, dead, reclaim."""

    def recover(self, now: float, reason: str | None = "supervisor restart") -> None:
        """Turn what a dead driver left into a state this one can run.

        With a ``reason``, tasks that were assigned or running are put back without counting
        a reclaim (their driver died, not they: only a lease that expired while a live worker
        held the task counts toward ``max_reclaims``); ``None`` leaves them to their workers
        (a coordinator's workers outlive it). Failed tasks get their retry decided again; a
        death's dependents are cancelled; a budget stop stands.
        """
        for task in list(self.tasks.values()):
            if task.status in _IN_FLIGHT and reason is not None:
                self._change(task, _PENDING, E.RECLAIMED, task.assigned_to,
                             {"reason": reason}, assigned_to=None, lease=None)
                self._offer(task.id)
            elif task.status is _FAILED:
                self._decide_failed(self.tasks[task.id], now)
            elif task.status is _DEAD:
                self._after_death(task, now)
            elif task.status is _CANCELLED and task.cause == "budget":
                self._budget_stop(now)
            elif task.status is _WAITING:
                self.take_decision(task, now)

    def fail(self, task_id: str, token: int, failure: Failure, now: float,
             worker: str | None) -> bool:
        """An attempt raised; decide retry, death or budget stop. False when fenced off."""
        if not self.current(task_id, token, worker):
            return False
        task = self.tasks[task_id]
        if failure.budget:
            self._change(task, _CANCELLED, E.CANCELLED, worker, cause="budget",
                         error=failure.error, error_class=failure.error_class,
                         finished_at=now, lease=None, detail={"cause": "budget"})
            self._budget_stop(now)
            return True
        server_at = None if failure.retry_after is None else now + failure.retry_after
        attempts = task.attempts + 1
        at, error = self._decision(task, attempts, failure.error_class, failure.error,
                                   server_at, now)
        if at is None:
            dead = self._change(task, _DEAD, E.DEAD, worker, error=error,
                                error_class=failure.error_class, attempts=attempts,
                                finished_at=now, lease=None, detail={"error": error})
            self._after_death(dead, now)
        else:
            self._change(task, _FAILED, E.FAILED, worker, error=error,
                         error_class=failure.error_class, attempts=attempts, lease=None,
                         not_before=at, detail={"error": error, "retry_at": at})
            self._schedule_retry(task_id, at, worker)
        self.touch(now)
        return True

    def heartbeat(self, task_id: str, token: int, now: float) -> None:
        """The attempt ``token`` of ``task_id`` is alive: extend its lease."""
        task = self.tasks[task_id]
        if task.token != token or task.status is not _RUNNING:
            return
        lease = now + self.stale_after
        self.tasks[task_id] = task.evolve(lease=lease)
        heapq.heappush(self._leases, (lease, task_id, token))

    def _decision(self, task: Task, attempts: int, error_class: str | None, error: str | None,
                  server_at: float | None, now: float) -> tuple[float | None, str]:
        """When a failed task is tried again (None: never), and the error to record."""
        error = error or "failed"
        if error_class != ErrorClass.TRANSIENT or attempts >= task.max_attempts:
            return None, error
        if self.stopping:
            return None, error
        if self.retry_budget is not None and self.retries_used >= self.retry_budget:
            return None, f"{error} (retry budget exhausted)"
        self.retries_used += 1
        at = now + self.retry.backoff(attempts, self._rng)
        if server_at is not None:
            at = max(at, min(server_at, now + self.retry.max_retry_after))
        return at, error

    def _schedule_retry(self, task_id: str, at: float, worker: str | None) -> None:
        self._decided.add(task_id)
        if worker is not None:
            self._avoid[task_id] = worker
        heapq.heappush(self._delayed, (at, task_id, self.tasks[task_id].token))

    def _decide_failed(self, task: Task, now: float) -> None:
        """A ``failed`` record nobody decided on yet (a worker's report, or a resume)."""
        # A failed record says a retry may follow: only a permanent error class rules it out.
        at, error = self._decision(task, task.attempts, task.error_class or ErrorClass.TRANSIENT,
                                   task.error, task.not_before, now)
        if at is None:
            dead = self._change(task, _DEAD, E.DEAD, task.assigned_to, error=error,
                                finished_at=now, lease=None, detail={"error": error})
            self._after_death(dead, now)
            return
        self._schedule_retry(task.id, at, task.assigned_to)

    def expire(self, task: Task, now: float) -> None:
        """The lease of ``task`` ran out while a worker held it."""
        if task.status not in _IN_FLIGHT:
            return
        worker = task.assigned_to
        self.touch(now)
        if task.reclaims >= self.max_reclaims:
            error = f"reclaimed {task.reclaims} times without a result; giving up"
            dead = self._change(task, _DEAD, E.DEAD, worker, error=error,
                                error_class=ErrorClass.TRANSIENT, finished_at=now, lease=None,
                                detail={"error": error})
            self._after_death(dead, now)
            return
        # The token moves on: the reclaimed attempt's result can no longer be written.
        self._change(task, _PENDING, E.RECLAIMED, worker, {"reason": "lease expired"},
                     reclaims=task.reclaims + 1, assigned_to=None, lease=None,
                     token=task.token + 1)
        if worker is not None:
            self._avoid[task.id] = worker
        self._offer(task.id)
