"""The supervisor: a code-enforced dispatch loop that owns the task set.

It assigns each task to exactly one worker when the task becomes ready, tracks what is
outstanding, retries transient failures with backoff and jitter, gives up on permanent
ones, reclaims tasks whose lease expired, cancels what depends on a dead task, keeps tasks
that share a resource apart, and applies side effects once. It never does domain work and
knows nothing of prompts or models: handlers do the work.

It is event driven: readiness comes from dependency counting and a priority queue, leases
from a heap of deadlines, so the cost per task stays flat as plans grow.
"""

from __future__ import annotations

import asyncio
import functools
import graphlib
import heapq
import inspect
import random
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ValidationError

from planrun.clock import Clock, RealClock, run_blocking
from planrun.errors import (
    BudgetExceeded,
    DispatchError,
    ErrorClass,
    InvalidPlan,
    PermanentError,
    RunAborted,
    StallError,
    StoreError,
    TransientError,
    UsageError,
    classify,
)
from planrun.ledger import Audit, Event, Ledger, analyze
from planrun.registry import Handler, KindSpec, Registry, TaskContext, WorkerSpec
from planrun.routing import Router, WorkerState, get_router
from planrun.task import FINAL, Status, Task, transition

if TYPE_CHECKING:
    from planrun.stores.base import Store

__all__ = ["Backoff", "EffectFn", "RunResult", "Supervisor"]

EffectFn = Callable[[Task, str], Any | Awaitable[Any]]
"""``effect(task, key)``: apply a side effect of a completed task, once, keyed by ``key``."""

OnDead = Literal["cancel_dependents", "abort_run"]


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: attempt 1 waits ~base, 2 ~2*base, ... up to cap."""

    base: float = 2.0
    cap: float = 60.0
    jitter: float = 0.25
    """Spread as a fraction: 0.25 draws from 75 % to 125 % of the nominal delay."""

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait after the ``attempt``-th failure."""
        nominal = min(self.cap, self.base * 2.0 ** (attempt - 1))
        return float(nominal * rng.uniform(1 - self.jitter, 1 + self.jitter))


@dataclass(frozen=True)
class RunResult:
    """The outcome of a run: final records, the ledger and its audit."""

    run_id: str
    tasks: Mapping[str, Task]
    events: Sequence[Event]
    audit: Audit
    started_at: float
    finished_at: float
    aborted_by: str | None = None
    """Id of the task whose death aborted the run (``on_dead="abort_run"``)."""
    budget_exhausted: bool = False
    workers: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """Per worker: ``tasks`` completed and ``busy_s`` spent."""

    @property
    def counts(self) -> dict[str, int]:
        """Tasks by status (every status present, zero included)."""
        counts = {s.value: 0 for s in Status}
        for t in self.tasks.values():
            counts[t.status.value] += 1
        return counts

    @property
    def ok(self) -> bool:
        """Every task completed."""
        return all(t.status is Status.COMPLETED for t in self.tasks.values())

    @property
    def makespan(self) -> float:
        """Seconds from the start of the run to its end."""
        return self.finished_at - self.started_at

    def raise_for_status(self) -> None:
        """Raise :class:`RunAborted` or :class:`DispatchError` unless every task completed."""
        if self.aborted_by is not None:
            raise RunAborted(f"run {self.run_id} aborted: task {self.aborted_by!r} died")
        if not self.ok:
            bad = {k: v for k, v in self.counts.items() if v and k != "completed"}
            raise DispatchError(f"run {self.run_id} finished with {bad}")


