"""The in-process supervisor: a driver of the scheduling core on asyncio tasks.

It feeds :class:`planrun.core.scheduling.Scheduler` what happens (an attempt returned, raised or
beat; time passed) and carries out what the core decided: start an attempt as an asyncio
task, apply an effect, write each change and its ledger event to the store in batches. It
decides nothing itself: readiness, routing, retries, deaths, reclaims, locks, the budget
stop, the deadline and stall detection are the core's.
"""

from __future__ import annotations

import asyncio
import functools

from planrun.core import (
    Ledger,
    RunResult,
    StallError,
    UsageError,
    analyze,
    audit_when_read,
)
from planrun.core.scheduling import (
    Backoff,
)
from planrun.runtime import _heap
from planrun.runtime._batch_journal import LedgerJournal
from planrun.runtime._clock import run_blocking
from planrun.runtime._supervisor_attempts import _SupervisorAttempts
from planrun.runtime._supervisor_state import (  # noqa: F401
    _FINISHED_AT,
    _RECLAIMED,
    _REJECTED,
    _STARTED,
    _STATUS,
    _WAITING,
    GATHER_MAX_S,
    GATHER_S,
    WRITE_STALL_S,
    EffectFn,
    Replanner,
    _How,
    _new_object,
    _partial,
    _set_attr,
    ask_replanner,
)

__all__ = ["Backoff", "EffectFn", "Replanner", "RunResult", "Supervisor"]


class Supervisor(_SupervisorAttempts):
    """Owns a run's tasks and drives them to completion through registered workers.

    Args:
        registry: the kinds that exist, with their handlers.
        workers: the workers; default one worker doing every kind, 8 at a time.
        strategy: ``round_robin``, ``least_loaded``, ``capability`` or ``balanced``.
        max_attempts: attempts per task before it is ``dead`` (a task may override it).
        retry: the :class:`~planrun.RetryPolicy` between attempts (default: 2 s doubling to
            60 s, up to 25 % less at random, ``Retry-After`` honoured up to 60 s). Its
            ``attempts`` is the default of ``max_attempts`` when that is not given.
        backoff: the older name of ``retry`` (a ``RetryPolicy``; a deprecated
            :class:`Backoff` still works).
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
        if self.deadline_s is not None:
            self.core.set_deadline(started + self.deadline_s)
        # The store's first and last batches (every record) are built while it is frozen too.
        with _heap.frozen_heap(self.freeze_heap):
            await self._open_run(started)
            self._choose_sink()
            status = "failed"
            try:
                self.core.start(started)
                if self._resumed:
                    self._recover(started)
                self._advance(started)
                await self._loop()
                status = "aborted" if self.core.facts.aborted_by else "finished"
            except (asyncio.CancelledError, KeyboardInterrupt):
                status = "interrupted"
                raise
            finally:
                try:
                    leftovers = [*self._running.values(), *self._background, *self._zombies]
                    for handle in leftovers:
                        handle.cancel()
                    if leftovers:
                        await asyncio.gather(*leftovers, return_exceptions=True)
                finally:
                    await self._close_run(status)
            return self._result(started)

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
        self.ledger = Ledger(state.events)
        self._effect_records = dict(state.effects)
        self.core.spent_before(state.events)
        self.core.restore(list(state.tasks))
        self.core.timing.answered_before(state.events)
        self._resumed = True
        return await self.arun()

    def resume(self) -> RunResult:
        """Synchronous :meth:`aresume` (on a private thread inside a running loop)."""
        return run_blocking(self.clock, self.aresume)

    def batch_due(self, waiting: int, slots: int, margin_s: float) -> bool:
        """Whether ``waiting`` model calls in Batch API jobs must go live now to finish by
        the deadline, ``slots`` at once (the core's rule; see :meth:`Scheduler.batch_due`)."""
        return self.core.batch_due(self.clock.now(), waiting, slots, margin_s)

    def batch_journal(self) -> LedgerJournal:
        """Where this run's Batch API jobs are recorded: its ledger (see
        :class:`~planrun.model.BatchJournal`)."""
        return LedgerJournal(self)

    def _recover(self, now: float) -> None:
        for task_id, record in self._effect_records.items():
            if record.state == "applied":
                self.core.effect_known(task_id)
        self.core.recover(now)

    async def _loop(self) -> None:
        """Sleep until the run ends or the next time something is due.

        Outcomes do not wake this loop: they are carried out in the callbacks that report
        them. It wakes for the end of the run, timers, and a store that failed.
        """
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        core = self.core
        while not core.done or self._background:
            self._wake.clear()
            if self._flusher is not None and self._flusher.done():
                self._flusher.result()  # a store that stayed down: raise its StoreError
            now = self.clock.now()
            await self._poll_decisions(now)
            now = self.clock.now()
            self._advance(now)
            if core.stalled(now) and not self._background:
                raise StallError(core.stall_message(self.run_id, now))
            if core.done and not self._background:
                break
            self._timer_at = core.next_wakeup(now)
            if self.store is not None and core.awaiting:
                self._timer_at = min(self._timer_at, max(now, self._next_poll))
            self._timer_at = min(self._timer_at, now + 3600.0)  # waiting for a person only
            timer = loop.call_later(max(0.0, self._timer_at - now), self._wake.set)
            try:
                await self._wake.wait()
            finally:
                timer.cancel()

    def _advance(self, now: float) -> None:
        """Let the core handle what is due, then carry out what it decided."""
        core = self.core
        core.pause(self._store_down)
        core.tick(now)
        self._launch(core.dispatch(now))
        for task in core.effects_due(now):
            self._spawn(self._apply_effect(task))
        self._ask_replans()
        self._to_store()

    def _check_workers(self) -> None:
        done: set[str] = set()  # kinds some worker does
        for task in self.core.tasks.values():
            if task.kind in done or task.finished:
                continue
            if not self.core.capable(task.kind):
                raise UsageError(f"no registered worker does kind {task.kind!r} (task {task.id!r})")
            done.add(task.kind)

    def _result(self, started: float) -> RunResult:
        tasks = dict(self.core.tasks)
        # A run ends no earlier than it starts: a resume whose tasks all ended before it
        # began (a finished run resumed again) lasts 0 s, never a negative time.
        finished = max(filter(None, map(_FINISHED_AT, tasks.values())), default=started)
        finished = max(finished, started)
        facts = self.core.facts
        return RunResult(
            run_id=self.run_id,
            tasks=tasks,
            events=self.ledger.view(),
            audit=audit_when_read(functools.partial(
                analyze, tasks.values(), self.ledger.view(), tuple(self.effects))),
            started_at=started,
            finished_at=finished,
            aborted_by=facts.aborted_by,
            budget_exhausted=facts.budget_exhausted,
            workers={w.name: {"tasks": w.done, "busy_s": w.busy_s}
                     for w in self.core.workers.values()},
            deadline_reached=facts.deadline_reached,
            effects_failed=dict(facts.effects_failed),
        )
