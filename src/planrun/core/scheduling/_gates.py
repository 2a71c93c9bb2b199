"""Approval gates: tasks that wait for a person before they start or before their effect.

:class:`Approvals` owns the approval rules (by kind and by task), the tasks waiting for a
person (``awaiting``), the ready tasks still to be asked about, and the approval timeouts. It
is the start gate of :class:`~planrun.core.scheduling._ready.Readiness`; it carries out a
decision (a person's, one written on the record by another process, or a timeout's); a
rejection is a death, and what a death means is
:class:`~planrun.core.scheduling._failing.FailurePolicy`'s. The rule itself (what a
gate is, how a decision is written) is :mod:`planrun.core.scheduling._approval`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from typing import Any

from planrun.core._errors import UsageError
from planrun.core._ledger import EventName as E
from planrun.core._task import Task
from planrun.core.scheduling._approval import (
    APPROVED,
    REJECTED,
    Approval,
    as_approval,
    recorded_decision,
    stage_of,
    waiting_cause,
)
from planrun.core.scheduling._book import Book
from planrun.core.scheduling._common import _COMPLETED, _DEAD, _PENDING, _WAITING
from planrun.core.scheduling._failing import FailurePolicy
from planrun.core.scheduling._ready import Readiness

__all__ = ["Approvals"]


class Approvals:
    """The approval gates of one run and the tasks waiting at them."""

    def __init__(self, book: Book, ready: Readiness, failing: FailurePolicy, *,
                 approvals: Mapping[str, Approval | str] | None,
                 task_approvals: Mapping[str, Approval | str] | None) -> None:
        self.book = book
        self.tasks = book.tasks
        self.ready = ready
        self.failing = failing
        self.by_kind = {k: as_approval(v) for k, v in (approvals or {}).items()}
        self.by_task = {k: as_approval(v) for k, v in (task_approvals or {}).items()}
        self.any = bool(self.by_kind or self.by_task)
        """The run has approval rules (they are fixed when the run is set up)."""
        self.awaiting: set[str] = set()
        """Ids of the tasks in status ``waiting`` (waiting for a person)."""
        self.asking: list[str] = []
        """Ready tasks the start gate took, to be moved to ``waiting`` (:meth:`ask`)."""
        self.timeouts: list[tuple[float, str]] = []
        """``(time, id)``: when a waiting task's approval times out."""


    def approval_for(self, task: Task) -> Approval | None:
        """The approval ``task`` needs (its own, else its kind's), or None."""
        return self.by_task.get(task.id) or self.by_kind.get(task.kind)

    def hold(self, task: Task) -> bool:
        """The start gate: True when ready ``task`` needs approval before it starts (it is
        then asked about at the next :meth:`ask`)."""
        rule = self.approval_for(task)
        if rule is None or rule.before != "start" or task.cause == APPROVED \
                or not rule.applies(task):
            return False
        if task.id not in self.asking:
            self.asking.append(task.id)
        return True

    def holds_effect(self, task: Task, result: Any) -> bool:
        """Whether ``task``, returning ``result``, waits for approval before it completes."""
        rule = self.approval_for(task)
        return (rule is not None and rule.before == "effect" and task.cause != APPROVED
                and rule.applies(task.evolve(result=result)))

    def ask(self, now: float) -> None:
        """Ready tasks that need approval before they start go to ``waiting``."""
        if not self.asking:
            return
        asking, self.asking = self.asking, []
        for tid in asking:
            task = self.tasks[tid]
            if task.status is _PENDING and not self.book.stopping \
                    and not self.ready.waiting[tid]:
                self.wait(task, "start", now, None)

    def wait(self, task: Task, stage: str, now: float, worker: str | None,
             **changes: Any) -> Task:
        """``task`` waits for a person's approval at ``stage`` (with ``changes``)."""
        rule = self.approval_for(task)
        at = None if rule is None or rule.timeout_s is None else now + rule.timeout_s
        new = self.book.change(task, _WAITING, E.WAITING, worker,
                               {"for": stage, "timeout_at": at}, cause=waiting_cause(stage),
                               not_before=at, **changes)
        if at is not None:
            heapq.heappush(self.timeouts, (at, task.id))
        self.book.touch(now)
        return new

    def restored(self, task: Task) -> None:
        """A stored waiting record: its timeout counts again."""
        if task.status is _WAITING and task.not_before is not None:
            heapq.heappush(self.timeouts, (task.not_before, task.id))

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
        """See :meth:`planrun.core.scheduling.Scheduler.approve`."""
        task = self._waiting_record(task_id)
        stage = stage_of(task)
        detail = {"for": stage, "note": note, "by": by}
        book = self.book
        if stage == "effect":
            # The approval, then the completion it allows (the audit reads completions).
            book.sink(task, E.APPROVED, by, detail, task.token)
            new = book.change(task, _COMPLETED, E.COMPLETED, by, {"approved": True},
                              cause=APPROVED, error=None, not_before=None, finished_at=now)
        else:
            new = book.change(task, _PENDING, E.APPROVED, by, detail, cause=APPROVED,
                              error=None, not_before=None)
            self.ready.offer(task_id)
        book.touch(now)
        return new

    def reject(self, task_id: str, now: float, reason: str, by: str | None = None) -> Task:
        """See :meth:`planrun.core.scheduling.Scheduler.reject`."""
        if not reason:
            raise UsageError("a rejection needs a reason")
        task = self._waiting_record(task_id)
        error = f"rejected: {reason}"
        dead = self.book.change(task, _DEAD, E.DEAD, by,
                                {"cause": REJECTED, "for": stage_of(task), "reason": reason},
                                cause=REJECTED, error=error, error_class="permanent",
                                not_before=None, finished_at=now, lease=None)
        self.failing.after_death(dead, now)
        self.book.touch(now)
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

    def timed_out(self, now: float) -> Iterator[Task]:
        """The waiting tasks whose approval timed out by ``now``."""
        timeouts = self.timeouts
        while timeouts and timeouts[0][0] <= now:
            at, tid = heapq.heappop(timeouts)
            task = self.tasks[tid]
            if task.status is _WAITING and task.not_before == at:
                yield task

    def time_out(self, task: Task, now: float) -> None:
        """The approval of ``task`` timed out: its rule's ``on_timeout`` decides."""
        rule = self.approval_for(task)
        if rule is not None and rule.on_timeout == "approve":
            self.approve(task.id, now, "approval timed out: approved by default", by="timeout")
        else:
            self.reject(task.id, now, "approval timed out", by="timeout")
