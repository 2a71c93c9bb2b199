"""The run's book: its task records, where decided changes go, and the one place a change of
a record is applied.

:class:`Book` owns the records (``tasks``), the sink (and the log of the common changes), the
count of unfinished tasks, the time of the last change and the facts of the run (aborted,
out of budget, past its deadline). :meth:`Book.replace` is the one place a change updates the
parts' indexes, and it names which part keeps which: a task in flight holds its resources
(:class:`~planrun.core.scheduling._ready.Readiness`) and loads its worker
(:class:`~planrun.core.scheduling._dispatch.Routing`); a waiting task is awaited
(:class:`~planrun.core.scheduling._gates.Approvals`); a completed task's effect falls due
(:class:`~planrun.core.scheduling._effects.Effects`); a completion releases its dependents.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from planrun.core._ledger import EventName as E
from planrun.core._task import FINAL, Status, Task, advanced
from planrun.core.scheduling._common import (
    _COMPLETED,
    _IN_FLIGHT,
    _RUNNING,
    _WAITING,
    Note,
    RunFacts,
    Sink,
)

__all__ = ["Book"]

_INDEXED = _IN_FLIGHT | {_COMPLETED, _WAITING}
"""The statuses :meth:`Book.index` has something to do for."""
_UNINDEXED = _IN_FLIGHT | {_WAITING}
"""The statuses :meth:`Book.unindex` has something to undo for."""


class _Graph(Protocol):
    """What :class:`Book` needs of readiness: locks taken and freed, dependents released."""

    def lock(self, task: Task) -> None: ...
    def unlock(self, task: Task) -> None: ...
    def released(self, tid: str) -> None: ...


class _Loads(Protocol):
    """What :class:`Book` needs of routing: the workers' loads and active counts."""

    def load(self, task: Task) -> None: ...
    def unload(self, task: Task) -> None: ...


class _Awaiting(Protocol):
    """What :class:`Book` needs of the approval gates: the tasks waiting for a person."""

    awaiting: set[str]


class _Due(Protocol):
    """What :class:`Book` needs of the effects: which kinds have one, a completion's due."""

    kinds: frozenset[str]

    def completed(self, task: Task) -> None: ...


class Book:
    """The records of one run and the one place a change of a record is applied."""

    ready: _Graph
    routing: _Loads
    approvals: _Awaiting
    effects: _Due

    def __init__(self, sink: Sink) -> None:
        self.tasks: dict[str, Task] = {}
        """Task id -> its current record."""
        self.sink = sink
        self.note: Note | None = None
        """Where the common changes' events go as tuples, when a driver asks (see
        :meth:`~planrun.core.scheduling.Scheduler.use_log`)."""
        self.facts = RunFacts()
        self.unfinished = 0
        self.last_change = 0.0
        self.started = False

    def keep(self, ready: _Graph, routing: _Loads, approvals: _Awaiting,
             effects: _Due) -> None:
        """The parts whose indexes :meth:`replace` keeps current."""
        self.ready, self.routing, self.approvals, self.effects = ready, routing, approvals, effects

    @property
    def stopping(self) -> bool:
        """Nothing new starts: aborted, out of budget, or past the deadline."""
        f = self.facts
        return f.aborted_by is not None or f.budget_exhausted or f.deadline_reached

    def touch(self, now: float) -> None:
        """Something changed at ``now`` (the stall clock starts again)."""
        self.last_change = now

    def change(self, task: Task, to: Status, event: str, worker: str | None,
               detail: Mapping[str, Any] | None = None, **changes: Any) -> Task:
        """``task`` moved to ``to`` with ``changes``, applied and handed to the sink."""
        new = advanced(task, to, changes)
        self.replace(task, new)
        self.sink(new, event, worker, detail, task.token)
        return new

    def current(self, task_id: str, token: int, worker: str | None) -> bool:
        """True when ``token`` is the task's running attempt; else log the refusal."""
        task = self.tasks[task_id]
        if task.token == token and task.status is _RUNNING:
            return True
        self.sink(task, E.REJECTED, worker,
                  {"reason": "stale fencing token", "current": task.token}, token)
        return False

    def replace(self, old: Task, new: Task) -> None:
        """Put ``new`` in place of ``old`` and keep every index right (a start on the
        worker a task was assigned to changes only that worker's active count, which
        :meth:`Routing.pump <planrun.core.scheduling._dispatch.Routing.pump>` counts)."""
        tid = new.id
        self.tasks[tid] = new
        was, now_is = old.status, new.status
        if was in _UNINDEXED:
            self.unindex(old)
        if now_is in _INDEXED and (now_is is not _COMPLETED or self.effects.kinds):
            self.index(new)
        if was not in FINAL:
            if now_is in FINAL:
                self.unfinished -= 1
        elif now_is not in FINAL:
            self.unfinished += 1  # a mirror that ran ahead of the store, corrected
        if now_is is _COMPLETED and was is not _COMPLETED:
            self.ready.released(tid)

    def index(self, task: Task) -> None:
        """What ``task``'s status adds to the parts' indexes."""
        status = task.status
        if status is _WAITING:
            self.approvals.awaiting.add(task.id)
        elif status in _IN_FLIGHT:
            if task.resources:
                self.ready.lock(task)
            self.routing.load(task)
        elif status is _COMPLETED:
            self.effects.completed(task)

    def unindex(self, task: Task) -> None:
        """What ``task``'s status added to the parts' indexes, taken off."""
        status = task.status
        if status is _WAITING:
            self.approvals.awaiting.discard(task.id)
        elif status in _IN_FLIGHT:
            self.routing.unload(task)
            if task.resources:
                self.ready.unlock(task)
