"""Readiness and order: the graph, what is ready, in which order.

:class:`Readiness` owns the run's graph (who depends on whom, how many dependencies each task
still waits for, the order tasks were added in), the ready heap (by critical path under a
router that asks for it), the tasks held back until a time (a retry's, or a record's
``not_before``), and the resource locks with the tasks parked behind them. A task is ready when
its dependencies completed, its time came and its resources are free; a task that needs
approval before it starts is handed to the start gate instead of the heap.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence

from planrun.core._errors import UsageError
from planrun.core._ledger import EventName as E
from planrun.core._ledger import repair_events
from planrun.core._problem import Repair
from planrun.core._task import FINAL, Task, created, revised
from planrun.core.scheduling._book import Book
from planrun.core.scheduling._common import (
    _COMPLETED,
    _DEFAULT_ATTEMPTS,
    _PENDING,
    _ZEROS,
    Entry,
    _dependency_order,
    _with_joins,
    dependency_order,
)

__all__ = ["Readiness"]


class Readiness:
    """The graph of one run, what is ready in it, and in which order.

    Args:
        book: the run's records.
        critical_path: order the ready tasks by their longest path to the end of the graph
            (else by the order they were added in).
    """

    def __init__(self, book: Book, *, critical_path: bool) -> None:
        self.book = book
        self.tasks = book.tasks
        self.critical_path = critical_path
        self.gate: Callable[[Task], bool] | None = None
        """The start gate: True when a ready task waits for a person instead (and the gate
        took it); None when the run has no approvals."""
        self.order: dict[str, int] = {}
        self.dependents: dict[str, list[str]] = {}
        """Task id -> the ids that depend on it (no entry when none does)."""
        self.waiting: dict[str, int] = {}
        """Task id -> how many of its dependencies have not completed."""
        self.entry: dict[str, Entry] = {}
        """Task id -> its entry in the ready heap: ``(order, id)``, or under a critical-path
        router ``(-longest path to the end, order, id)`` (flat: cheaper to compare)."""
        self.heap: list[Entry] = []
        self.queued: set[str] = set()
        """Ids with an entry in the heap."""
        self.delayed: list[tuple[float, str, int]] = []
        """``(time, id, token)``: tasks not to start before a time (a retry's)."""
        self.locks: dict[str, str] = {}
        """Resource -> the id of the task in flight that holds it."""
        self.parked: dict[str, list[str]] = {}
        """Resource -> ready tasks waiting for it to be freed."""

    def add(self, tasks: Sequence[Task], now: float, *, default_attempts: int | None = None,
            known: Callable[[str], bool] | None = None) -> list[Task]:
        """See :meth:`planrun.core.scheduling.Scheduler.add`."""
        batch = [_with_joins(t) if t.joins else t for t in tasks]
        ordered = self._in_order(batch, known)
        default = _DEFAULT_ATTEMPTS if default_attempts is not None else None
        book = self.book
        sink, note, created_event, insert = book.sink, book.note, E.CREATED, self.insert
        new: list[Task] = []
        append = new.append
        for task in ordered:
            if task.created_at is None:
                task = created(task, now, default_attempts if task.max_attempts == default
                               else None)
            elif task.max_attempts == default:
                task = revised(task, {"max_attempts": default_attempts})
            insert(task)
            if note is None:
                sink(task, created_event, None, None, task.token)
            else:
                note((now, task.id, created_event, None, task.token, None))
            append(task)
        self.prioritise(new)
        if book.started:
            for task in new:
                self.offer(task.id)
        return new

    def repaired(self, tasks: Sequence[Task], repairs: Sequence[Repair]) -> None:
        """Hand the sink one ``repaired`` event per repair of the plan ``tasks`` are (added
        already, given in the plan's order): on the task :func:`~planrun.core.repair_events`
        names, after their ``created`` events, changing no record."""
        book = self.book
        for task_id, detail in repair_events(repairs, [t.id for t in tasks]):
            task = book.tasks[task_id]
            book.sink(task, E.REPAIRED, None, detail, task.token)

    def _in_order(self, batch: list[Task], known: Callable[[str], bool] | None) -> list[Task]:
        """``batch`` checked (unique new ids, known kinds and dependencies, pending) and in
        an order where every dependency comes first.

        Raises:
            InvalidPlan: a dependency cycle in the batch.
            UsageError: a duplicate id, an unknown dependency or kind, a task not pending.
        """
        have = self.tasks
        # One pass for the checks that need no order, and for whether the order given is
        # already one where every dependency comes first (then nothing is sorted).
        position: dict[str, int] = {}
        kinds: set[str] = set()
        pending = _PENDING
        in_order = True
        for i, task in enumerate(batch):
            tid = task.id
            if tid in position:
                raise UsageError("duplicate task ids in one batch")
            if tid in have:
                raise UsageError(f"task id {tid!r} is already in this run")
            deps = task.depends_on
            if deps and in_order:
                for d in deps:
                    if d not in position and d not in have:
                        in_order = False  # a later task of the batch, or an unknown one
                        break
            if known is not None and task.kind not in kinds:
                if not known(task.kind):
                    raise UsageError(f"task {tid!r}: kind {task.kind!r} is not registered")
                kinds.add(task.kind)
            if task.status is not pending:
                raise UsageError(f"task {tid!r} must be pending to be added")
            position[tid] = i
        if in_order:
            return batch
        for task in batch:
            unknown = [d for d in task.depends_on if d not in have and d not in position]
            if unknown:
                raise UsageError(
                    f"task {task.id!r} depends on unknown or later task(s) {unknown}")
        return _dependency_order(batch)[0]  # a cycle raises InvalidPlan

    def restore(self, tasks: Sequence[Task]) -> list[Task]:
        """Load stored records as they are; returns them in dependency order."""
        ordered = dependency_order(tasks)
        for task in ordered:
            self.insert(task)
        self.prioritise(ordered)
        return ordered

    def insert(self, task: Task) -> None:
        """Take ``task`` into the run: its place in the order, who waits for whom, how many
        of its dependencies it still waits for, and the indexes of its status."""
        tid = task.id
        have = self.tasks
        have[tid] = task
        order = self.order
        order[tid] = len(order)
        waiting = 0
        deps = task.depends_on
        if deps:
            dependents = self.dependents
            completed_ = _COMPLETED
            for dep in deps:
                below = dependents.get(dep)
                if below is None:
                    dependents[dep] = [tid]
                else:
                    below.append(tid)
                other = have.get(dep)
                if other is None or other.status is not completed_:
                    waiting += 1
        self.waiting[tid] = waiting
        status = task.status
        if status is not _PENDING:  # a pending task has nothing to index
            if status not in FINAL:
                self.book.unfinished += 1
            self.book.index(task)
            if status is _COMPLETED:
                self.released(tid)  # a join widened to it before it was seen, completed
        else:
            self.book.unfinished += 1

    def prioritise(self, batch: Sequence[Task]) -> None:
        """Longest path to the end of the graph (critical path) first, when the router asks
        for it; otherwise the order tasks were added in."""
        entry, order = self.entry, self.order
        if not self.critical_path:
            for t in batch:
                entry[t.id] = (order[t.id], t.id)
            return
        path: dict[str, float] = {}
        known = path.get
        dependents = self.dependents.get
        for t in reversed(batch):
            tid = t.id
            below = dependents(tid)
            if below:
                if len(below) == 1:
                    longest = t.estimate_s + known(below[0], 0.0)
                else:
                    longest = t.estimate_s + max(map(known, below, _ZEROS))
            else:
                longest = t.estimate_s
            path[tid] = longest
            entry[tid] = (-longest, order[tid], tid)

    def rewire(self, old: Task, new: Task) -> None:
        """``new`` is ``old`` with more dependencies (a join widened)."""
        tid = new.id
        before = set(old.depends_on)
        for dep in new.depends_on:
            if dep not in before:
                self.dependents.setdefault(dep, []).append(tid)
        self.tasks[tid] = new
        self.waiting[tid] = sum(
            1 for d in new.depends_on
            if (t := self.tasks.get(d)) is None or t.status is not _COMPLETED)
        if self.book.started:
            self.offer(tid)

    def start(self, now: float) -> None:
        """Begin: queue every ready task."""
        self.book.started = True
        self.book.last_change = now
        for tid, task in self.tasks.items():
            if task.status is _PENDING:
                self.offer(tid)

    def offer(self, tid: str) -> None:
        """Queue ``tid`` if it is ready (or hand it to the start gate)."""
        if tid in self.queued:
            return
        task = self.tasks[tid]
        if task.status is _PENDING and not self.waiting[tid]:
            if self.gate is not None and self.gate(task):
                return
            self.queued.add(tid)
            heapq.heappush(self.heap, self.entry[tid])

    def pop(self, now: float) -> Task | None:
        """The next ready task off the heap, or None for an entry that turned out not to be
        (stale, not before a later time, or its resource held)."""
        tid = heapq.heappop(self.heap)[-1]
        self.queued.discard(tid)
        task = self.tasks[tid]
        if task.status is not _PENDING or self.waiting[tid]:
            return None  # stale entry
        if task.not_before is not None and task.not_before > now:
            heapq.heappush(self.delayed, (task.not_before, tid, task.token))
            return None
        for r in task.resources:
            if r in self.locks:
                self.parked.setdefault(r, []).append(tid)
                return None
        return task

    def put_back(self, task: Task) -> None:
        """``task`` came off the heap and found no worker: it waits at its place."""
        self.queued.add(task.id)
        heapq.heappush(self.heap, self.entry[task.id])

    def released(self, tid: str) -> None:
        """``tid`` completed: each dependent waits for one dependency less."""
        dependents = self.dependents.get(tid)
        if dependents:
            waiting = self.waiting
            started = self.book.started
            for dep in dependents:
                left = waiting[dep] - 1
                waiting[dep] = left
                if not left and started:
                    self.offer(dep)

    def delay(self, tid: str, at: float, token: int) -> None:
        """``tid`` (at ``token``) is not looked at again before ``at``."""
        heapq.heappush(self.delayed, (at, tid, token))

    def due(self, now: float) -> Iterator[Task]:
        """The delayed tasks whose time came by ``now`` (still at the token delayed)."""
        delayed = self.delayed
        while delayed and delayed[0][0] <= now:
            _, tid, token = heapq.heappop(delayed)
            task = self.tasks[tid]
            if task.token == token:
                yield task

    def lock(self, task: Task) -> None:
        """``task`` is in flight: it holds its resources."""
        for r in task.resources:
            self.locks[r] = task.id

    def unlock(self, task: Task) -> None:
        """``task`` is no longer in flight: its resources are free, and the tasks parked
        behind them are offered again."""
        freed: list[str] = []
        for r in task.resources:
            if self.locks.get(r) == task.id:
                del self.locks[r]
                freed.append(r)
        for r in freed:
            for tid in self.parked.pop(r, ()):
                self.offer(tid)
