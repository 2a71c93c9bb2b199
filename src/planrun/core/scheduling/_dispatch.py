"""The scheduling core, routing and starting: workers, who gets a ready task, attempts that end."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

from planrun.core._errors import InvalidPlan, UsageError
from planrun.core._ledger import EventName as E
from planrun.core._registry import SpawnRequest, WorkerSpec
from planrun.core._routing import WorkerState
from planrun.core._task import (
    Task,
    assigned,
    completed,
    started,
)
from planrun.core.scheduling._approval import (
    APPROVED,
)
from planrun.core.scheduling._base import (
    _ASSIGNED,
    _COMPLETED,
    _IN_FLIGHT,
    _RUNNING,
    _STATELESS,
    spawn_refused,
)
from planrun.core.scheduling._ready import _Ready


class _Dispatch(_Ready):
    """Routing and starting: workers, who gets a ready task, attempts that end."""

    def add_worker(self, spec: WorkerSpec) -> WorkerState:
        """Register a worker the router may pick (a name once)."""
        if spec.name in self.workers:
            raise UsageError(f"worker {spec.name!r} is already registered")
        state = WorkerState(spec)
        self.workers[spec.name] = state
        self._capable.clear()
        self._count_in(state)
        return state

    def _count_in(self, worker: WorkerState) -> None:
        """A worker the core meets: its load and active count from the tasks in flight on
        it already."""
        mine = [t for t in self.tasks.values()
                if t.assigned_to == worker.name and t.status in _IN_FLIGHT]
        worker.active = sum(1 for t in mine if t.status is _RUNNING)
        worker.load_s = sum(worker.cost(t) for t in mine)

    def capable(self, kind: str) -> bool:
        """True when some registered worker does ``kind``."""
        return any(w.spec.can_do(kind) for w in self.workers.values())

    def dispatch(self, now: float) -> list[tuple[WorkerState, Task]]:
        """In-process: give every ready task to a worker's queue; return what starts now."""
        if self._asking:
            self._ask(now)
        if self.stopping:
            return []
        touched: list[WorkerState] = []
        if self._held_back and not self.paused:  # the pause is over: start what it held
            self._held_back = False
            touched = [w for w in self.workers.values()
                       if w.queue and w.active < w.spec.capacity]
        elif not self._ready:  # nothing below changes the facts
            return []
        while self._ready and not self.paused:
            task = self._pop_ready(now)
            if task is None:
                continue
            worker = self._route(task)
            if worker is None:
                self._queued.add(task.id)
                heapq.heappush(self._ready, self._entry[task.id])
                break  # no worker for it yet; _check_workers refuses this up front
            self._assign(task, worker, now)
            worker.queue.append(task.id)
            if worker.active < worker.spec.capacity and worker not in touched:
                touched.append(worker)
        starts: list[tuple[WorkerState, Task]] = []
        for worker in touched:
            self._pump(worker, now, starts)
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
        avoid = self._avoid.get(task.id)
        if avoid is not None and len(candidates) > 1:
            candidates = [w for w in candidates if w.name != avoid] or candidates
        return self.router.pick(task, candidates)

    def _assign(self, task: Task, worker: WorkerState, now: float) -> Task:
        self.last_change = now
        name = worker.name
        token = task.token
        new = assigned(task, name, None)
        tid = task.id
        self.tasks[tid] = new
        self._index(new)  # pending -> assigned: nothing to undo, nothing finishes
        note = self._note
        if note is None:
            self._sink(new, E.ASSIGNED, name, None, token)
        else:
            note((now, tid, E.ASSIGNED, name, token + 1, None))
        return new

    def _pump(self, worker: WorkerState, now: float,
              starts: list[tuple[WorkerState, Task]]) -> None:
        queue = worker.queue
        while worker.active < worker.spec.capacity and queue and not self.paused:
            task = self.tasks[queue.popleft()]
            if task.status is not _ASSIGNED or task.assigned_to != worker.name:
                continue
            lease = now + self.stale_after
            old = task
            task = started(old, now, lease)
            tid = task.id
            self._replace(old, task)
            note = self._note
            if note is None:
                self._sink(task, E.STARTED, worker.name, None, old.token)
            else:
                note((now, tid, E.STARTED, worker.name, old.token, None))
            heapq.heappush(self._leases, (lease, tid, old.token))
            starts.append((worker, task))
            self.last_change = now
        if self.paused and queue and worker.active < worker.spec.capacity:
            self._held_back = True  # dispatch starts them once the pause ends

    def current(self, task_id: str, token: int, worker: str | None) -> bool:
        """True when ``token`` is the task's running attempt; else log the refusal."""
        task = self.tasks[task_id]
        if task.token == token and task.status is _RUNNING:
            return True
        self._sink(task, E.REJECTED, worker,
                   {"reason": "stale fencing token", "current": task.token}, token)
        return False

    def complete(self, task_id: str, token: int, result: Any, now: float,
                 worker: str | None, spawned: Sequence[SpawnRequest] = ()) -> bool:
        """An attempt returned ``result``; False when it was fenced off.

        ``spawned``: the tasks the attempt asked to add. They are validated first; an
        invalid addition makes the task dead (permanent) with every problem listed, and
        adds nothing. A valid one is handed to the sink right after the completion, so a
        driver writes both together.
        """
        task = self.tasks[task_id]
        if task.token != token or task.status is not _RUNNING:
            return self.current(task_id, token, worker)  # logs the refusal
        addition = None
        if spawned:
            try:
                addition = self.expansion(task, spawned, now)
            except InvalidPlan as exc:
                return self.fail(task_id, token, spawn_refused(exc), now, worker)
        detail = {"spawned": len(addition.tasks)} if addition is not None else None
        rule = self.approval_for(task) if self.approvals or self.task_approvals else None
        if rule is not None and rule.before == "effect" and task.cause != APPROVED \
                and rule.applies(task.evolve(result=result)):
            self._wait(task, "effect", now, worker, result=result, attempts=task.attempts + 1,
                       lease=None, error=None, error_class=None)
        else:
            new = completed(task, result, now)
            self._replace(task, new)
            note = self._note
            if note is None:
                self._sink(new, E.COMPLETED, worker, detail, token)
            else:
                note((now, task_id, E.COMPLETED, worker, token, detail))
        if addition is not None:
            self.grow(addition, now)
        self.last_change = now  # touch
        return True

    def finish(self, worker: WorkerState, task_id: str, token: int, result: Any,
               now: float) -> Task | bool:
        """An attempt of ``task_id`` on ``worker`` returned ``result`` and spawned nothing:
        :meth:`complete`, then :meth:`release` with ``dispatch=False``, in one call. Returns
        the start of ``worker``'s next queued task (the record, running), True when nothing
        starts on it, False when the outcome was fenced off. Further starts (a worker with
        more free slots than the attempt that ended) wait in :meth:`extra_starts`.
        """
        if not self.complete(task_id, token, result, now, worker.name):
            return False
        starts = self.release(worker, self.tasks[task_id], now, dispatch=False)
        if len(starts) > 1:
            self.more_starts.extend(starts[1:])
        return starts[0][1] if starts else True

    def extra_starts(self) -> list[tuple[WorkerState, Task]]:
        """Starts :meth:`finish` decided beyond the one it returned (a worker whose free
        slots outnumber the attempt that ended), each handed out once."""
        extra, self.more_starts = self.more_starts, []
        return extra

    def release(self, worker: WorkerState, task: Task, now: float, *,
                dispatch: bool = True) -> list[tuple[WorkerState, Task]]:
        """After an attempt ended on ``worker``: what starts now (queued work, freed locks).

        ``dispatch=False``: only what ``worker`` has queued starts; what became ready (a
        dependent, a task a freed lock held back) waits for the driver's next
        :meth:`dispatch`, which gives the ready tasks of several outcomes out at once.
        """
        if task.status is _COMPLETED:
            worker.done += 1
        if task.started_at is not None:
            worker.busy_s += now - task.started_at
        starts = self.dispatch(now) if dispatch and self._ready else []
        if worker.queue and worker.active < worker.spec.capacity:  # else nothing to start
            self._pump(worker, now, starts)
        return starts
