"""The scheduling core, approvals and effects: waiting for a person, effects due once."""

from __future__ import annotations

import heapq
from typing import Any

from planrun.core._errors import UsageError
from planrun.core._ledger import EventName as E
from planrun.core._task import (
    Task,
)
from planrun.core.scheduling._approval import (
    APPROVED,
    REJECTED,
    Approval,
    recorded_decision,
    stage_of,
    waiting_cause,
)
from planrun.core.scheduling._base import (
    _COMPLETED,
    _DEAD,
    _PENDING,
    _WAITING,
)
from planrun.core.scheduling._failing import _Failing


class _Gates(_Failing):
    """Approvals and effects: waiting for a person, effects due once."""

    def approval_for(self, task: Task) -> Approval | None:
        """The approval ``task`` needs (its own, else its kind's), or None."""
        return self.task_approvals.get(task.id) or self.approvals.get(task.kind)

    def _needs_start_approval(self, task: Task) -> bool:
        rule = self.approval_for(task)
        return (rule is not None and rule.before == "start" and task.cause != APPROVED
                and rule.applies(task))

    def _ask(self, now: float) -> None:
        """Ready tasks that need approval before they start go to ``waiting``."""
        if not self._asking:
            return
        asking, self._asking = self._asking, []
        for tid in asking:
            task = self.tasks[tid]
            if task.status is _PENDING and not self.stopping and not self._waiting[tid]:
                self._wait(task, "start", now, None)

    def _wait(self, task: Task, stage: str, now: float, worker: str | None,
              **changes: Any) -> Task:
        rule = self.approval_for(task)
        at = None if rule is None or rule.timeout_s is None else now + rule.timeout_s
        new = self._change(task, _WAITING, E.WAITING, worker,
                           {"for": stage, "timeout_at": at}, cause=waiting_cause(stage),
                           not_before=at, **changes)
        if at is not None:
            heapq.heappush(self._approval_timeouts, (at, task.id))
        self.touch(now)
        return new

    def _waiting_record(self, task_id: str) -> Task:
        task = self.tasks.get(task_id)
        if task is None:
            raise UsageError(f"no task {task_id!r} in this run")
        if task.status is not _WAITING:
            raise UsageError(
                f"task {task_id!r} is not waiting for approval (it is {task.status.value})")
        return task

    def approve(self, task_id: str, now: float, note: str | None = None,
                by: str | None = None) -> Task:
        """A person approved ``task_id``: it starts, or it completes and its effect is due.

        Raises:
            UsageError: the task is unknown or not waiting (approving twice included).
        """
        task = self._waiting_record(task_id)
        stage = stage_of(task)
        detail = {"for": stage, "note": note, "by": by}
        if stage == "effect":
            # The approval, then the completion it allows (the audit reads completions).
            self._sink(task, E.APPROVED, by, detail, task.token)
            new = self._change(task, _COMPLETED, E.COMPLETED, by, {"approved": True},
                               cause=APPROVED, error=None, not_before=None, finished_at=now)
        else:
            new = self._change(task, _PENDING, E.APPROVED, by, detail, cause=APPROVED,
                               error=None, not_before=None)
            self._offer(task_id)
        self.touch(now)
        return new

    def reject(self, task_id: str, now: float, reason: str, by: str | None = None) -> Task:
        """A person rejected ``task_id``: it is ``dead`` with cause ``rejected``; its
        dependents follow ``on_dead``.

        Raises:
            UsageError: the task is unknown or not waiting, or ``reason`` is empty.
        """
        if not reason:
            raise UsageError("a rejection needs a reason")
        task = self._waiting_record(task_id)
        error = f"rejected: {reason}"
        dead = self._change(task, _DEAD, E.DEAD, by,
                            {"cause": REJECTED, "for": stage_of(task), "reason": reason},
                            cause=REJECTED, error=error, error_class="permanent",
                            not_before=None, finished_at=now, lease=None)
        self._after_death(dead, now)
        self.touch(now)
        return dead

    def take_decision(self, record: Task, now: float) -> bool:
        """Carry out a decision another process wrote on a waiting record (True: one was)."""
        decision = recorded_decision(record)
        if decision is None:
            return False
        current = self.tasks.get(record.id)
        if current is None or current.status is not _WAITING:
            return False
        approved, note = decision
        if approved:
            self.approve(record.id, now, note, by="store")
        else:
            self.reject(record.id, now, note or "rejected", by="store")
        return True

    def _timed_out(self, task: Task, now: float) -> None:
        rule = self.approval_for(task)
        if rule is not None and rule.on_timeout == "approve":
            self.approve(task.id, now, "approval timed out: approved by default", by="timeout")
        else:
            self.reject(task.id, now, "approval timed out", by="timeout")

    @property
    def effects_pending(self) -> bool:
        """Effects due or being applied."""
        return bool(self._effects_due or self._effects_open)

    def effects_due(self, now: float) -> list[Task]:
        """Completed tasks whose effect is due now (each handed out once until it reports)."""
        due: list[Task] = []
        while self._effects_due and self._effects_due[0][0] <= now:
            _, tid = heapq.heappop(self._effects_due)
            if tid in self.effects_applied or tid in self._effects_open:
                continue
            self._effects_open.add(tid)
            due.append(self.tasks[tid])
        return due

    def effect_applied(self, task_id: str, now: float) -> None:
        """The effect of ``task_id`` is applied and recorded."""
        self._effects_open.discard(task_id)
        self.effects_applied.add(task_id)
        self.facts.effects_failed.pop(task_id, None)
        self.touch(now)

    def effect_failed(self, task_id: str, error: str, now: float,
                      transient: bool = True) -> float | None:
        """Applying the effect failed: when to try again (None: given up, recorded)."""
        self._effects_open.discard(task_id)
        tries = self._effect_tries.get(task_id, 0) + 1
        self._effect_tries[task_id] = tries
        self.touch(now)
        if not transient or tries >= self.effect_retry.attempts:
            self.facts.effects_failed[task_id] = error
            return None
        at = now + self.effect_retry.backoff(tries, self._rng)
        heapq.heappush(self._effects_due, (at, task_id))
        return at

    def effect_known(self, task_id: str) -> None:
        """The effect of ``task_id`` was applied by an earlier process."""
        self.effects_applied.add(task_id)