class Supervisor:
    """Owns a run's tasks and drives them to completion through registered workers.

    Args:
        registry: the kinds that exist, with their handlers.
        workers: the workers; default one worker doing every kind, 8 at a time.
        strategy: ``round_robin``, ``least_loaded``, ``capability`` or ``balanced``.
        max_attempts: attempts per task before it is ``dead`` (a task may override it).
        backoff: delay between attempts (``Backoff(base=2, cap=60, jitter=0.25)``).
        retry_budget: retries allowed over the whole run; ``None`` for no limit.
        timeout: seconds one attempt may take before it counts as a transient failure
            (a kind's ``KindSpec.timeout_s`` overrides it).
        stale_after: seconds without a heartbeat after which a running task is reclaimed.
        max_reclaims: reclaims after which a task is ``dead`` instead of tried again.
        on_dead: ``cancel_dependents`` (default) or ``abort_run``.
        stall_after: seconds without any task record changing before :class:`StallError`.
        clock: :class:`RealClock` (default) or :class:`VirtualClock`.
        effects: kind -> effect applied once after a task of that kind completes.
        on_event: called with each ledger event and the task record after it.
        extras: objects handed to every handler through ``TaskContext.extras``.
        seed: seed of the jitter's random generator (for reproducible runs).
        store: an opened :class:`~planrun.stores.Store`; every transition and its event are
            written to it (in batches, each batch one transaction) so a run survives a
            crash and :meth:`resume` carries it on.
        goal, meta: recorded with the run in the store.
        store_patience: seconds a failing store is retried (a database restart) before the
            run stops with :class:`StoreError`.
    """

    def __init__(
        self,
        registry: Registry,
        workers: Iterable[WorkerSpec] | None = None,
        *,
        strategy: str | Router = "balanced",
        max_attempts: int = 3,
        backoff: Backoff | None = None,
        retry_budget: int | None = None,
        timeout: float | None = None,
        stale_after: float = 90.0,
        max_reclaims: int = 3,
        on_dead: OnDead = "cancel_dependents",
        stall_after: float = 900.0,
        clock: Clock | None = None,
        run_id: str | None = None,
        effects: Mapping[str, EffectFn] | None = None,
        on_event: Callable[[Event, Task], None] | None = None,
        extras: Mapping[str, Any] | None = None,
        seed: int | None = None,
        store: Store | None = None,
        goal: str = "",
        meta: Mapping[str, Any] | None = None,
        store_patience: float = 120.0,
    ) -> None:
        if on_dead not in ("cancel_dependents", "abort_run"):
            raise UsageError(f"on_dead must be 'cancel_dependents' or 'abort_run', not {on_dead!r}")
        if max_attempts < 1:
            raise UsageError("max_attempts must be >= 1")
        if stale_after <= 0 or stall_after <= 0:
            raise UsageError("stale_after and stall_after must be > 0")
        _check_limits(retry_budget, timeout)
        self.registry = registry
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.clock: Clock = clock or RealClock()
        self._router = get_router(strategy)
        self.max_attempts = max_attempts
        self.backoff = backoff or Backoff()
        self.retry_budget = retry_budget
        self.timeout = timeout
        self.stale_after = stale_after
        self.max_reclaims = max_reclaims
        self.on_dead: OnDead = on_dead
        self.stall_after = stall_after
        self.effects = dict(effects or {})
        self.on_event = on_event
        self.extras = dict(extras or {})
        self._rng = random.Random(seed)
        self._workers: dict[str, WorkerState] = {}
        for spec in workers if workers is not None else [WorkerSpec("worker", None, 8)]:
            self.register(spec)
        self.ledger = Ledger()
        self._tasks: dict[str, Task] = {}
        self._order: dict[str, int] = {}
        self._dependents: dict[str, list[str]] = {}
        self._waiting: dict[str, int] = {}
        self._priority: dict[str, tuple[float, int]] = {}
        self._ready: list[tuple[tuple[float, int], str]] = []
        self._leases: list[tuple[float, str, int]] = []
        self._locks: dict[str, str] = {}
        self._avoid: dict[str, str] = {}
        self._running: dict[str, asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._zombies: set[asyncio.Task[None]] = set()
        self._applied: set[str] = set()
        self._effect_logged: set[str] = set()
        self._unfinished = 0
        self._retries_used = 0
        self._aborted_by: str | None = None
        self._budget_exhausted = False
        self._wake: asyncio.Event | None = None
        self._last_change = 0.0
        self._started = False
        self.store = store
        self.goal = goal
        self.meta = dict(meta or {})
        self.store_patience = store_patience
        self._resumed = False
        self._closing = False
        self._effect_records: dict[str, Any] = {}
        self._pending: list[tuple[Task, Event]] = []
        self._dirty: asyncio.Event | None = None
        self._flush_lock: asyncio.Lock | None = None
        self._flusher: asyncio.Task[None] | None = None

    # ---- setup -----------------------------------------------------------------------------

    def register(self, worker: WorkerSpec) -> None:
        """Add a worker; names are unique."""
        if worker.name in self._workers:
            raise UsageError(f"worker {worker.name!r} is already registered")
        self._workers[worker.name] = WorkerState(worker)

    def add(self, task: Task) -> Task:
        """Add one task; its dependencies must already be added."""
        return self.add_tasks([task])[0]

    def add_tasks(self, tasks: Iterable[Task]) -> list[Task]:
        """Add tasks in any order; dependencies must be in the batch or already added.

        Raises:
            InvalidPlan: the batch has a dependency cycle.
            UsageError: a duplicate id, an unknown dependency or kind, or a started run.
        """
        if self._started:
            raise UsageError("tasks cannot be added once the run has started")
        added: list[Task] = []
        now = self.clock.now()
        for task in _dependency_order(list(tasks)):
            if task.id in self._tasks:
                raise UsageError(f"task id {task.id!r} is already in this run")
            unknown = [d for d in task.depends_on if d not in self._tasks]
            if unknown:
                raise UsageError(f"task {task.id!r} depends on unknown or later task(s) {unknown}")
            if task.kind not in self.registry:
                raise UsageError(f"task {task.id!r}: kind {task.kind!r} is not registered")
            if task.status is not Status.PENDING:
                raise UsageError(f"task {task.id!r} must be pending to be added")
            changes: dict[str, Any] = {"created_at": task.created_at or now}
            if task.max_attempts == Task.__dataclass_fields__["max_attempts"].default:
                changes["max_attempts"] = self.max_attempts
            task = task.evolve(**changes)
            self._insert(task)
            self._log(task, "created")
            added.append(task)
        return added

    def _insert(self, task: Task) -> None:
        self._tasks[task.id] = task
        self._order[task.id] = len(self._order)
        self._dependents[task.id] = []
        for dep in task.depends_on:
            self._dependents[dep].append(task.id)
        self._waiting[task.id] = sum(
            1 for d in task.depends_on if self._tasks[d].status is not Status.COMPLETED
        )
        if task.status not in FINAL:
            self._unfinished += 1

    @property
    def tasks(self) -> Mapping[str, Task]:
        """Current records by id (read-only view)."""
        return dict(self._tasks)

    # ---- running ---------------------------------------------------------------------------

    def run(self) -> RunResult:
        """Run to completion from synchronous code (under the supervisor's clock).

        Inside a running event loop (a notebook) the run happens on a private thread.
        """
        return run_blocking(self.clock, self.arun)

    async def arun(self) -> RunResult:
        """Run every task to a final status and return the result.

        Raises:
            StallError: task records stopped changing for ``stall_after`` seconds.
        """
        self.clock.check_loop()
        if self._started:
            raise UsageError("a supervisor runs once; create a new one")
        self._started = True
        self._check_workers()
        self._wake = asyncio.Event()
        started = self.clock.now()
        self._last_change = started
        self._compute_priorities()
        await self._open_run(started)
        status = "failed"
        try:
            if self._resumed:
                self._recover()
            for task_id, task in self._tasks.items():
                if self._waiting[task_id] == 0 and task.status is Status.PENDING:
                    self._push_ready(task_id)
            self._dispatch()
            await self._loop()
            status = "aborted" if self._aborted_by else "finished"
        finally:
            leftovers = [*self._running.values(), *self._background, *self._zombies]
            for handle in leftovers:
                handle.cancel()
            if leftovers:
                await asyncio.gather(*leftovers, return_exceptions=True)
            await self._close_run(status)
        return self._result(started)

    async def aresume(self) -> RunResult:
        """Carry on the run ``run_id`` from the store after a crash or a stop.

        Completed tasks keep their results and never run again; tasks that were assigned
        or running under the dead supervisor are reclaimed (no attempt is consumed; the
        reclaim counts toward ``max_reclaims``); backoff deadlines are kept; effects begun
        but not recorded are applied again with the same key.
        """
        if self.store is None:
            raise UsageError("resume needs a store")
        if self._tasks:
            raise UsageError("resume loads its tasks from the store; add none")
        state = await self.store.load(self.run_id)
        self.goal = self.goal or state.run.goal
        self.meta = {**state.run.meta, **self.meta}
        self.ledger = Ledger(state.events)
        self._effect_records = dict(state.effects)
        self._effect_logged = {e.task for e in state.events if e.event == "effect"}
        # Every "failed" event spent one retry of the budget (a death is logged as "dead").
        self._retries_used = sum(1 for e in state.events if e.event == "failed")
        for task in _dependency_order(list(state.tasks)):
            self._insert(task)
        self._resumed = True
        return await self.arun()

    def resume(self) -> RunResult:
        """Synchronous :meth:`aresume` (on a private thread inside a running loop)."""
        return run_blocking(self.clock, self.aresume)

    # ---- durability ----------------------------------------------------------------------

    async def _open_run(self, now: float) -> None:
        if self.store is None:
            return
        from planrun.stores.base import RunInfo

        self._dirty = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        if self._resumed:
            await self.store.set_run_status(self.run_id, "running")
        else:
            await self.store.create_run(RunInfo(self.run_id, now, "running", self.goal, self.meta))
            await self.store.add_tasks(self.run_id, list(self._tasks.values()),
                                       list(self.ledger.events))
        self._flusher = asyncio.ensure_future(self._flush_forever())
        self._flusher.add_done_callback(lambda _: self._wake_up())

    async def _close_run(self, status: str) -> None:
        if self.store is None:
            return
        if self._flusher is not None and self._dirty is not None:
            # Never cancel a write in flight: a cancelled batch may or may not have been
            # committed. Ask the flusher to drain and finish instead.
            self._closing = True
            self._dirty.set()
            await asyncio.gather(self._flusher, return_exceptions=True)
        await self._flush()
        await self.store.set_run_status(self.run_id, status)

    async def _flush_forever(self) -> None:
        assert self._dirty is not None
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            await self._flush()
            if self._closing and not self._pending:
                return

    async def _flush(self) -> None:
        """Write what changed, batch by batch; ride out a store that is briefly down."""
        if self.store is None or self._flush_lock is None:
            return
        async with self._flush_lock:
            delay, deadline = 0.2, self.clock.now() + self.store_patience
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    await self.store.write(self.run_id, batch)
                except Exception as exc:  # an UnstorableValue is raised at once
                    self._pending[:0] = batch  # keep order; nothing is lost
                    if not isinstance(exc, StoreError) or self.clock.now() >= deadline:
                        raise
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)

    def _recover(self) -> None:
        """Turn the state a dead supervisor left into a state this one can run."""
        now = self.clock.now()
        loop = asyncio.get_running_loop()
        for task in list(self._tasks.values()):
            if task.status in (Status.ASSIGNED, Status.RUNNING):
                if task.reclaims >= self.max_reclaims:
                    error = f"reclaimed {task.reclaims} times without a result; giving up"
                    task = self._set(task, Status.DEAD, "dead", worker=task.assigned_to,
                                     error=error, error_class=ErrorClass.TRANSIENT,
                                     finished_at=now, lease=None, detail={"error": error})
                    self._after_death(task)
                    continue
                self._set(task, Status.PENDING, "reclaimed", worker=task.assigned_to,
                          reclaims=task.reclaims + 1, assigned_to=None, lease=None,
                          detail={"reason": "supervisor restart"})
            elif task.status is Status.FAILED:
                due = max(0.0, (task.not_before or now) - now)
                loop.call_later(due, self._retry_due, task.id)
            elif task.status is Status.DEAD:
                self._after_death(task)
        for task in self._tasks.values():
            if task.status is Status.COMPLETED and task.kind in self.effects:
                record = self._effect_records.get(task.id)
                if record is None or record.state != "applied":
                    self._spawn(self._apply_effect(task))
                else:  # applied, and its event written with it
                    self._applied.add(task.id)
                    self._effect_logged.add(task.id)

    async def _loop(self) -> None:
        """Sleep until the run ends, the next lease deadline, or the stall deadline.

        Transitions do not wake this loop: dispatch happens in the callbacks that cause
        them. It wakes for the end of the run and for timers only.
        """
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while self._unfinished or self._background:
            self._wake.clear()
            if self._flusher is not None and self._flusher.done():
                self._flusher.result()  # a store that stayed down: raise its StoreError
            now = self.clock.now()
            self._reclaim_expired(now)
            if now - self._last_change >= self.stall_after:
                raise StallError(self._stall_message(now))
            if not self._unfinished and not self._background:
                break
            deadline = self._last_change + self.stall_after
            if self._leases:
                deadline = min(deadline, self._leases[0][0])
            timer = loop.call_later(max(0.0, deadline - now), self._wake.set)
            try:
                await self._wake.wait()
            finally:
                timer.cancel()

    def _check_workers(self) -> None:
        for task in self._tasks.values():
            if not any(w.spec.can_do(task.kind) for w in self._workers.values()):
                raise UsageError(f"no registered worker does kind {task.kind!r} (task {task.id!r})")

    def _compute_priorities(self) -> None:
        """Longest path to the end of the graph (critical path) for ``balanced``; else order."""
        if not self._router.orders_by_critical_path:
            for tid, idx in self._order.items():
                self._priority[tid] = (0.0, idx)
            return
        path: dict[str, float] = {}
        for tid in reversed(list(self._tasks)):
            below = max((path[d] for d in self._dependents[tid]), default=0.0)
            path[tid] = self._tasks[tid].estimate_s + below
            self._priority[tid] = (-path[tid], self._order[tid])

    def _push_ready(self, task_id: str) -> None:
        heapq.heappush(self._ready, (self._priority[task_id], task_id))

    # ---- dispatch ----------------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Assign every ready task to one worker, then let workers start what they can."""
        touched: set[str] = set()
        while self._ready and not self._stopping:
            _, task_id = heapq.heappop(self._ready)
            task = self._tasks[task_id]
            if task.status is not Status.PENDING:
                continue
            worker = self._route(task)
            self._set(task, Status.ASSIGNED, "assigned", worker=worker.name,
                      assigned_to=worker.name, token=task.token + 1)
            worker.queue.append(task_id)
            worker.load_s += worker.cost(task)
            touched.add(worker.name)
        for name in touched:
            self._pump(self._workers[name])

    @property
    def _stopping(self) -> bool:
        return self._aborted_by is not None or self._budget_exhausted

    def _route(self, task: Task) -> WorkerState:
        candidates = [w for w in self._workers.values() if w.spec.can_do(task.kind)]
        avoid = self._avoid.get(task.id)
        if avoid is not None and len(candidates) > 1:
            candidates = [w for w in candidates if w.name != avoid]
        return self._router.pick(task, candidates)

    def _pump(self, worker: WorkerState) -> None:
        """Start queued tasks on ``worker`` while it has free capacity."""
        queue = worker.queue
        i = 0
        while worker.active < worker.spec.capacity and i < len(queue):
            task = self._tasks[queue[i]]
            if task.resources and any(r in self._locks for r in task.resources):
                i += 1  # blocked by a resource another task holds; try the next one
                continue
            if i == 0:
                queue.popleft()
            else:
                del queue[i]
            self._start(worker, task)

    def _start(self, worker: WorkerState, task: Task) -> None:
        now = self.clock.now()
        for r in task.resources:
            self._locks[r] = task.id
        lease = now + self.stale_after
        task = self._set(task, Status.RUNNING, "started", worker=worker.name,
                         started_at=now, lease=lease)
        if not self._leases:
            self._wake_up()  # the loop sleeps until the earliest lease; there was none
        heapq.heappush(self._leases, (lease, task.id, task.token))
        worker.active += 1
        self._running[task.id] = asyncio.ensure_future(self._execute(worker, task))

    async def _execute(self, worker: WorkerState, task: Task) -> None:
        spec = self.registry[task.kind]
        token = task.token
        ctx = TaskContext(
            run_id=self.run_id,
            task_id=task.id,
            kind=task.kind,
            attempt=token,
            worker=worker.name,
            skill=worker.spec.skill(task.kind),
            payload=task.payload,
            estimate_s=task.estimate_s,
            inputs={d: self._tasks[d].result for d in task.depends_on},
            heartbeat=lambda: self._heartbeat(task.id, token),
            extras=self.extras,
        )
        limit = spec.timeout_s if spec.timeout_s is not None else self.timeout
        try:
            handler = worker.spec.handlers.get(task.kind) or spec.handler
            if handler is None:
                raise PermanentError(f"kind {task.kind!r} has no handler")
            payload = _payload_for(spec, task)
            result = _result_for(spec, await _bounded(_call(handler, payload, ctx), limit))
        except asyncio.CancelledError:
            raise
        except (TimeoutError, asyncio.TimeoutError) as exc:
            self._on_failure(worker, task.id, token, _timed_out(exc, limit))
        except Exception as exc:
            self._on_failure(worker, task.id, token, exc)
        else:
            self._on_success(worker, task.id, token, result)

    def _heartbeat(self, task_id: str, token: int) -> None:
        task = self._tasks[task_id]
        if task.token != token or task.status is not Status.RUNNING:
            return
        lease = self.clock.now() + self.stale_after
        self._tasks[task_id] = task.evolve(lease=lease)
        heapq.heappush(self._leases, (lease, task_id, token))

    # ---- outcomes ----------------------------------------------------------------------------

    def _is_current(self, task_id: str, token: int, worker: WorkerState) -> bool:
        task = self._tasks[task_id]
        if task.token == token and task.status is Status.RUNNING:
            return True
        self._log(task, "rejected", worker=worker.name, attempt=token,
                  detail={"reason": "stale fencing token", "current": task.token})
        return False

    def _release(self, worker: WorkerState, task: Task, now: float) -> None:
        self._running.pop(task.id, None)
        worker.active -= 1
        worker.load_s = max(0.0, worker.load_s - worker.cost(task))
        if task.started_at is not None:
            worker.busy_s += now - task.started_at
        for r in task.resources:
            if self._locks.get(r) == task.id:
                del self._locks[r]
        if task.resources:
            for w in self._workers.values():
                self._pump(w)
        self._pump(worker)

    def _on_success(self, worker: WorkerState, task_id: str, token: int, result: Any) -> None:
        if not self._is_current(task_id, token, worker):
            return
        now = self.clock.now()
        task = self._tasks[task_id]
        task = self._set(task, Status.COMPLETED, "completed", worker=worker.name, result=result,
                         finished_at=now, attempts=task.attempts + 1, lease=None, error=None,
                         error_class=None)
        worker.done += 1
        self._release(worker, task, now)
        if task.kind in self.effects:
            self._spawn(self._apply_effect(task))
        for dep in self._dependents[task_id]:
            self._waiting[dep] -= 1
            if self._waiting[dep] == 0 and self._tasks[dep].status is Status.PENDING:
                self._push_ready(dep)
        self._dispatch()

    def _on_failure(
        self, worker: WorkerState, task_id: str, token: int, exc: BaseException
    ) -> None:
        if not self._is_current(task_id, token, worker):
            return
        now = self.clock.now()
        task = self._tasks[task_id]
        error = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, BudgetExceeded):
            task = self._set(task, Status.CANCELLED, "cancelled", worker=worker.name,
                             cause="budget", error=error, error_class=ErrorClass.PERMANENT,
                             finished_at=now, lease=None)
            self._release(worker, task, now)
            self._exhaust_budget()
            return
        error_class = classify(exc)
        attempts = task.attempts + 1
        retry = (
            error_class == ErrorClass.TRANSIENT
            and attempts < task.max_attempts
            and (self.retry_budget is None or self._retries_used < self.retry_budget)
            and not self._stopping
        )
        if retry:
            self._retries_used += 1
            delay = self.backoff.delay(attempts, self._rng)
            retry_after = getattr(exc, "retry_after", None)
            if retry_after is not None:
                delay = max(delay, float(retry_after))
            task = self._set(task, Status.FAILED, "failed", worker=worker.name, error=error,
                             error_class=error_class, attempts=attempts, lease=None,
                             not_before=now + delay,
                             detail={"error": error, "retry_at": now + delay})
            self._avoid[task_id] = worker.name
            self._release(worker, task, now)
            asyncio.get_running_loop().call_later(delay, self._retry_due, task_id)
            return
        if error_class == ErrorClass.TRANSIENT and attempts < task.max_attempts:
            error += " (retry budget exhausted)"
        task = self._set(task, Status.DEAD, "dead", worker=worker.name, error=error,
                         error_class=error_class, attempts=attempts, finished_at=now, lease=None,
                         detail={"error": error})
        self._after_death(task)
        self._release(worker, task, now)

    def _retry_due(self, task_id: str) -> None:
        task = self._tasks[task_id]
        if task.status is not Status.FAILED:
            return
        self._set(task, Status.PENDING, "retry", assigned_to=None, not_before=None)
        self._push_ready(task_id)
        self._dispatch()

    def _reclaim_expired(self, now: float) -> None:
        reclaimed = False
        while self._leases and self._leases[0][0] <= now:
            _, task_id, token = heapq.heappop(self._leases)
            task = self._tasks[task_id]
            if task.token != token or task.status is not Status.RUNNING:
                continue
            if task.lease is not None and task.lease > now:
                continue  # renewed by a heartbeat; a newer heap entry stands for it
            worker = self._workers[task.assigned_to or ""]
            if task.reclaims >= self.max_reclaims:
                error = f"reclaimed {task.reclaims} times without a result; giving up"
                task = self._set(task, Status.DEAD, "dead", worker=worker.name, error=error,
                                 error_class=ErrorClass.TRANSIENT, finished_at=now, lease=None,
                                 detail={"error": error})
                self._after_death(task)
                self._release(worker, task, now)
                continue
            task = self._set(task, Status.PENDING, "reclaimed", worker=worker.name,
                             reclaims=task.reclaims + 1, assigned_to=None, lease=None)
            self._avoid[task_id] = worker.name
            zombie = self._running.get(task_id)
            if zombie is not None:
                # It may still be alive; its late result will be fenced off, not trusted.
                self._zombies.add(zombie)
                zombie.add_done_callback(self._zombies.discard)
            self._release(worker, task, now)
            self._push_ready(task_id)
            reclaimed = True
        if reclaimed:
            self._dispatch()

    def _after_death(self, task: Task) -> None:
        if self.on_dead == "abort_run":
            if self._aborted_by is None:
                self._aborted_by = task.id
            self._cancel_all(f"abort: {task.id} died")
            return
        stack = list(self._dependents[task.id])
        while stack:
            dep_id = stack.pop()
            dep = self._tasks[dep_id]
            if dep.status in FINAL:
                continue
            self._cancel(dep, task.id)
            stack.extend(self._dependents[dep_id])
        self._dispatch()

    def _cancel(self, task: Task, cause: str) -> None:
        if task.status is Status.ASSIGNED and task.assigned_to is not None:
            worker = self._workers[task.assigned_to]
            worker.queue.remove(task.id)
            worker.load_s = max(0.0, worker.load_s - worker.cost(task))
        self._set(task, Status.CANCELLED, "cancelled", cause=cause,
                  finished_at=self.clock.now(), detail={"cause": cause})

    def _cancel_all(self, cause: str) -> None:
        for task in list(self._tasks.values()):
            if task.status in (Status.PENDING, Status.ASSIGNED, Status.FAILED):
                self._cancel(task, cause)

    def _exhaust_budget(self) -> None:
        self._budget_exhausted = True
        self._cancel_all("budget")

    # ---- effects -----------------------------------------------------------------------------

    def _spawn(self, coro: Awaitable[Any]) -> None:
        handle = asyncio.ensure_future(coro)
        self._background.add(handle)
        handle.add_done_callback(self._background.discard)
        handle.add_done_callback(self._background_done)

    async def _apply_effect(self, task: Task) -> None:
        """Apply the kind's effect once, keyed by the task id.

        With a store: the completion is written first, then the effect is recorded as
        begun, applied with its key, and recorded as applied together with its ``effect``
        event (one transaction). A crash between applying and recording leaves it begun;
        resume applies it again with the same key, which the effect's target must accept
        as an idempotency key.
        """
        if task.id in self._applied:
            return
        self._applied.add(task.id)
        key = f"{self.run_id}:{task.id}"
        if self.store is not None:
            await self._flush()
            record = await self.store.effect_begin(self.run_id, task.id, key, self.clock.now())
            if record.state == "applied":  # applied and logged by an earlier process
                self._effect_logged.add(task.id)
                return
        try:
            outcome = self.effects[task.kind](task, key)
            if inspect.isawaitable(outcome):
                outcome = await outcome
        except Exception as exc:
            self._log(task, "effect_failed", detail={"key": key, "error": f"{exc}"})
            return
        if task.id in self._effect_logged:
            return
        self._effect_logged.add(task.id)
        # The event goes to the store with the effect's record, not with the next batch.
        entry = self._log(task, "effect", detail={"key": key}, batch=False)
        if self.store is not None:
            await self.store.effect_done(self.run_id, task.id, _jsonable(outcome),
                                         self.clock.now(), entry)

    # ---- bookkeeping -------------------------------------------------------------------------

    def _set(
        self, task: Task, to: Status, event: str, *, worker: str | None = None,
        detail: Mapping[str, Any] | None = None, **changes: Any,
    ) -> Task:
        new = transition(task, to, **changes)
        self._tasks[task.id] = new
        if to in FINAL:
            self._unfinished -= 1
            if not self._unfinished:
                self._wake_up()
        self._log(new, event, worker=worker, detail=detail)
        return new

    def _log(
        self, task: Task, event: str, *, worker: str | None = None, attempt: int | None = None,
        detail: Mapping[str, Any] | None = None, batch: bool = True,
    ) -> Event:
        """Append an event to the ledger; on a durable run (and ``batch``) queue it with
        the task's record for the next write."""
        entry = self.ledger.append(
            self.clock.now(), task.id, event, worker=worker,
            attempt=task.token if attempt is None else attempt, detail=detail,
        )
        if batch and self._dirty is not None:  # durable: the record and its event go together
            self._pending.append((self._tasks.get(task.id, task), entry))
            self._dirty.set()
        self._touch()
        if self.on_event is not None:
            self.on_event(entry, task)
        return entry

    def _touch(self) -> None:
        self._last_change = self.clock.now()

    def _background_done(self, _: object) -> None:
        self._touch()
        self._wake_up()

    def _wake_up(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _stall_message(self, now: float) -> str:
        stuck = [t for t in self._tasks.values() if t.status not in FINAL]
        sample = ", ".join(f"{t.id} ({t.status.value})" for t in stuck[:5])
        more = f" and {len(stuck) - 5} more" if len(stuck) > 5 else ""
        return (
            f"run {self.run_id} stalled: no task changed for {now - self._last_change:.0f} s "
            f"with {len(stuck)} unfinished: {sample}{more}"
        )

    def _result(self, started: float) -> RunResult:
        tasks = dict(self._tasks)
        finished = max((t.finished_at or started for t in tasks.values()), default=started)
        return RunResult(
            run_id=self.run_id,
            tasks=tasks,
            events=self.ledger.events,
            audit=analyze(tasks.values(), self.ledger),
            started_at=started,
            finished_at=finished,
            aborted_by=self._aborted_by,
            budget_exhausted=self._budget_exhausted,
            workers={
                w.name: {"tasks": w.done, "busy_s": w.busy_s} for w in self._workers.values()
            },
        )


# ---- handler plumbing -------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if value is None or isinstance(value, str | int | float | bool | list | dict):
        return value
    return repr(value)


def _dependency_order(batch: list[Task]) -> list[Task]:
    """``batch`` reordered so that dependencies come first (stable; ties keep input order)."""
    by_id = {t.id: t for t in batch}
    if len(by_id) != len(batch):
        raise UsageError("duplicate task ids in one batch")
    position = {t.id: i for i, t in enumerate(batch)}
    sorter: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter()
    for t in batch:
        sorter.add(t.id, *(d for d in t.depends_on if d in by_id))
    try:
        sorter.prepare()
    except graphlib.CycleError as exc:
        from planrun.plan import Problem

        cycle = list(exc.args[1]) if len(exc.args) > 1 else []
        raise InvalidPlan(
            [Problem("cycle", None, f"tasks form a dependency cycle: {' -> '.join(cycle)}")]
        ) from exc
    from planrun.plan import smallest_order

    return [by_id[i] for i in smallest_order(sorter, position.__getitem__)]


def _is_async(handler: Handler) -> bool:
    try:
        return _is_async_cached(handler)
    except TypeError:  # an unhashable callable object
        return _check_async(handler)


def _check_async(handler: Handler) -> bool:
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        type(handler).__call__
    )


