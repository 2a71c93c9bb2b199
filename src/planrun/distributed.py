"""Workers in other processes, on this machine or others, through one database.

Two roles share the rows of a store (PostgreSQL across machines; SQLite between processes
of one machine):

:class:`Coordinator` (``planrun run ... --workers external``)
    creates the run, and then only decides: assigns ready tasks to live workers (push
    mode), reclaims tasks whose lease expired, requeues failed tasks whose backoff is over,
    cancels what depends on a dead task, and applies effects once. It never runs a task.

:class:`WorkerProcess` (``planrun worker``)
    registers with its kinds and capacity, heartbeats, takes the tasks assigned to it (push)
    or claims ready tasks itself with one atomic ``UPDATE ... FOR UPDATE SKIP LOCKED`` that
    checks dependencies (peer), renews its leases while it works, and writes each outcome
    *fenced* by the token it was given: a result from an attempt that was reclaimed in the
    meantime is refused by the database, never applied.

Every change is a row update and a ledger event in one transaction, so the audit reads the
same ledger whatever process wrote it.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from planrun.errors import (
    BudgetExceeded,
    ErrorClass,
    PermanentError,
    StoreError,
    UsageError,
    classify,
)
from planrun.ledger import Event, analyze
from planrun.registry import Registry, TaskContext
from planrun.stores.base import RunInfo, Store
from planrun.supervisor import (
    Backoff,
    EffectFn,
    RunResult,
    _bounded,
    _call,
    _check_limits,
    _dependency_order,
    _jsonable,
    _payload_for,
    _result_for,
    _timed_out,
)
from planrun.task import FINAL, Status, Task, transition

__all__ = ["Coordinator", "Mode", "WorkerProcess"]

log = logging.getLogger("planrun.distributed")

Mode = Literal["push", "peer"]

_IN_FLIGHT = frozenset({Status.ASSIGNED, Status.RUNNING})
_CANCELLABLE = frozenset({Status.PENDING, Status.ASSIGNED, Status.FAILED})


def _event(task: Task, name: str, now: float, worker: str | None = None,
           detail: Mapping[str, Any] | None = None) -> Event:
    # The store numbers events made by fenced writes; -1 marks "not numbered yet".
    return Event(-1, now, task.id, name, worker, task.token, detail or {})


class Coordinator:
    """Decides for a run whose tasks are done by worker processes.

    Args:
        registry: the kinds (their handlers run in the workers, not here).
        store: an opened store shared with the workers.
        mode: ``push`` (the coordinator assigns) or ``peer`` (workers claim).
        stale_after: lease length; an assignment or run not renewed in time is reclaimed,
            and a worker silent this long is taken out of the rotation.
        max_reclaims, on_dead, effects, retry_budget: as for :class:`~planrun.Supervisor`
            (a worker decides retry or dead by the task's attempts; the coordinator puts a
            failed task back only while the run's retry budget lasts).
        poll: seconds between rounds when nothing wakes the coordinator earlier
            (PostgreSQL's LISTEN/NOTIFY does).
        stall_after: seconds without any task changing before :class:`StallError`.

    Resource locks hold in push mode, where the coordinator alone decides who starts
    what: a task is not assigned while another task naming one of its resources is
    assigned or running. Peer-mode workers claim on their own, so a peer run refuses
    tasks that name resources.
    """

    def __init__(
        self,
        registry: Registry,
        store: Store,
        *,
        run_id: str | None = None,
        mode: Mode = "push",
        stale_after: float = 30.0,
        max_reclaims: int = 3,
        on_dead: Literal["cancel_dependents", "abort_run"] = "cancel_dependents",
        effects: Mapping[str, EffectFn] | None = None,
        poll: float = 0.2,
        stall_after: float = 900.0,
        goal: str = "",
        meta: Mapping[str, Any] | None = None,
        retry_budget: int | None = None,
    ) -> None:
        if mode not in ("push", "peer"):
            raise UsageError(f"mode must be 'push' or 'peer', not {mode!r}")
        _check_limits(retry_budget, None)
        self.registry = registry
        self.store = store
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.mode = mode
        self.stale_after = stale_after
        self.max_reclaims = max_reclaims
        self.on_dead = on_dead
        self.effects = dict(effects or {})
        self.poll = poll
        self.stall_after = stall_after
        self.goal = goal
        self.meta = dict(meta or {})
        self.retry_budget = retry_budget
        self._retries_used = 0
        self._applied: set[str] = set()
        self._aborted_by: str | None = None
        self._rr = 0
        # The mirror of the run (see _coordinate) and what the rounds look up in it.
        self._seq = -1
        self._tasks: dict[str, Task] = {}
        self._pos: dict[str, int] = {}
        self._dependents: dict[str, list[str]] = {}
        self._waiting: dict[str, int] = {}
        self._unfinished = 0
        self._ready: list[tuple[int, str]] = []  # heap of (position, id)
        self._queued: set[str] = set()
        self._holders: dict[str, str] = {}  # resource -> the in-flight task holding it
        self._failed: set[str] = set()
        self._dying: set[str] = set()
        self._effects_due: dict[str, None] = {}

    async def arun(self, tasks: Iterable[Task]) -> RunResult:
        """Create the run with ``tasks`` and coordinate it to the end."""
        now = time.time()
        ordered = [t.evolve(created_at=t.created_at or now) for t in _dependency_order(list(tasks))]
        for task in ordered:
            if task.kind not in self.registry:
                raise UsageError(f"task {task.id!r}: kind {task.kind!r} is not registered")
            if task.resources and self.mode == "peer":
                raise UsageError(
                    f"task {task.id!r} names resources {list(task.resources)}: resource locks "
                    "need push mode (the coordinator assigns); peer-mode workers claim alone")
        meta = {**self.meta, "mode": self.mode, "coordinated": True}
        await self.store.create_run(RunInfo(self.run_id, now, "running", self.goal, meta))
        created = [Event(i, now, t.id, "created", None, 0, {}) for i, t in enumerate(ordered)]
        await self.store.add_tasks(self.run_id, ordered, created)
        return await self._coordinate(now)

    async def aresume(self) -> RunResult:
        """Coordinate a stored run again (after the coordinator itself died)."""
        state = await self.store.load(self.run_id)
        await self.store.set_run_status(self.run_id, "running")
        # An applied effect has its event (one transaction); a begun one may have been
        # applied: the next round applies it again with the same key.
        self._applied.update(task_id for task_id, record in state.effects.items()
                             if record.state == "applied")
        self._retries_used = sum(1 for e in state.events if e.event == "retry")
        return await self._coordinate(time.time())

    # ---- the loop: a mirror of the run, kept current from the ledger's tail ----------------

    async def _coordinate(self, started: float) -> RunResult:
        """Rounds until every task is final and every effect applied.

        The first read takes every task; after that each round reads only the tasks named
        by events it has not seen, so a round costs what changed, not the size of the run.
        """
        # The seq first, then every task (one without an event too): a change landing in
        # between is read again next round, which is harmless.
        _, self._seq = await self.store.load_changed(self.run_id, -1)
        self._build((await self.store.load_tasks(self.run_id)).tasks)
        last_change = time.time()
        while True:
            await self._round(time.time())
            if self._unfinished == 0 and not self._effects_due:
                break
            await self.store.wait_for_change(self.run_id, self.poll)
            changed, self._seq = await self.store.load_changed(self.run_id, self._seq)
            for task in changed:
                self._update(task)
            now = time.time()
            if changed:
                last_change = now
            elif now - last_change > self.stall_after:
                from planrun.errors import StallError

                raise StallError(f"run {self.run_id} stalled: nothing changed for "
                                 f"{now - last_change:.0f} s")
        status = "aborted" if self._aborted_by else "finished"
        await self.store.set_run_status(self.run_id, status)
        return await self._result(started)

    def _build(self, tasks: Sequence[Task]) -> None:
        self._tasks = {t.id: t for t in tasks}
        self._pos = {t.id: i for i, t in enumerate(tasks)}
        self._dependents = {t.id: [] for t in tasks}
        for t in tasks:
            for d in t.depends_on:
                self._dependents.setdefault(d, []).append(t.id)
        self._waiting = {
            t.id: sum(1 for d in t.depends_on
                      if d not in self._tasks or self._tasks[d].status is not Status.COMPLETED)
            for t in tasks
        }
        self._unfinished = sum(1 for t in tasks if t.status not in FINAL)
        for t in tasks:
            self._index(None, t)

    def _update(self, new: Task) -> None:
        old = self._tasks.get(new.id)
        if old is None:  # a task this mirror never saw: read the whole run again
            self._build([*self._tasks.values(), new])
            return
        self._tasks[new.id] = new
        if old.status not in FINAL and new.status in FINAL:
            self._unfinished -= 1
        if new.status is Status.COMPLETED and old.status is not Status.COMPLETED:
            for d in self._dependents.get(new.id, ()):
                self._waiting[d] -= 1
                if self._waiting[d] == 0:
                    self._offer(self._tasks[d])
        self._index(old, new)

    def _index(self, old: Task | None, new: Task) -> None:
        """File ``new`` under what the rounds look for."""
        for r in new.resources:
            if new.status in _IN_FLIGHT:
                self._holders[r] = new.id
            elif self._holders.get(r) == new.id:
                del self._holders[r]
        if new.status is Status.FAILED:
            self._failed.add(new.id)
        else:
            self._failed.discard(new.id)
        if new.status is Status.DEAD and (old is None or old.status is not Status.DEAD):
            self._dying.add(new.id)
        if (new.status is Status.COMPLETED and new.kind in self.effects
                and new.id not in self._applied):
            self._effects_due[new.id] = None
        self._offer(new)

    def _offer(self, task: Task) -> None:
        """Queue a pending task whose dependencies are all completed (push mode assigns it)."""
        if (task.status is Status.PENDING and self._waiting.get(task.id) == 0
                and task.id not in self._queued):
            self._queued.add(task.id)
            heapq.heappush(self._ready, (self._pos[task.id], task.id))

    async def _round(self, now: float) -> None:
        for task in await self.store.expired(self.run_id, now):  # fresh rows, not the mirror
            await self._reclaim(task, now)
        for task_id in sorted(self._failed, key=self._pos.__getitem__):
            task = self._tasks[task_id]
            if (task.not_before or 0) <= now or self._budget_spent():
                await self._retry(task, now)
        for task_id in sorted(self._dying, key=self._pos.__getitem__):
            if await self._after_death(self._tasks[task_id], now):
                self._dying.discard(task_id)
        if self.mode == "push" and not self._aborted_by:
            await self._assign(now)
        due, self._effects_due = list(self._effects_due), {}
        # Effects are independent of each other: apply a few at once.
        limit = asyncio.Semaphore(4)

        async def one(task: Task) -> None:
            async with limit:
                await self._apply_effect(task, now)

        await asyncio.gather(*(one(self._tasks[t]) for t in due))

    async def _reclaim(self, task: Task, now: float) -> None:
        if task.reclaims >= self.max_reclaims:
            error = f"reclaimed {task.reclaims} times without a result; giving up"
            dead = transition(task, Status.DEAD, error=error, error_class=ErrorClass.TRANSIENT,
                              finished_at=now, lease=None)
            await self._fenced(dead, "dead", now, task.assigned_to, {"error": error})
            return
        # The token moves on: the reclaimed attempt's result can no longer be written.
        back = transition(task, Status.PENDING, assigned_to=None, lease=None,
                          reclaims=task.reclaims + 1, token=task.token + 1)
        await self._fenced(back, "reclaimed", now, task.assigned_to,
                           {"reason": "lease expired"}, expect=task.token)

    def _budget_spent(self) -> bool:
        return self.retry_budget is not None and self._retries_used >= self.retry_budget

    async def _retry(self, task: Task, now: float) -> None:
        if self._budget_spent():
            error = f"{task.error} (retry budget exhausted)"
            dead = transition(task, Status.DEAD, error=error, finished_at=now, lease=None)
            await self._fenced(dead, "dead", now, detail={"error": error})
            return  # its dependents are cancelled next round, as for any death
        if await self._fenced(transition(task, Status.PENDING, assigned_to=None,
                                         not_before=None), "retry", now):
            self._retries_used += 1

    async def _after_death(self, task: Task, now: float) -> bool:
        """Cancel what the death of ``task`` dooms; False when a write must be tried again."""
        if self.on_dead == "abort_run":
            self._aborted_by = self._aborted_by or task.id
            cause = f"abort: {task.id} died"
            doomed = [t for t in self._tasks.values() if t.status in _CANCELLABLE]
        else:  # every transitive dependent, with the dead task as the cause
            cause, doomed, seen = task.id, [], set()
            stack = list(self._dependents.get(task.id, ()))
            while stack:
                dep_id = stack.pop()
                if dep_id in seen:
                    continue
                seen.add(dep_id)
                stack.extend(self._dependents.get(dep_id, ()))
                if self._tasks[dep_id].status in _CANCELLABLE:
                    doomed.append(self._tasks[dep_id])
        done = True
        for other in sorted(doomed, key=lambda t: self._pos[t.id]):
            cancelled = transition(other, Status.CANCELLED, cause=cause, finished_at=now)
            done &= await self._fenced(cancelled, "cancelled", now, detail={"cause": cause})
        return done

    async def _assign(self, now: float) -> None:
        if not self._ready:
            return
        workers = [w for w in await self.store.list_workers(self.run_id)
                   if now - float(w["last_heartbeat"]) < self.stale_after]
        # Each worker gets a queue of up to twice its capacity (assigned + running), so it
        # never waits for the coordinator's next round between two tasks.
        free = {w["name"]: 2 * int(w["capacity"]) - int(w["active"]) for w in workers}
        kinds = {w["name"]: set(w["kinds"]) for w in workers}
        later: list[tuple[int, str]] = []
        while self._ready and any(n > 0 for n in free.values()):
            entry = heapq.heappop(self._ready)
            task = self._tasks[entry[1]]
            if task.status is not Status.PENDING or self._waiting[task.id]:
                self._queued.discard(task.id)  # stale: it changed since it was queued
                continue
            able = [n for n in free if free[n] > 0 and task.kind in kinds[n]]
            if (not able or (task.not_before or 0) > now
                    or any(r in self._holders for r in task.resources)):
                later.append(entry)
                continue
            self._queued.discard(task.id)
            name = min(able, key=lambda n: (-free[n], (self._rr + able.index(n)) % len(able)))
            self._rr += 1
            assigned = transition(task, Status.ASSIGNED, assigned_to=name,
                                  token=task.token + 1, lease=now + self.stale_after)
            if await self._fenced(assigned, "assigned", now, name, expect=task.token):
                free[name] -= 1
                self._holders.update(dict.fromkeys(task.resources, task.id))
        for entry in later:
            heapq.heappush(self._ready, entry)

    async def _apply_effect(self, task: Task, now: float) -> None:
        key = f"{self.run_id}:{task.id}"
        record = await self.store.effect_begin(self.run_id, task.id, key, now)
        self._applied.add(task.id)
        if record.state == "applied":
            return
        try:
            outcome = self.effects[task.kind](task, key)
            if asyncio.iscoroutine(outcome):
                outcome = await outcome
        except Exception as exc:
            log.warning("effect of %s failed: %s", task.id, exc)
            self._applied.discard(task.id)
            self._effects_due[task.id] = None  # the next round tries again, same key
            return
        # The record and its event in one transaction: a coordinator that died with this
        # commit in flight and the one resuming it cannot both log the effect.
        await self.store.effect_done(self.run_id, task.id, _jsonable(outcome), time.time(),
                                     _effect_event(task, key))

    async def _fenced(
        self, task: Task, name: str, now: float, worker: str | None = None,
        detail: Mapping[str, Any] | None = None, expect: int | None = None,
    ) -> bool:
        expect_token = task.token if expect is None else expect
        return await self.store.write_fenced(
            self.run_id, task, _event(task, name, now, worker, detail), expect_token
        )

    async def _result(self, started: float) -> RunResult:
        state = await self.store.load(self.run_id)
        tasks = {t.id: t for t in state.tasks}
        finished = max((t.finished_at or started for t in tasks.values()), default=started)
        done: dict[str, dict[str, float]] = {}
        for t in tasks.values():
            if t.status is Status.COMPLETED and t.assigned_to:
                w = done.setdefault(t.assigned_to, {"tasks": 0, "busy_s": 0.0})
                w["tasks"] += 1
                w["busy_s"] += (t.finished_at or 0) - (t.started_at or 0)
        return RunResult(
            run_id=self.run_id, tasks=tasks, events=state.events,
            audit=analyze(tasks.values(), state.events), started_at=started,
            finished_at=finished, aborted_by=self._aborted_by, workers=done,
        )


def _effect_event(task: Task, key: str) -> Event:
    return Event(-1, time.time(), task.id, "effect", None, task.token, {"key": key})


@dataclass
class _Running:
    task: Task
    handle: asyncio.Task[None]


class WorkerProcess:
    """A worker in its own process: registers, heartbeats, takes or claims, runs, reports.

    Args:
        registry: the kinds and their handlers.
        store: an opened store (the same database as the coordinator).
        name: unique worker name (default: host-pid).
        kinds: the kinds it does (default: every kind of the registry).
        capacity: tasks at a time.
        mode: ``push`` (take what the coordinator assigned) or ``peer`` (claim ready work).
        lease_s: lease length; renewed every ``lease_s / 3`` while a task runs.
        backoff, extras, timeout: as for :class:`~planrun.Supervisor` (a kind's
            ``timeout_s`` overrides ``timeout``).
        idle_exit: stop after this many seconds with no running run and no work (None: never).
        extras_for: ``run_id -> extras`` merged over ``extras`` for that run's tasks (the
            run's own model, limiter and budget).
    """

    def __init__(
        self,
        registry: Registry,
        store: Store,
        *,
        name: str | None = None,
        kinds: Sequence[str] | None = None,
        capacity: int = 4,
        mode: Mode = "push",
        lease_s: float = 30.0,
        poll: float = 0.2,
        backoff: Backoff | None = None,
        extras: Mapping[str, Any] | None = None,
        idle_exit: float | None = None,
        timeout: float | None = None,
        extras_for: Callable[[str], Awaitable[Mapping[str, Any]]] | None = None,
    ) -> None:
        import os
        import socket

        self.registry = registry
        self.store = store
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.kinds = list(kinds or registry.names)
        unknown = [k for k in self.kinds if k not in registry]
        if unknown:
            raise UsageError(f"unknown kind(s) {unknown}; the app has {registry.names}")
        if capacity < 1:
            raise UsageError("capacity must be >= 1")
        _check_limits(None, timeout)
        self.capacity = capacity
        self.mode = mode
        self.lease_s = lease_s
        self.poll = poll
        self.backoff = backoff or Backoff()
        self.extras = dict(extras or {})
        self.extras_for = extras_for
        self.idle_exit = idle_exit
        self.timeout = timeout
        self._rng = random.Random()
        self._running: dict[tuple[str, str], _Running] = {}
        self._registered: set[str] = set()
        self._beats: dict[str, float] = {}
        self.done = 0
        self.rejected = 0
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()

    def stop(self) -> None:
        """Finish the tasks in hand, take no more."""
        self._stop.set()
        self._wake.set()

    async def arun(self) -> None:
        """Serve every running run of the store until stopped (or idle past ``idle_exit``)."""
        idle_since = time.time()
        delay = self.poll
        runs: list[str] = []
        listed = 0.0
        while not self._stop.is_set():
            try:
                if time.time() - listed > 1.0 or not runs:  # new runs are rare: look each second
                    runs = [r.id for r in await self.store.list_runs() if r.status == "running"]
                    listed = time.time()
                busy = await self._round(runs)
                delay = self.poll
            except StoreError as exc:
                # The database went away: take nothing, keep what runs, try again later.
                log.warning("worker %s: store unavailable (%s); retrying", self.name, exc)
                runs, busy = [], bool(self._running)
                delay = min(delay * 2, 5.0)
            if busy or runs:
                idle_since = time.time()
            elif self.idle_exit is not None and time.time() - idle_since > self.idle_exit:
                break
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)
        if self._running:
            await asyncio.gather(*(r.handle for r in self._running.values()),
                                 return_exceptions=True)

    async def _round(self, runs: Sequence[str]) -> bool:
        now = time.time()
        for run_id in runs:
            if run_id not in self._registered:
                await self.store.register_worker(run_id, self.name, self.kinds, self.capacity,
                                                 now)
                self._registered.add(run_id)
            if now - self._beats.get(run_id, 0.0) > min(1.0, self.lease_s / 3):
                await self.store.heartbeat_worker(run_id, self.name, now)
                self._beats[run_id] = now
            free = self.capacity - len(self._running)
            if free <= 0:
                continue
            # now=None: the store stamps the start once it holds its write lock, so the
            # ledger never shows a task starting before a dependency finished elsewhere.
            if self.mode == "push":
                tasks = await self.store.take_assigned(run_id, self.name, None, self.lease_s,
                                                       free)
            else:
                tasks = await self.store.claim(run_id, self.name, self.kinds, None,
                                               self.lease_s, free)
            for task in tasks:
                key = (run_id, task.id)
                handle = asyncio.ensure_future(self._execute(run_id, task))
                self._running[key] = _Running(task, handle)
                handle.add_done_callback(self._forget(key))
        return bool(self._running)

    def _forget(self, key: tuple[str, str]) -> Any:
        def done(_: object) -> None:
            self._running.pop(key, None)
            self._wake.set()  # a free slot: take the next task now, not at the next poll

        return done

    async def _execute(self, run_id: str, task: Task) -> None:
        spec = self.registry[task.kind]
        renewer = asyncio.ensure_future(self._renew(run_id, task))
        extras = self.extras
        if self.extras_for is not None:
            extras = {**extras, **await self.extras_for(run_id)}
        ctx = TaskContext(run_id=run_id, task_id=task.id, kind=task.kind, attempt=task.token,
                          worker=self.name, skill=1.0, payload=task.payload,
                          estimate_s=task.estimate_s, inputs=await self._inputs(run_id, task),
                          extras=extras)
        limit = spec.timeout_s if spec.timeout_s is not None else self.timeout
        try:
            if spec.handler is None:
                raise PermanentError(f"kind {task.kind!r} has no handler")
            work = _call(spec.handler, _payload_for(spec, task), ctx)
            result = _result_for(spec, await _bounded(work, limit))
        except asyncio.CancelledError:
            raise
        except (TimeoutError, asyncio.TimeoutError) as exc:
            outcome, name, detail = self._failure(task, _timed_out(exc, limit))
        except Exception as exc:
            outcome, name, detail = self._failure(task, exc)
        else:
            now = time.time()
            outcome = transition(task, Status.COMPLETED, result=result, finished_at=now,
                                 attempts=task.attempts + 1, lease=None, error=None,
                                 error_class=None)
            name, detail = "completed", {}
        finally:
            renewer.cancel()
        await self._report(run_id, task, outcome, name, detail)

    async def _inputs(self, run_id: str, task: Task) -> dict[str, Any]:
        if not task.depends_on:
            return {}
        return {t.id: t.result for t in await self.store.load_some(run_id, task.depends_on)}

    def _failure(self, task: Task, exc: BaseException) -> tuple[Task, str, dict[str, Any]]:
        now = time.time()
        error = f"{type(exc).__name__}: {exc}"
        error_class = classify(exc)
        attempts = task.attempts + 1
        if isinstance(exc, BudgetExceeded):
            return (transition(task, Status.CANCELLED, cause="budget", error=error,
                               error_class=ErrorClass.PERMANENT, finished_at=now, lease=None),
                    "cancelled", {"cause": "budget"})
        if error_class == ErrorClass.TRANSIENT and attempts < task.max_attempts:
            delay = self.backoff.delay(attempts, self._rng)
            retry_after = getattr(exc, "retry_after", None)
            if retry_after is not None:
                delay = max(delay, float(retry_after))
            failed = transition(task, Status.FAILED, error=error, error_class=error_class,
                                attempts=attempts, lease=None, not_before=now + delay)
            return failed, "failed", {"error": error, "retry_at": now + delay}
        dead = transition(task, Status.DEAD, error=error, error_class=error_class,
                          attempts=attempts, finished_at=now, lease=None)
        return dead, "dead", {"error": error}

    async def _report(self, run_id: str, task: Task, outcome: Task, name: str,
                      detail: Mapping[str, Any]) -> None:
        """Write the outcome fenced by the token; never write one that cannot be fenced."""
        event = _event(outcome, name, time.time(), self.name, detail)
        delay = 0.2
        while True:
            try:
                ok = await self.store.write_fenced(run_id, outcome, event, task.token)
                break
            except StoreError as exc:
                if time.time() > (task.lease or 0) + self.lease_s:
                    log.warning("worker %s: dropping the result of %s: %s", self.name,
                                task.id, exc)
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        if ok:
            self.done += name == "completed"
        else:
            self.rejected += 1
            log.info("worker %s: result of %s refused (reclaimed meanwhile)", self.name, task.id)

    async def _renew(self, run_id: str, task: Task) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            with contextlib.suppress(StoreError):
                if not await self.store.renew(run_id, task.id, task.token,
                                              time.time() + self.lease_s):
                    return  # reclaimed: whatever we produce will be refused

