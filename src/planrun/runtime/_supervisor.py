"""The in-process supervisor: a driver of the scheduling core on asyncio tasks.

It feeds :class:`planrun.core.scheduling.Scheduler` what happens (an attempt returned, raised or
beat; time passed) and carries out what the core decided: start an attempt as an asyncio
task, apply an effect, write each change and its ledger event to the store in batches. It
decides nothing itself: readiness, routing, retries, deaths, reclaims, locks, the budget
stop, the deadline and stall detection are the core's.

It is made of parts it holds, each with its own state:

* :class:`~planrun.runtime._run_log.RunLog`: the ledger and the core's sink;
* :class:`~planrun.runtime._run_writes.RunWrites`: the run written to its store in batches;
* :class:`~planrun.runtime._in_flight.InFlight`: the attempts running on asyncio tasks;
* :class:`~planrun.runtime._side_work.SideWork`: effects applied and replans asked;
* :class:`~planrun.runtime._decisions.DecisionPoll`: the decisions another process wrote.

The supervisor itself keeps the run's settings, adds tasks, takes the decisions made in its
process (approvals) and runs the loop that sleeps until something is due.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from planrun.core import (
    Event,
    Ledger,
    Registry,
    Repair,
    Router,
    RunResult,
    StallError,
    Task,
    UsageError,
    WorkerSpec,
    analyze,
    audit_when_read,
    get_router,
)
from planrun.core.scheduling import (
    EFFECT_RETRY,
    SCHEDULER_RETRY,
    Approval,
    OnDead,
    RetryPolicy,
    Scheduler,
    SpawnLimits,
    as_policy,
    check_policies,
)
from planrun.runtime import _heap
from planrun.runtime._batch_journal import LedgerJournal
from planrun.runtime._clock import Clock, RealClock, run_blocking
from planrun.runtime._decisions import DecisionPoll
from planrun.runtime._in_flight import InFlight
from planrun.runtime._run_log import RunLog
from planrun.runtime._run_writes import RunWrites
from planrun.runtime._side_work import EffectFn, Replanner, SideWork
from planrun.runtime._usage_journal import UsageJournal

if TYPE_CHECKING:
    from planrun.stores.base import Store

__all__ = ["STALE_AFTER_S", "EffectFn", "Replanner", "RunResult", "Supervisor"]

STALE_AFTER_S = 90.0
"""Seconds without a heartbeat after which a running task is reclaimed, unless given."""

_FINISHED_AT = attrgetter("finished_at")


class Supervisor:
    """Owns a run's tasks and drives them to completion through registered workers.

    Args:
        registry: the kinds that exist, with their handlers.
        workers: the workers; default one worker doing every kind, 8 at a time.
        strategy: ``round_robin``, ``least_loaded``, ``capability`` or ``balanced``.
        max_attempts: attempts per task before it is ``dead`` (a task may override it).
        retry: the :class:`~planrun.RetryPolicy` between attempts (default: 2 s doubling to
            60 s, up to 25 % less at random, ``Retry-After`` honoured up to 60 s). Its
            ``attempts`` is the default of ``max_attempts`` when that is not given.
        retry_budget: retries allowed over the whole run; ``None`` for no limit.
        timeout: seconds one attempt may take before it counts as a transient failure
            (a kind's ``KindSpec.timeout_s`` overrides it).
        stale_after: seconds without a heartbeat after which a running task is reclaimed.
        max_reclaims: reclaims after which a task is ``dead`` instead of tried again (only
            a lease that expired under a live supervisor counts; a restart does not).
        on_dead: ``cancel_dependents`` (default) or ``abort_run``.
        stall_after: seconds without any task record changing before :class:`StallError`
            (a task waiting for a known retry time is not a stall).
        deadline_s: seconds from the start after which nothing new starts: tasks not started
            are ``cancelled`` with cause ``deadline``; attempts in flight keep their timeout.
        clock: :class:`RealClock` (default) or :class:`VirtualClock`.
        effects: kind -> effect applied once after a task of that kind completes (retried
            with backoff while it fails; one that finally fails makes the run not ok).
        on_event: called with each ledger event and the task record after it.
        extras: objects handed to every handler through ``TaskContext.extras``.
        seed: seed of the jitter's random generator (for reproducible runs).
        store: an opened :class:`~planrun.stores.Store`; every transition and its event are
            written to it (in batches, each batch one transaction) so a run survives a
            crash and :meth:`resume` carries it on.
        goal: recorded with the run in the store.
        meta: recorded with the run in the store.
        store_patience: seconds a failing store is retried (a database restart) before the
            run stops with :class:`StoreError`; no new attempt starts meanwhile.
        effect_retry: how a failing effect is tried again (default 6 tries, 1 s doubling
            to 30 s); one that fails every try makes the run not ok.
        spawn_limits: how far the run may grow while it runs (tasks handlers add with
            :meth:`TaskContext.spawn`): tasks per run, per spawning task, depth of spawning.
        replanner: with ``on_dead="replan"``, asked for a fragment that replaces a dead task
            and the dependents its death cancelled (``await replanner(request)`` returns
            :class:`SpawnRequest` items); the fragment is validated like a spawn. None: a
            death cancels its dependents.
        max_replans: replans allowed over the whole run; past it a death cancels.
        approvals: kind -> :class:`~planrun.Approval` (or ``"start"`` /
            ``"effect"``): its tasks wait in status ``waiting`` until :meth:`approve` or
            :meth:`reject` (or ``planrun approve`` / ``planrun reject`` on the store).
        task_approvals: task id -> approval, for single tasks.
        approval_poll: seconds between reads of the store for decisions another process
            wrote (only while a task waits, and only with a store).
    """

    freeze_heap: bool = _heap.ENABLED
    """While a run goes on, keep the objects the process had when it began out of the garbage
    collector's passes (``gc.freeze``, undone when the last run ends; see ``planrun._heap``).
    False, or ``PLANRUN_GC_FREEZE=0`` in the environment, turns it off."""

    def __init__(
        self,
        registry: Registry,
        workers: Iterable[WorkerSpec] | None = None,
        *,
        strategy: str | Router = "balanced",
        max_attempts: int | None = None,
        retry: RetryPolicy | None = None,
        retry_budget: int | None = None,
        timeout: float | None = None,
        stale_after: float = STALE_AFTER_S,
        max_reclaims: int = 3,
        on_dead: OnDead = "cancel_dependents",
        stall_after: float = 900.0,
        deadline_s: float | None = None,
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
        effect_retry: RetryPolicy | None = None,
        spawn_limits: SpawnLimits | None = None,
        replanner: Replanner | None = None,
        max_replans: int = 2,
        approvals: Mapping[str, Approval | str] | None = None,
        task_approvals: Mapping[str, Approval | str] | None = None,
        approval_poll: float = 1.0,
    ) -> None:
        self.retry = as_policy(retry, SCHEDULER_RETRY)
        self.max_attempts = max_attempts if max_attempts is not None else self.retry.attempts
        check_policies(on_dead=on_dead, retry_budget=retry_budget, timeout=timeout,
                       stale_after=stale_after, stall_after=stall_after,
                       max_reclaims=max_reclaims, max_attempts=self.max_attempts,
                       deadline_s=deadline_s)
        self.registry, self.timeout, self.deadline_s = registry, timeout, deadline_s
        self.clock: Clock = clock or RealClock()
        self._now: Callable[[], float] = (  # plain time.time for the real clock: a call less
            time.time if type(self.clock) is RealClock else self.clock.now)
        self.effects, self.extras = dict(effects or {}), dict(extras or {})
        self.store, self.goal, self.meta = store, goal, dict(meta or {})
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.store_patience = store_patience
        self._run_log = log = RunLog(on_event, self._now)
        self.core = Scheduler(
            router=get_router(strategy), retry=self.retry, sink=log.record,
            retry_budget=retry_budget, max_reclaims=max_reclaims, on_dead=on_dead,
            stale_after=stale_after, stall_after=stall_after, effects=self.effects, seed=seed,
            effect_retry=effect_retry or EFFECT_RETRY, kinds=registry,
            spawn_limits=spawn_limits, default_attempts=self.max_attempts,
            max_replans=max_replans, approvals=approvals, task_approvals=task_approvals,
            can_replan=replanner is not None)
        self._assemble(replanner, workers, approval_poll)

    def _assemble(self, replanner: Replanner | None, workers: Iterable[WorkerSpec] | None,
                  approval_poll: float) -> None:
        """The parts around the core (its store's writes, its side work, its attempts in
        flight, its reads of decisions made elsewhere), its workers, and the loop's state."""
        core, log = self.core, self._run_log
        self._decisions = DecisionPoll(self.store, self.run_id, core, every=approval_poll,
                                       now=self.clock.now)
        self._writes = RunWrites(self.store, self.run_id, core, log, now=self.clock.now,
                                 patience=self.store_patience, wake=self._wake_up)
        self._side = SideWork(core, self.run_id, effects=self.effects, replanner=replanner,
                              log=log, writes=self._writes, now=self.clock.now,
                              dispatch=self._dispatch, wake=self._wake_up)
        self._in_flight = InFlight(core, self.registry, run_id=self.run_id,
                                   extras=self.extras, timeout=self.timeout, now=self._now,
                                   due=self._side.carry_out_due, settled=self._settled)
        log.bind(core, noted=self._writes.noted, reclaimed=self._in_flight.reclaimed,
                 started=self._in_flight.started, wake=self._wake_up)
        for spec in workers if workers is not None else [WorkerSpec("worker", None, 8)]:
            self.register(spec)
        self._wake: asyncio.Event | None = None
        self._timer_at = float("inf")
        self._started = self._resumed = False

    # ---- what a caller reads and decides ---------------------------------------------------

    @property
    def ledger(self) -> Ledger:
        """The run's ledger: every event so far."""
        return self._run_log.ledger

    @property
    def on_event(self) -> Callable[[Event, Task], None] | None:
        """The listener every ledger event is handed to, if any."""
        return self._run_log.on_event

    @property
    def replanner(self) -> Replanner | None:
        """What is asked for a fragment replacing a dead task, if anything."""
        return self._side.replanner

    @property
    def tasks(self) -> Mapping[str, Task]:
        """Current records by id (read-only view)."""
        return dict(self.core.tasks)

    @property
    def waiting(self) -> list[str]:
        """Ids of the tasks waiting for a person's approval."""
        return sorted(self.core.awaiting)

    @property
    def stale_after(self) -> float:
        """Lease length of a running attempt."""
        return self.core.stale_after

    def register(self, worker: WorkerSpec) -> None:
        """Add a worker; names are unique."""
        self.core.add_worker(worker)

    def add(self, task: Task) -> Task:
        """Add one task; its dependencies must already be added."""
        return self.add_tasks([task])[0]

    def add_tasks(self, tasks: Iterable[Task], *, repairs: Sequence[Repair] = ()) -> list[Task]:
        """Add tasks in any order; dependencies must be in the batch or already added.

        ``repairs``: those of the plan the tasks are (given in its order, as
        :meth:`Plan.to_tasks` gives them), recorded in the ledger as ``repaired`` events.

        Raises:
            InvalidPlan: the batch has a dependency cycle.
            UsageError: a duplicate id, an unknown dependency or kind, or a started run.
        """
        if self._started:
            raise UsageError("tasks cannot be added once the run has started")
        self._run_log.choose_sink(durable=self.store is not None)
        with _heap.frozen_heap(self.freeze_heap):  # a large batch: a record per task
            batch = list(tasks)
            added = self.core.add(batch, self.clock.now(), default_attempts=self.max_attempts,
                                  known=self.registry.__contains__)
            if repairs:
                self.core.ready.repaired(batch, repairs)
            return added

    def approve(self, task_id: str, note: str | None = None) -> Task:
        """Approve a waiting task (call it on the run's event loop, e.g. from ``on_event``).

        Raises:
            UsageError: the task is not waiting (approving twice included).
        """
        task = self.core.approve(task_id, self.clock.now(), note, by="api")
        self._after_decision()
        return task

    def reject(self, task_id: str, reason: str) -> Task:
        """Reject a waiting task: it is ``dead`` with cause ``rejected``.

        Raises:
            UsageError: the task is not waiting, or ``reason`` is empty.
        """
        task = self.core.reject(task_id, self.clock.now(), reason, by="api")
        self._after_decision()
        return task

    def batch_due(self, waiting: int, slots: int, margin_s: float) -> bool:
        """Whether ``waiting`` model calls in Batch API jobs must go live now to finish by
        the deadline, ``slots`` at once (the core's rule; see :meth:`Scheduler.batch_due`)."""
        return self.core.batch_due(self.clock.now(), waiting, slots, margin_s)

    def batch_journal(self) -> LedgerJournal:
        """Where this run's Batch API jobs are recorded: its ledger (see
        :class:`~planrun.model.BatchJournal`)."""
        return LedgerJournal(self.core, self._run_log, self._writes)

    def usage_journal(self) -> UsageJournal:
        """Where the usage records of this run's tasks go: its ledger (listen with it to
        the run's :class:`~planrun.model.Usage`; made on the loop the run goes on)."""
        return UsageJournal(self.core, self._run_log)

    # ---- running ------------------------------------------------------------------------

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
        _check_workers(self.core)
        self._wake = asyncio.Event()
        started = self.clock.now()
        if self.deadline_s is not None:
            self.core.set_deadline(started + self.deadline_s)
        # The store's first and last batches (every record) are built while it is frozen too.
        with _heap.frozen_heap(self.freeze_heap):
            await self._writes.open(started, resumed=self._resumed, goal=self.goal,
                                    meta=self.meta)
            self._run_log.choose_sink(durable=self.store is not None)
            status = "failed"
            try:
                self.core.start(started)
                if self._resumed:
                    self._side.recover()
                    self.core.recover(started)
                self._advance(started)
                await self._loop()
                status = "aborted" if self.core.facts.aborted_by else "finished"
            except (asyncio.CancelledError, KeyboardInterrupt):
                status = "interrupted"
                raise
            finally:
                try:
                    leftovers = [*self._in_flight.handles(), *self._side.handles()]
                    for handle in leftovers:
                        handle.cancel()
                    if leftovers:
                        await asyncio.gather(*leftovers, return_exceptions=True)
                finally:
                    await self._writes.close(status)
            return _result(self, started)

    async def aresume(self) -> RunResult:
        """Carry on the run ``run_id`` from the store after a crash or a stop.

        Completed tasks keep their results and never run again; tasks that were assigned
        or running under the dead supervisor are put back (no attempt is consumed, and the
        restart does not count toward ``max_reclaims``); backoff deadlines are kept;
        effects begun but not recorded are applied again with the same key.
        """
        if self.store is None:
            raise UsageError("resume needs a store")
        if self.core.tasks:
            raise UsageError("resume loads its tasks from the store; add none")
        state = await self.store.load(self.run_id)
        self.goal = self.goal or state.run.goal
        self.meta = {**state.run.meta, **self.meta}
        self._run_log.ledger = Ledger(state.events)
        self._side.effect_records = dict(state.effects)
        self.core.spent_before(state.events)
        self.core.restore(list(state.tasks))
        self.core.timing.resumed_tiers(self.meta.get("tiers"), state.events)
        self._resumed = True
        return await self.arun()

    def resume(self) -> RunResult:
        """Synchronous :meth:`aresume` (on a private thread inside a running loop)."""
        return run_blocking(self.clock, self.aresume)

    async def _loop(self) -> None:
        """Sleep until the run ends or the next time something is due.

        Outcomes do not wake this loop: they are carried out in the callbacks that report
        them. It wakes for the end of the run, timers, and a store that failed.
        """
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        core, side = self.core, self._side
        while not core.done or side.busy:
            self._wake.clear()
            self._writes.check()  # a store that stayed down: raise its StoreError
            now = self.clock.now()
            if await self._decisions.poll(now):
                self._advance(self.clock.now())
            now = self.clock.now()
            self._advance(now)
            if core.stalled(now) and not side.busy:
                raise StallError(core.stall_message(self.run_id, now))
            if core.done and not side.busy:
                break
            self._timer_at = min(core.next_wakeup(now), self._decisions.wake_at(now),
                                 now + 3600.0)  # waiting for a person only
            timer = loop.call_later(max(0.0, self._timer_at - now), self._wake.set)
            try:
                await self._wake.wait()
            finally:
                timer.cancel()

    def _advance(self, now: float) -> None:
        """Let the core handle what is due, then carry out what it decided."""
        core = self.core
        core.pause(self._writes.down)
        core.tick(now)
        self._in_flight.launch(core.dispatch(now))
        self._side.carry_out_due(now)
        self._writes.to_store()

    def _dispatch(self, now: float) -> None:
        """Start what is ready (after a replan's fragment was added)."""
        self._in_flight.launch(self.core.dispatch(now))
        self._writes.to_store()

    def _settled(self, now: float) -> None:
        """After the outcomes of a pass of the event loop (see :class:`InFlight`): write
        them, and wake :meth:`_loop` if it sleeps until a time that is no longer the next
        one (the run ended, a lease or retry falls due sooner)."""
        self._writes.to_store()
        if self.core.wakes_before(self._timer_at, now):
            self._wake_up()

    def _after_decision(self) -> None:
        if self._started and self._wake is not None:
            self._advance(self.clock.now())
            self._wake_up()

    def _wake_up(self) -> None:
        if self._wake is not None:
            self._wake.set()


def _check_workers(core: Scheduler) -> None:
    """Every kind some unfinished task has is done by some worker."""
    done: set[str] = set()  # kinds some worker does
    for task in core.tasks.values():
        if task.kind in done or task.finished:
            continue
        if not core.capable(task.kind):
            raise UsageError(f"no registered worker does kind {task.kind!r} (task {task.id!r})")
        done.add(task.kind)


def _result(sup: Supervisor, started: float) -> RunResult:
    """The result of ``sup``'s run, started at ``started``."""
    core, ledger = sup.core, sup.ledger
    tasks = dict(core.tasks)
    # A run ends no earlier than it starts: a resume whose tasks all ended before it
    # began (a finished run resumed again) lasts 0 s, never a negative time.
    finished = max(filter(None, map(_FINISHED_AT, tasks.values())), default=started)
    finished = max(finished, started)
    facts = core.facts
    return RunResult(
        run_id=sup.run_id,
        tasks=tasks,
        events=ledger.view(),
        audit=audit_when_read(functools.partial(
            analyze, tasks.values(), ledger.view(), tuple(sup.effects))),
        started_at=started,
        finished_at=finished,
        aborted_by=facts.aborted_by,
        budget_exhausted=facts.budget_exhausted,
        workers={w.name: {"tasks": w.done, "busy_s": w.busy_s}
                 for w in core.workers.values()},
        deadline_reached=facts.deadline_reached,
        effects_failed=dict(facts.effects_failed),
    )
