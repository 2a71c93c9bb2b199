"""Routing and starting: the workers, who gets a ready task, and when it starts.

:class:`Routing` owns the registered workers (their queues, loads and active counts), the
router that picks among capable ones, the worker a retried task should avoid, and the pause
(while the driver cannot record what would happen, nothing starts). It takes ready tasks from
:class:`~planrun.core.scheduling._ready.Readiness`, assigns each to a worker's queue, and
starts queued tasks while the worker has free slots, each under a lease from
:class:`~planrun.core.scheduling._leases.Leases`.
"""

from __future__ import annotations

from planrun.core._errors import UsageError
from planrun.core._ledger import EventName as E
from planrun.core._registry import WorkerSpec
from planrun.core._routing import Router, WorkerState
from planrun.core._task import Task, assigned, started
from planrun.core.scheduling._book import Book
from planrun.core.scheduling._common import (
    _ASSIGNED,
    _COMPLETED,
    _IN_FLIGHT,
    _RUNNING,
    _STATELESS,
)
from planrun.core.scheduling._leases import Leases
from planrun.core.scheduling._ready import Readiness

__all__ = ["Routing", "Start"]

Start = tuple[WorkerState, Task]
"""An attempt that starts now: the worker, and the task's record (running)."""


class Routing:
    """The workers of one run, who gets a ready task, and when it starts."""

    def __init__(self, book: Book, ready: Readiness, leases: Leases, router: Router) -> None:
        self.book = book
        self.tasks = book.tasks
        self.ready = ready
        self.leases = leases
        self.router = router
        self.workers: dict[str, WorkerState] = {}
        self._capable: dict[str, list[WorkerState]] = {}
        """Kind -> the workers that do it, in registration order (cleared when they change)."""
        self.avoid: dict[str, str] = {}
        """Task id -> the worker its last attempt failed or was reclaimed on."""
        self.paused = False
        """While true nothing starts (the driver cannot record what would happen)."""
        self._held_back = False  # a worker's queue waited for the pause to end
        self.more_starts: list[Start] = []
        """Starts decided beyond the one a finish returned, until :meth:`extra_starts`."""

    def add_worker(self, spec: WorkerSpec) -> WorkerState:
        """Register a worker the router may pick (a name once)."""
        if spec.name in self.workers:
            raise UsageError(f"worker {spec.name!r} is already registered")
        state = WorkerState(spec)
        self.workers[spec.name] = state
        self._capable.clear()
        mine = [t for t in self.tasks.values()
                if t.assigned_to == spec.name and t.status in _IN_FLIGHT]
        state.active = sum(1 for t in mine if t.status is _RUNNING)
        state.load_s = sum(state.cost(t) for t in mine)
        return state

    def capable(self, kind: str) -> bool:
        """True when some registered worker does ``kind``."""
        return any(w.spec.can_do(kind) for w in self.workers.values())

    def dispatch(self, now: float) -> list[Start]:
        """Give every ready task to a worker's queue; return what starts now."""
        ready = self.ready
        touched: list[WorkerState] = []
        if self._held_back and not self.paused:  # the pause is over: start what it held
            self._held_back = False
            touched = [w for w in self.workers.values()
                       if w.queue and w.active < w.spec.capacity]
        elif not ready.heap:  # nothing below changes the facts
            return []
        while ready.heap and not self.paused:
            task = ready.pop(now)
            if task is None:
                continue
            worker = self._route(task)
            if worker is None:
                ready.put_back(task)
                break  # no worker for it yet; the driver refuses this up front
            self._assign(task, worker, now)
            worker.queue.append(task.id)
            if worker.active < worker.spec.capacity and worker not in touched:
                touched.append(worker)
        starts: list[Start] = []
        for worker in touched:
            self.pump(worker, now, starts)
        return starts

    def _route(self, task: Task) -> WorkerState | None:
        candidates = self._capable.get(task.kind)
        if candidates is None:
            candidates = [w for w in self.workers.values() if w.spec.can_do(task.kind)]
            self._capable[task.kind] = candidates
        if not candidates:
            return None
        if len(candidates) == 1 and type(self.router) in _STATELESS:
            return candidates[0]  # the one choice, whatever the strategy
        avoid = self.avoid.get(task.id)
        if avoid is not None and len(candidates) > 1:
            candidates = [w for w in candidates if w.name != avoid] or candidates
        return self.router.pick(task, candidates)

    def _assign(self, task: Task, worker: WorkerState, now: float) -> Task:
        book = self.book
        book.last_change = now
        name = worker.name
        token = task.token
        new = assigned(task, name, None)
        tid = task.id
        self.tasks[tid] = new
        book.index(new)  # pending -> assigned: nothing to undo, nothing finishes
        note = book.note
        if note is None:
            book.sink(new, E.ASSIGNED, name, None, token)
        else:
            note((now, tid, E.ASSIGNED, name, token + 1, None))
        return new

    def pump(self, worker: WorkerState, now: float, starts: list[Start]) -> None:
        """Start ``worker``'s queued tasks while it has free slots (onto ``starts``)."""
        queue = worker.queue
        book = self.book
        while worker.active < worker.spec.capacity and queue and not self.paused:
            task = self.tasks[queue.popleft()]
            if task.status is not _ASSIGNED or task.assigned_to != worker.name:
                continue
            old = task
            lease = self.leases.grant(old.id, old.token, now)
            task = started(old, now, lease)
            # A start on the worker it was assigned to changes one index: the worker's
            # active count (its load and the task's locks were taken at assignment).
            self.tasks[task.id] = task
            worker.active += 1
            note = book.note
            if note is None:
                book.sink(task, E.STARTED, worker.name, None, old.token)
            else:
                note((now, task.id, E.STARTED, worker.name, old.token, None))
            starts.append((worker, task))
            book.last_change = now
        if self.paused and queue and worker.active < worker.spec.capacity:
            self._held_back = True  # dispatch starts them once the pause ends

    def ended(self, worker: WorkerState, task: Task, now: float) -> None:
        """An attempt of ``task`` ended on ``worker``: its tally."""
        if task.status is _COMPLETED:
            worker.done += 1
        if task.started_at is not None:
            worker.busy_s += now - task.started_at

    def extra_starts(self) -> list[Start]:
        """Starts decided beyond the one a finish returned, each handed out once."""
        extra = self.more_starts[:]
        self.more_starts.clear()  # the same list: the scheduler hands it out to read
        return extra

    def load(self, task: Task) -> None:
        """``task`` is in flight: its worker's load (and active count, running) grow."""
        worker = self.workers.get(task.assigned_to or "")
        if worker is not None:
            worker.load_s += worker.cost(task)
            if task.status is _RUNNING:
                worker.active += 1

    def unload(self, task: Task) -> None:
        """``task`` is no longer in flight: what :meth:`load` added, taken off."""
        worker = self.workers.get(task.assigned_to or "")
        if worker is not None:
            load = worker.load_s - worker.cost(task)
            worker.load_s = load if load > 0.0 else 0.0
            if task.status is _RUNNING:
                worker.active -= 1
