"""The scheduling core, readiness and order: the graph, what is ready, in which order."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from planrun.core._errors import UsageError
from planrun.core._ledger import EventName as E
from planrun.core._task import (
    FINAL,
    Task,
    created,
    revised,
)
from planrun.core.scheduling._base import (
    _COMPLETED,
    _DEFAULT_ATTEMPTS,
    _PENDING,
    _WAITING,
    _ZEROS,
    _dependency_order,
    _State,
    _with_joins,
    dependency_order,
)


class _Ready(_State):
    """Readiness and order: the graph, what is ready, in which order."""

    def add(self, tasks: Sequence[Task], now: float, *, default_attempts: int | None = None,
            known: Callable[[str], bool] | None = None) -> list[Task]:
        """Add pending tasks (any order; dependencies in the batch or already added).

        Each gets ``created_at`` and, when it kept the default, ``default_attempts``; each
        is handed to the sink as ``created``. Added to a started run, the ready ones are
        queued at once.

        Raises:
            InvalidPlan: a dependency cycle in the batch.
            UsageError: a duplicate id, an unknown dependency or kind, a task not pending.
        """
        batch = [_with_joins(t) if t.joins else t for t in tasks]
        ordered = self._in_order(batch, known)
        default = _DEFAULT_ATTEMPTS if default_attempts is not None else None
        sink, note, created_event, insert = self._sink, self._note, E.CREATED, self._insert
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
        self._prioritise(new)
        if self.started:
            for task in new:
                self._offer(task.id)
        return new

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

    def restore(self, tasks: Sequence[Task]) -> None:
        """Load stored records as they are (resume, or a coordinator's first read)."""
        ordered = dependency_order(tasks)
        for task in ordered:
            self._insert(task)
            if task.status is _WAITING and task.not_before is not None:
                heapq.heappush(self._approval_timeouts, (task.not_before, task.id))
        self._prioritise(ordered)

    def _insert(self, task: Task) -> None:
        """Take ``task`` into the run: its place in the order, who waits for whom, how many
        of its dependencies it still waits for, and the indexes of its status."""
        tid = task.id
        have = self.tasks
        have[tid] = task
        order = self._order
        order[tid] = len(order)
        waiting = 0
        deps = task.depends_on
        if deps:
            dependents = self._dependents
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
        self._waiting[tid] = waiting
        status = task.status
        if status is not _PENDING:  # a pending task has nothing to index
            if status not in FINAL:
                self.unfinished += 1
            self._index(task)
            if status is _COMPLETED and tid in self._dependents:
                self._released(tid)  # a join widened to it before it was seen, completed
        else:
            self.unfinished += 1

    def _prioritise(self, batch: Sequence[Task]) -> None:
        """Longest path to the end of the graph (critical path) first, when the router asks
        for it; otherwise the order tasks were added in."""
        entry, order = self._entry, self._order
        if not self.router.orders_by_critical_path:
            for t in batch:
                entry[t.id] = (order[t.id], t.id)
            return
        path: dict[str, float] = {}
        known = path.get
        dependents = self._dependents.get
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

    def start(self, now: float) -> None:
        """Begin: queue every ready task."""
        self.started = True
        self.last_change = now
        for tid, task in self.tasks.items():
            if task.status is _PENDING:
                self._offer(tid)

    def _pop_ready(self, now: float) -> Task | None:
        tid = heapq.heappop(self._ready)[-1]
        self._queued.discard(tid)
        task = self.tasks[tid]
        if task.status is not _PENDING or self._waiting[tid]:
            return None  # stale entry
        if task.not_before is not None and task.not_before > now:
            heapq.heappush(self._delayed, (task.not_before, tid, task.token))
            return None
        for r in task.resources:
            if r in self._locks:
                self._parked.setdefault(r, []).append(tid)
                return None
        return task

    @property
    def done(self) -> bool:
        """Every task final, every effect applied or given up on, every replan answered."""
        return not self.unfinished and not self.effects_pending and not self._replans_open

    def _offer(self, tid: str) -> None:
        if tid in self._queued:
            return
        task = self.tasks[tid]
        if task.status is _PENDING and not self._waiting[tid]:
            if (self.approvals or self.task_approvals) and self._needs_start_approval(task):
                if tid not in self._asking:
                    self._asking.append(tid)
                return
            if self._waiting[tid]:
                return
            self._queued.add(tid)
            heapq.heappush(self._ready, self._entry[tid])