_is_async_cached = functools.lru_cache(maxsize=1024)(_check_async)


def _check_limits(retry_budget: int | None, timeout: float | None) -> None:
    """Refuse a negative retry budget and a timeout that is not positive."""
    if retry_budget is not None and retry_budget < 0:
        raise UsageError(f"retry_budget must be >= 0 or None, got {retry_budget}")
    if timeout is not None and not timeout > 0:
        raise UsageError(f"timeout must be > 0 or None, got {timeout}")


async def _bounded(work: Awaitable[Any], limit: float | None) -> Any:
    """``work``, cancelled after ``limit`` seconds (None: no limit)."""
    if limit is None:
        return await work
    return await asyncio.wait_for(work, limit)


def _timed_out(exc: BaseException, limit: float | None) -> Exception:
    """A timeout as the transient failure it is."""
    if isinstance(exc, TransientError):
        return exc
    if limit is None:  # the handler's own timeout, not ours
        return TransientError(f"{type(exc).__name__}: {exc}")
    return TransientError(f"attempt timed out after {limit} s")


async def _call(handler: Handler, payload: Any, ctx: TaskContext) -> Any:
    if _is_async(handler):
        return await handler(payload, ctx)
    outcome = await asyncio.to_thread(handler, payload, ctx)
    if inspect.isawaitable(outcome):
        outcome = await outcome
    return outcome


def _payload_for(spec: KindSpec, task: Task) -> Any:
    if spec.payload_model is None:
        return dict(task.payload)
    try:
        return spec.payload_model.model_validate(dict(task.payload))
    except ValidationError as exc:
        raise PermanentError(f"invalid payload for {spec.name!r}: {exc}") from exc


def _result_for(spec: KindSpec, result: Any) -> Any:
    if spec.result_model is not None and not isinstance(result, spec.result_model):
        try:
            result = spec.result_model.model_validate(result)
        except ValidationError as exc:
            raise PermanentError(f"result of {spec.name!r} fails its model: {exc}") from exc
    if isinstance(result, BaseModel):
        return result.model_dump(mode="json")
    return result

