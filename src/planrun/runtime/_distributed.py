"""Workers in other processes, on this machine or others, through one database.

Two roles share the rows of a store (PostgreSQL across machines; SQLite between processes
of one machine):

:class:`Coordinator` (``planrun run ... --workers external``)
    a driver of the scheduling core (:class:`planrun.core.scheduling.Scheduler`) over fenced
    database writes. It creates the run, keeps a mirror of it current from the ledger's
    tail, feeds the core what worker processes wrote, and writes what the core decides:
    assignments (push mode), reclaims of expired leases, retries or deaths of failed
    attempts, cancellations, the budget stop, the deadline, effects. It never runs a task.

:class:`WorkerProcess` (``planrun worker``)
    registers with its kinds and capacity, heartbeats, takes the tasks assigned to it (push)
    or claims ready tasks itself with one atomic ``UPDATE ... FOR UPDATE SKIP LOCKED`` that
    checks dependencies (peer), renews its leases while it works, and reports each outcome
    *fenced* by the token it was given: completed, failed (with the error and any
    ``Retry-After``), or refused by the budget. It decides nothing about retry, death or
    budget. A result from an attempt that was reclaimed meanwhile is refused by the database.

Every change is a row update and a ledger event in one transaction, so the audit reads the
same ledger whatever process wrote it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import socket
import uuid
import warnings
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from planrun.core import (
    Event,
    InvalidPlan,
    Registry,
    Router,
    RunResult,
    SpawnRequest,
    StallError,
    Status,
    StoreError,
    Task,
    TaskContext,
    UsageError,
    analyze,
    get_router,
    redact,
    transition,
)
from planrun.core import EventName as E
from planrun.core.scheduling import (
    EFFECT_RETRY,
    SCHEDULER_RETRY,
    STORE_PATIENCE,
    Addition,
    Approval,
    Backoff,
    Failure,
    OnDead,
    ReplanRequest,
    RetryPolicy,
    Scheduler,
    SpawnLimits,
    as_policy,
    check_policies,
    expand,
    failure_of,
    kept_gate,
    spawn_refused,
    timed_out,
    waiting_cause,
)
from planrun.obs import tracing
from planrun.runtime._attempt import jsonable, maybe_await, run_attempt
from planrun.runtime._clock import Clock, RealClock
from planrun.runtime._supervisor_state import EffectFn, Replanner, ask_replanner
from planrun.stores.base import RunInfo, Store, WidenConflict

__all__ = ["Coordinator", "Mode", "WorkerProcess"]

log = logging.getLogger("planrun.distributed")

Mode = Literal["push", "peer"]


def _created_events(task: Task, now: float) -> Event | tuple[Event, ...]:
    """A spawned task's ``created`` event, and its ``waiting`` one when it is written
    waiting (peer mode: gated before its start), for one transaction."""
    created = _event(task, E.CREATED, now, detail={"parent": task.parent})
    if task.status is not Status.WAITING:
        return created
    return created, _event(task, E.WAITING, now, detail={
        "for": "start", "timeout_at": task.not_before})


def _event(task: Task, name: str, now: float, worker: str | None = None,
           detail: Mapping[str, Any] | None = None) -> Event:
    # The store numbers events made by fenced writes; -1 marks "not numbered yet".
    return Event(-1, now, task.id, name, worker, task.token, detail or {})


@dataclass(frozen=True, slots=True)
class _Change:
    task: Task
    event: str
    worker: str | None
    detail: Mapping[str, Any] | None
    expect: int


class Coordinator:
    """Drives a run whose tasks are done by worker processes.

    Args:
        registry: the kinds (their handlers run in the workers, not here).
        store: an opened store shared with the workers.
        mode: ``push`` (the coordinator assigns) or ``peer`` (workers claim).
        strategy: how push mode picks a worker (as for :class:`~planrun.Supervisor`).
        stale_after: lease length; an assignment or run not renewed in time is reclaimed,
            and a worker silent this long is taken out of the rotation.
        max_attempts, retry, retry_budget, max_reclaims, on_dead, effects, deadline_s: as
            for :class:`~planrun.Supervisor`; the same core decides.
        poll: seconds between rounds when nothing wakes the coordinator earlier
            (PostgreSQL's LISTEN/NOTIFY does).
        stall_after: seconds without any task changing before :class:`StallError`.
        store_patience: seconds a failing store is ridden out before :class:`StoreError`
            (the same patience as the supervisor's).
        clock: :class:`RealClock` (default) or :class:`VirtualClock`.
        effect_retry, spawn_limits: as for :class:`~planrun.Supervisor`. The limits are
            kept with the run, where worker processes read them: a worker whose handler
            spawns validates the addition with the core's rule and writes it with the
            completion, in one fenced transaction.
        replanner, max_replans: as for :class:`~planrun.Supervisor`: with
            ``on_dead="replan"`` the coordinator asks the replanner (here, while its rounds
            go on) and writes the fragment the core accepts in one transaction with the
            ``replanned`` event; a replan asked but unanswered when the coordinator stopped
            is asked again by :meth:`aresume`.
        approvals, task_approvals: as for :class:`~planrun.Supervisor`, kept in the run's
            meta for worker processes. In peer mode a task that needs approval before it
            starts waits from the moment it is added, so no worker claims it before it is
            approved. Before the effect, a worker writes the task ``waiting`` with its
            result; the core completes it once approved and the coordinator applies the
            effect. Decisions are read from the store (``planrun approve``).

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
        strategy: str | Router = "balanced",
        stale_after: float = 30.0,
        max_reclaims: int = 3,
        on_dead: OnDead = "cancel_dependents",
        effects: Mapping[str, EffectFn] | None = None,
        poll: float = 0.2,
        stall_after: float = 900.0,
        goal: str = "",
        meta: Mapping[str, Any] | None = None,
        retry_budget: int | None = None,
        retry: RetryPolicy | None = None,
        max_attempts: int | None = None,
        deadline_s: float | None = None,
        store_patience: float = 120.0,
        effect_retry: RetryPolicy | None = None,
        clock: Clock | None = None,
        spawn_limits: SpawnLimits | None = None,
        approvals: Mapping[str, Approval | str] | None = None,
        task_approvals: Mapping[str, Approval | str] | None = None,
        replanner: Replanner | None = None,
        max_replans: int = 2,
    ) -> None:
        if mode not in ("push", "peer"):
            raise UsageError(f"mode must be 'push' or 'peer', not {mode!r}")
        policy = as_policy(retry, SCHEDULER_RETRY)
        self.max_attempts = policy.attempts if max_attempts is None else max_attempts
        check_policies(on_dead=on_dead, retry_budget=retry_budget, stale_after=stale_after,
                       stall_after=stall_after, max_reclaims=max_reclaims,
                       max_attempts=self.max_attempts, deadline_s=deadline_s)
        self.registry = registry
        self.store = store
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.mode = mode
        self.effects = dict(effects or {})
        self.poll = poll
        self.goal = goal
        self.meta = dict(meta or {})
        self.deadline_s = deadline_s
        self.store_patience = store_patience
        self.clock: Clock = clock or RealClock()
        self.core = Scheduler(
            router=get_router(strategy), retry=policy, sink=self._decided,
            retry_budget=retry_budget, max_reclaims=max_reclaims, on_dead=on_dead,
            stale_after=stale_after, stall_after=stall_after, effects=self.effects,
            effect_retry=effect_retry or EFFECT_RETRY, kinds=registry,
            spawn_limits=spawn_limits, default_attempts=self.max_attempts, approvals=approvals,
            task_approvals=task_approvals, max_replans=max_replans,
            can_replan=replanner is not None, claims_alone=mode == "peer",
        )
        self.replanner = replanner
        self._asking: set[asyncio.Task[None]] = set()
        self._changes: list[_Change] = []
        self._seq = -1

    @property
    def stale_after(self) -> float:
        """Lease length of an assignment."""
        return self.core.stale_after

    @property
    def retry_budget(self) -> int | None:
        """Retries allowed over the whole run."""
        return self.core.retry_budget

    async def arun(self, tasks: Iterable[Task]) -> RunResult:
        """Create the run with ``tasks`` and coordinate it to the end."""
        now = self.clock.now()
        batch = list(tasks)
        for task in batch:
            if task.kind not in self.registry:
                raise UsageError(f"task {task.id!r}: kind {task.kind!r} is not registered")
            if task.resources and self.mode == "peer":
                raise UsageError(
                    f"task {task.id!r} names resources {list(task.resources)}: resource locks "
                    "need push mode (the coordinator assigns); peer-mode workers claim alone")
        added = self.core.add(batch, now, default_attempts=self.max_attempts)
        # Peer workers claim alone: a task gated before its start is written waiting.
        self.core.gate_unclaimed(added, now)
        waits = [c for c in self._changes if c.event == E.WAITING]
        self._changes.clear()  # the created (and waiting) events go in with the rows
        meta = {**self.meta, "mode": self.mode, "coordinated": True,
                "spawn": {**self.core.spawn_limits.to_dict(), "max_attempts": self.max_attempts}}
        if self.core.approvals or self.core.task_approvals:
            meta["approvals"] = self.core.gates()
        await self.store.create_run(RunInfo(self.run_id, now, "running", self.goal, meta))
        created = [Event(i, now, t.id, E.CREATED, None, 0, {}) for i, t in enumerate(added)]
        created += [Event(len(created) + i, now, c.task.id, c.event, None, c.task.token,
                          c.detail or {}) for i, c in enumerate(waits)]
        rows = [self.core.tasks[t.id] for t in added]
        await self.store.add_tasks(self.run_id, rows, created)
        return await self._coordinate(now, fresh=True)

    async def aresume(self) -> RunResult:
        """Coordinate a stored run again (after the coordinator itself died).

        Its workers outlive it: what they hold stays theirs until its lease runs out.
        """
        state = await self.store.load(self.run_id)
        await self.store.set_run_status(self.run_id, "running")
        for task_id, record in state.effects.items():
            if record.state == "applied":  # an applied effect has its event (one transaction)
                self.core.effect_known(task_id)
        # A replan asked but unanswered when the coordinator stopped left no event: the
        # core asks it again when it recovers the dead task.
        self.core.spent_before(state.events)
        return await self._coordinate(self.clock.now(), fresh=False)

    # ---- the loop: a mirror of the run, kept current from the ledger's tail ----------------

    async def _coordinate(self, started: float, *, fresh: bool) -> RunResult:
        """Rounds until every task is final and every effect applied.

        The first read takes every task; after that each round reads only the tasks named
        by events it has not seen, so a round costs what changed, not the size of the run.
        """
        core = self.core
        if self.deadline_s is not None:
            core.set_deadline(started + self.deadline_s)
        await self._patiently(self._first_read)
        core.start(self.clock.now())
        if not fresh:
            core.recover(self.clock.now(), reason=None)
        try:
            while True:
                await self._patiently(self._round)
                self._ask_replans()
                now = self.clock.now()
                if core.done and not self._changes:
                    break
                if core.stalled(now) and not self._asking:
                    raise StallError(core.stall_message(self.run_id, now))
                wait = min(self.poll, max(0.0, core.next_wakeup(now) - now))
                await self._patiently(functools.partial(self._observe, wait))
        finally:
            for asking in list(self._asking):
                asking.cancel()
        status = "aborted" if core.facts.aborted_by else "finished"
        await self._patiently(lambda: self.store.set_run_status(self.run_id, status))
        return await self._result(started)

    def _ask_replans(self) -> None:
        for request in self.core.replans_due():
            handle = asyncio.ensure_future(self._replan(request))
            self._asking.add(handle)
            handle.add_done_callback(self._asking.discard)

    async def _replan(self, request: ReplanRequest) -> None:
        """Ask the replanner; the core validates what it answers, the next round writes it."""
        assert self.replanner is not None
        fragment, error = await ask_replanner(self.replanner, request)
        self.core.replan_done(request, fragment, error, self.clock.now())

    async def _first_read(self) -> None:
        # The seq first, then every task (one without an event too): a change landing in
        # between is read again next round, which is harmless.
        _, self._seq = await self.store.load_changed(self.run_id, -1)
        tasks = (await self.store.load_tasks(self.run_id)).tasks
        if self.core.tasks:
            for task in tasks:
                self.core.observe(task, self.clock.now())
        else:
            self.core.restore(tasks)

    async def _observe(self, wait: float) -> None:
        await self.store.wait_for_change(self.run_id, wait)
        changed, self._seq = await self.store.load_changed(self.run_id, self._seq)
        now = self.clock.now()
        for task in changed:
            self.core.observe(task, now)

    async def _patiently(self, step: Any) -> Any:
        """Run ``step``; ride out a store that is down for up to ``store_patience``."""
        tries, deadline = 0, self.clock.now() + self.store_patience
        while True:
            try:
                return await step()
            except StoreError as exc:
                if self.clock.now() >= deadline:
                    raise
                log.warning("coordinator %s: store unavailable (%s); retrying", self.run_id, exc)
                tries += 1
                await asyncio.sleep(STORE_PATIENCE.backoff(tries))

    async def _round(self) -> None:
        core = self.core
        now = self.clock.now()
        for task in await self.store.expired(self.run_id, now):  # fresh rows, not the mirror
            core.expire(task, now)
        if core.awaiting:  # a decision on a waiting row comes with no event: read the rows
            for task in await self.store.load_some(self.run_id, sorted(core.awaiting)):
                core.take_decision(task, now)
        core.tick(now)
        if self.mode == "push" and not core.stopping:
            free = await self._free_workers(now)
            if free:
                core.assign(now, free)
        await self._write_decided()
        await self._apply_effects(core.effects_due(now))

    async def _free_workers(self, now: float) -> dict[str, int]:
        """Live workers and their free slots: each gets a queue of up to twice its capacity
        (assigned + running), so it never waits for the next round between two tasks."""
        free: dict[str, int] = {}
        for w in await self.store.list_workers(self.run_id):
            if now - float(w["last_heartbeat"]) >= self.core.stale_after:
                continue
            self.core.sync_worker(w["name"], list(w["kinds"]), int(w["capacity"]))
            free[w["name"]] = 2 * int(w["capacity"]) - int(w["active"])
        return free

    def _decided(self, task: Task, event: str, worker: str | None,
                 detail: Mapping[str, Any] | None, token: int) -> None:
        """The core's sink: every decided change becomes a fenced write."""
        self._changes.append(_Change(task, event, worker, detail, token))
        self.core.touch(self.clock.now())

    async def _write_decided(self) -> None:
        """Write the decided changes in order; a refused one is read back into the mirror."""
        while self._changes:
            change = self._changes[0]
            if change.event == E.REJECTED:
                self._changes.pop(0)
                continue
            if change.event == E.REPLANNED:
                await self._write_replanned(change)
                continue
            if change.event == E.REPLAN_FAILED:  # on a dead row: an event, no row change
                await self.store.append_event(self.run_id, _event(
                    change.task, change.event, self.clock.now(), None, change.detail))
                self._changes.pop(0)
                continue
            event = _event(change.task, change.event, self.clock.now(), change.worker,
                           change.detail)
            ok = await self.store.write_fenced(self.run_id, change.task, event, change.expect)
            self._changes.pop(0)
            if not ok:  # a worker got there first: take the store's record as it is
                for fresh in await self.store.load_some(self.run_id, [change.task.id]):
                    self.core.observe(fresh, self.clock.now())

    async def _write_replanned(self, change: _Change) -> None:
        """A ``replanned`` event with the tasks and joins it brought, in one transaction:
        a resumed coordinator sees the whole fragment or none of it (and asks again)."""
        now = self.clock.now()
        follow = 1
        while (follow < len(self._changes)
               and self._changes[follow].event in (E.CREATED, E.JOINED, E.WAITING)):
            follow += 1
        brought = self._changes[1:follow]
        # A new task gated before its start (peer mode) is inserted waiting; its waiting
        # event follows.
        waits = {c.task.id: c for c in brought if c.event == E.WAITING}
        added: list[tuple[Task, Event | tuple[Event, ...]]] = []
        for c in brought:
            if c.event != E.CREATED:
                continue
            created = _event(c.task, c.event, now, None, c.detail)
            wait = waits.get(c.task.id)
            added.append((self.core.tasks[c.task.id], created if wait is None else (
                created, _event(wait.task, wait.event, now, None, wait.detail))))
        joined = [c.task for c in brought if c.event == E.JOINED]
        # A widened row is written over the token it was read with (one more, as a worker's
        # spawn writes it); the mirror takes the stored row back below.
        widened = [(t.evolve(token=t.token + 1),
                    _event(t, E.JOINED, now, None, {"depends_on": len(t.depends_on)}))
                   for t in joined]
        try:
            await self.store.write_added(self.run_id, _event(
                change.task, change.event, now, None, change.detail), added, widened)
        except StoreError:
            # A commit whose answer was lost is not written twice: its rows are there.
            if not added or not await self.store.load_some(self.run_id, [added[0][0].id]):
                raise
        del self._changes[:follow]
        inserted = {t.id for t, _ in added}
        for wait in (w for tid, w in waits.items() if tid not in inserted):
            await self.store.append_event(self.run_id, _event(
                wait.task, wait.event, self.clock.now(), None, wait.detail))
        if joined:
            for fresh in await self.store.load_some(self.run_id, [t.id for t in joined]):
                self.core.observe(fresh, self.clock.now())

    async def _apply_effects(self, due: Sequence[Task]) -> None:
        # Effects are independent of each other: apply a few at once.
        limit = asyncio.Semaphore(4)

        async def one(task: Task) -> None:
            async with limit:
                await self._apply_effect(task)

        await asyncio.gather(*(one(t) for t in due))

    async def _apply_effect(self, task: Task) -> None:
        key = f"{self.run_id}:{task.id}"
        try:
            record = await self.store.effect_begin(self.run_id, task.id, key,
                                                   self.clock.now())
            if record.state != "applied":
                outcome = await maybe_await(self.effects[task.kind](task, key))
                # The record and its event in one transaction: a coordinator that died with
                # this commit in flight and the one resuming it cannot both log the effect.
                await self.store.effect_done(
                    self.run_id, task.id, jsonable(outcome), self.clock.now(),
                    _event(task, E.EFFECT, self.clock.now(), detail={"key": key}))
        except Exception as exc:
            error = redact(f"{type(exc).__name__}: {exc}")
            retry_at = self.core.effect_failed(task.id, error, self.clock.now())
            log.warning("effect of %s failed: %s", task.id, error)
            with contextlib.suppress(StoreError):
                await self.store.append_event(self.run_id, _event(
                    task, E.EFFECT_FAILED, self.clock.now(),
                    detail={"key": key, "error": error, "retry_at": retry_at}))
            return
        self.core.effect_applied(task.id, self.clock.now())

    async def _result(self, started: float) -> RunResult:
        state = await self._patiently(lambda: self.store.load(self.run_id))
        tasks = {t.id: t for t in state.tasks}
        finished = max((t.finished_at or started for t in tasks.values()), default=started)
        done: dict[str, dict[str, float]] = {}
        for t in tasks.values():
            if t.status is Status.COMPLETED and t.assigned_to:
                w = done.setdefault(t.assigned_to, {"tasks": 0, "busy_s": 0.0})
                w["tasks"] += 1
                w["busy_s"] += (t.finished_at or 0) - (t.started_at or 0)
        facts = self.core.facts
        return RunResult(
            run_id=self.run_id, tasks=tasks, events=state.events,
            audit=analyze(tasks.values(), state.events, self.effects), started_at=started,
            finished_at=finished, aborted_by=facts.aborted_by,
            budget_exhausted=facts.budget_exhausted, workers=done,
            deadline_reached=facts.deadline_reached, effects_failed=dict(facts.effects_failed),
        )


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
        extras, timeout: as for :class:`~planrun.Supervisor` (a kind's ``timeout_s``
            overrides ``timeout``).
        idle_exit: stop after this many seconds with no running run and no work (None: never).
        clock: :class:`RealClock` (default) or :class:`VirtualClock` (tests).
        backoff: deprecated and ignored: the coordinator's retry policy decides retries.
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
        backoff: RetryPolicy | Backoff | None = None,
        extras: Mapping[str, Any] | None = None,
        idle_exit: float | None = None,
        timeout: float | None = None,
        clock: Clock | None = None,
        extras_for: Callable[[str], Awaitable[Mapping[str, Any]]] | None = None,
    ) -> None:
        if backoff is not None:
            warnings.warn("WorkerProcess(backoff=...) is ignored: the coordinator decides "
                          "retries with its own policy", DeprecationWarning, stacklevel=2)
        self.registry = registry
        self.store = store
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.kinds = list(kinds or registry.names)
        unknown = [k for k in self.kinds if k not in registry]
        if unknown:
            raise UsageError(f"unknown kind(s) {unknown}; the app has {registry.names}")
        if capacity < 1:
            raise UsageError("capacity must be >= 1")
        if not lease_s > 0:
            raise UsageError(f"lease_s must be > 0, got {lease_s}")
        check_policies(timeout=timeout)
        self.capacity = capacity
        self.mode = mode
        self.lease_s = lease_s
        self.poll = poll
        self.extras = dict(extras or {})
        self.extras_for = extras_for
        self.idle_exit = idle_exit
        self.timeout = timeout
        self.clock: Clock = clock or RealClock()
        self._stamp_in_store = isinstance(self.clock, RealClock)
        self._running: dict[tuple[str, str], _Running] = {}
        self._registered: set[str] = set()
        self._beats: dict[str, float] = {}
        self._gates: dict[str, Mapping[str, Any] | None] = {}
        self.done = 0
        self.rejected = 0
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()

    def stop(self) -> None:
        """Finish the tasks in hand, take no more."""
        self._stop.set()
        self._wake.set()

    def _now(self) -> float:
        return self.clock.now()

    async def arun(self) -> None:
        """Serve every running run of the store until stopped (or idle past ``idle_exit``)."""
        idle_since = self._now()
        delay, outages = self.poll, 0
        runs: list[str] = []
        listed = float("-inf")
        while not self._stop.is_set():
            try:
                if self._now() - listed > 1.0 or not runs:  # new runs are rare: look each second
                    runs = [r.id for r in await self.store.list_runs() if r.status == "running"]
                    listed = self._now()
                busy = await self._round(runs)
                delay, outages = self.poll, 0
            except StoreError as exc:
                # The database went away: take nothing, keep what runs, try again later.
                log.warning("worker %s: store unavailable (%s); retrying", self.name, exc)
                runs, busy = [], bool(self._running)
                outages += 1
                delay = STORE_PATIENCE.backoff(outages)
            if busy or runs:
                idle_since = self._now()
            elif self.idle_exit is not None and self._now() - idle_since > self.idle_exit:
                break
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)
        if self._running:
            await asyncio.gather(*(r.handle for r in self._running.values()),
                                 return_exceptions=True)

    async def _round(self, runs: Sequence[str]) -> bool:
        now = self._now()
        for run_id in runs:
            if run_id not in self._registered:
                await self.store.register_worker(run_id, self.name, self.kinds, self.capacity,
                                                 now)
                self._registered.add(run_id)
            if now - self._beats.get(run_id, float("-inf")) > min(1.0, self.lease_s / 3):
                await self.store.heartbeat_worker(run_id, self.name, now)
                self._beats[run_id] = now
            free = self.capacity - len(self._running)
            if free <= 0:
                continue
            # now=None: the store stamps the start once it holds its write lock, so the
            # ledger never shows a task starting before a dependency finished elsewhere.
            stamp = None if self._stamp_in_store else now
            if self.mode == "push":
                tasks = await self.store.take_assigned(run_id, self.name, stamp, self.lease_s,
                                                       free)
            else:
                tasks = await self.store.claim(run_id, self.name, self.kinds, stamp,
                                               self.lease_s, free)
            for task in tasks:
                key = (run_id, task.id)
                handle = asyncio.ensure_future(tracing.worker_attempt(
                    self._execute(run_id, task), self.store, run_id, task, self.name))
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
        limit = spec.timeout_s if spec.timeout_s is not None else self.timeout
        addition: Addition | None = None
        try:
            extras = self.extras
            if self.extras_for is not None:  # the run's own model, limiter and budget
                extras = {**extras, **await self.extras_for(run_id)}
            ctx = TaskContext(run_id=run_id, task_id=task.id, kind=task.kind,
                              attempt=task.token, worker=self.name, skill=1.0,
                              payload=task.payload, estimate_s=task.estimate_s,
                              inputs=await self._inputs(run_id, task), extras=extras)
            result = await run_attempt(spec, spec.handler, task, ctx, limit)
            addition = await self._expansion(run_id, task, ctx.spawned)
        except asyncio.CancelledError:
            raise
        except (TimeoutError, asyncio.TimeoutError) as exc:
            outcome, name, detail = self._failure(task, timed_out(exc, limit))
        except InvalidPlan as exc:
            outcome, name, detail = self._refused(task, spawn_refused(exc))
        except Exception as exc:
            outcome, name, detail = self._failure(task, exc)
        else:
            outcome, name, detail = await self._completed(run_id, task, result)
            if addition is not None:
                detail = {**detail, "spawned": len(addition.tasks)}
        finally:
            renewer.cancel()
        await self._report(run_id, task, outcome, name, detail, addition)

    async def _completed(self, run_id: str, task: Task,
                         result: Any) -> tuple[Task, str, dict[str, Any]]:
        """The completion, or, when the run's rules (kept in its meta) hold the effect of
        this task for an approval, the task ``waiting`` with its result: the coordinator's
        core then decides (a condition included), and completes it once approved."""
        if run_id not in self._gates:
            self._gates[run_id] = (await self.store.load_tasks(run_id)).run.meta.get(
                "approvals")
        rule = kept_gate(self._gates[run_id], task)
        now = self._now()
        if rule is not None and rule.get("before") == "effect":
            timeout = rule.get("timeout_s")
            at = None if timeout is None else now + float(timeout)
            waiting = transition(task, Status.WAITING, result=result,
                                 attempts=task.attempts + 1, lease=None, error=None,
                                 error_class=None, cause=waiting_cause("effect"),
                                 not_before=at)
            return waiting, E.WAITING, {"for": "effect", "timeout_at": at}
        done = transition(task, Status.COMPLETED, result=result, finished_at=now,
                          attempts=task.attempts + 1, lease=None, error=None,
                          error_class=None)
        return done, E.COMPLETED, {}

    async def _expansion(self, run_id: str, task: Task,
                         spawned: Sequence[SpawnRequest]) -> Addition | None:
        """What the attempt's spawns add, by the core's rule, against the stored run."""
        if not spawned:
            return None
        state = await self.store.load_tasks(run_id)
        limits = dict(state.run.meta.get("spawn") or {})
        attempts = limits.pop("max_attempts", None)
        records = {t.id: t for t in state.tasks}
        addition = expand(records.get(task.id, task), spawned, records, self.registry,
                          SpawnLimits.from_dict(limits), self._now(),
                          default_attempts=None if attempts is None else int(attempts))
        gates = state.run.meta.get("approvals")
        if self.mode != "peer" or not gates:
            return addition
        # Peer workers claim alone: a spawned task gated before its start is written
        # waiting (the coordinator's core decides a condition when it reads the row).
        held: list[Task] = []
        for new in addition.tasks:
            rule = kept_gate(gates, new)
            if rule is not None and rule.get("before") == "start":
                timeout = rule.get("timeout_s")
                at = None if timeout is None else self._now() + float(timeout)
                new = transition(new, Status.WAITING, cause=waiting_cause("start"),
                                 not_before=at)
            held.append(new)
        return dataclasses.replace(addition, tasks=tuple(held))

    def _refused(self, task: Task, failure: Failure) -> tuple[Task, str, dict[str, Any]]:
        failed = transition(task, Status.FAILED, error=failure.error,
                            error_class=failure.error_class, attempts=task.attempts + 1,
                            lease=None)
        return failed, E.FAILED, {"error": failure.error}

    async def _inputs(self, run_id: str, task: Task) -> dict[str, Any]:
        if not task.depends_on:
            return {}
        return {t.id: t.result for t in await self.store.load_some(run_id, task.depends_on)}

    def _failure(self, task: Task, exc: BaseException) -> tuple[Task, str, dict[str, Any]]:
        """What happened, as a record: the coordinator decides what it means."""
        now = self._now()
        failure = failure_of(exc)
        if failure.budget:  # the run's budget refused this attempt: a fact, not a decision
            return (transition(task, Status.CANCELLED, cause="budget", error=failure.error,
                               error_class=failure.error_class, finished_at=now, lease=None),
                    E.CANCELLED, {"cause": "budget"})
        server_at = None if failure.retry_after is None else now + failure.retry_after
        failed = transition(task, Status.FAILED, error=failure.error,
                            error_class=failure.error_class, attempts=task.attempts + 1,
                            lease=None, not_before=server_at)
        detail: dict[str, Any] = {"error": failure.error}
        if failure.retry_after is not None:
            detail["retry_after"] = failure.retry_after
        return failed, E.FAILED, detail

    async def _report(self, run_id: str, task: Task, outcome: Task, name: str,
                      detail: Mapping[str, Any], addition: Addition | None = None) -> None:
        """Write the outcome fenced by the token; never write one that cannot be fenced.

        What the attempt spawned goes in the same transaction: a refused (reclaimed)
        outcome adds nothing.
        """
        tracing.attempt_outcome(outcome, name)
        now = self._now()
        event = _event(outcome, name, now, self.name, detail)
        added: list[tuple[Task, Event | tuple[Event, ...]]] = []
        widened: list[tuple[Task, Event]] = []
        if addition is not None:
            widened = [(j, _event(j, E.JOINED, now, detail={"depends_on": len(j.depends_on)}))
                       for j in addition.joiners]
            added = [(t, _created_events(t, now)) for t in addition.tasks]
        tries = 0
        while True:
            try:
                ok = await self.store.write_fenced(run_id, outcome, event, task.token,
                                                   added, widened)
                break
            except WidenConflict:  # another spawn widened a joiner first: read it again
                assert addition is not None
                addition = await self._expansion(run_id, task, addition.requests)
                assert addition is not None
                widened = [(j, _event(j, E.JOINED, now,
                                      detail={"depends_on": len(j.depends_on)}))
                           for j in addition.joiners]
            except StoreError as exc:
                if self._now() > (task.lease or 0) + self.lease_s:
                    log.warning("worker %s: dropping the result of %s: %s", self.name,
                                task.id, exc)
                    return
                tries += 1
                await asyncio.sleep(STORE_PATIENCE.backoff(tries))
        if ok:
            self.done += name in (E.COMPLETED, E.WAITING)
        else:
            self.rejected += 1
            log.info("worker %s: result of %s refused (reclaimed meanwhile)", self.name, task.id)

    async def _renew(self, run_id: str, task: Task) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            with contextlib.suppress(StoreError):
                if not await self.store.renew(run_id, task.id, task.token,
                                              self._now() + self.lease_s):
                    return  # reclaimed: whatever we produce will be refused
