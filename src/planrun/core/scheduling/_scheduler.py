"""The scheduling core: every decision of a run, over plain data and a time given to it.

:class:`Scheduler` holds one run and decides everything: what becomes ready, which worker
gets it, what a failure means (retry at a time, dead, budget stop), what a death cancels,
what an expired lease means, which effects are due, when the run has passed its deadline, is
stalled or is finished. It is made of parts, each an object with its own state:

- :class:`~planrun.core.scheduling._book.Book`: the records, the sink, and the one place a
  change of a record is applied (and every part's index kept current);
- :class:`~planrun.core.scheduling._ready.Readiness`: the graph, what is ready, in which order;
- :class:`~planrun.core.scheduling._dispatch.Routing`: the workers, who gets a task, starts;
- :class:`~planrun.core.scheduling._leases.Leases`: how long an attempt is believed alive;
- :class:`~planrun.core.scheduling._failing.FailurePolicy`: retry, death, reclaim, cancel;
- :class:`~planrun.core.scheduling._growth.Growth`: tasks added at run time, replans;
- :class:`~planrun.core.scheduling._gates.Approvals`: tasks waiting for a person;
- :class:`~planrun.core.scheduling._effects.Effects`: effects due once;
- :class:`~planrun.core.scheduling._timing.Timing`: what is due when, stall, the end.

It does no I/O and reads no clock: every call passes ``now``. Each change it decides is a
new task record handed to the ``sink`` with its ledger event; a driver persists the change
(a batch for the store) and carries it out (start an attempt, apply an effect). The driver
feeds it the outcomes it saw (:meth:`Scheduler.complete`, :meth:`Scheduler.fail`,
:meth:`Scheduler.heartbeat`), whether the attempt ran in its process or in a worker process
on DBOS, which reports a failure as it classified it and decides nothing.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from planrun.core._errors import InvalidPlan, UsageError
from planrun.core._ledger import EventName as E
from planrun.core._registry import SpawnRequest, WorkerSpec
from planrun.core._routing import Router, WorkerState
from planrun.core._task import Task, completed
from planrun.core.scheduling._approval import Approval
from planrun.core.scheduling._book import Book
from planrun.core.scheduling._common import (
    _CANCELLED,
    _DEAD,
    _FAILED,
    _IN_FLIGHT,
    _RUNNING,
    _WAITING,
    EFFECT_RETRY,
    Note,
    OnDead,
    ReplanRequest,
    RunFacts,
    Sink,
    check_policies,
    retries_spent,
    spawn_refused,
)
from planrun.core.scheduling._dispatch import Routing, Start
from planrun.core.scheduling._effects import Effects
from planrun.core.scheduling._failing import FailurePolicy
from planrun.core.scheduling._gates import Approvals
from planrun.core.scheduling._growth import Growth
from planrun.core.scheduling._leases import Leases
from planrun.core.scheduling._outcome import Failure
from planrun.core.scheduling._ready import Readiness
from planrun.core.scheduling._retry import RetryPolicy
from planrun.core.scheduling._spawn import SpawnLimits
from planrun.core.scheduling._tiers import TierChoice, TierPolicy
from planrun.core.scheduling._timing import Timing

__all__ = ["Scheduler"]


class Scheduler:
    """The state and the rules of one run.

    Args:
        router: picks a worker among capable candidates.
        retry: backoff between attempts and the ``Retry-After`` clamp (attempts per task
            come from each record's ``max_attempts``).
        retry_budget: retries allowed over the whole run (None: no limit).
        max_reclaims: reclaims of an expired lease after which a task is dead.
        on_dead: ``cancel_dependents``, ``abort_run`` or ``replan`` (cancel the dependents,
            then ask the driver's replanner for a fragment that replaces the dead task and
            them; without a replanner, or past ``max_replans``, as ``cancel_dependents``).
        max_replans: replans allowed over the whole run.
        stale_after: lease length, from start.
        stall_after: seconds without any change before :meth:`stalled` says so.
        effects: kinds whose completion has an effect to apply once.
        sink: receives every decided change.
        seed: seed of the jitter.
        deadline: time after which nothing new starts (None: no deadline).
        kinds: the registry additions at run time are validated against (None: a run that
            cannot grow; a spawn is then refused).
        spawn_limits: how far the run may grow while it runs.
        default_attempts: ``max_attempts`` of a task added at run time.
        approvals: kind -> :class:`Approval` (or ``"start"`` / ``"effect"``): tasks of that
            kind wait for a person's decision (:meth:`approve`, :meth:`reject`).
        task_approvals: task id -> :class:`Approval`, for single tasks (over their kind's).
        can_replan: the driver has a replanner (``on_dead="replan"`` asks it).
    """

    def __init__(self, *, router: Router, retry: RetryPolicy, sink: Sink,
                 retry_budget: int | None = None, max_reclaims: int = 3,
                 on_dead: OnDead = "cancel_dependents", stale_after: float = 90.0,
                 stall_after: float = 900.0, effects: Collection[str] = (),
                 seed: int | None = None, deadline: float | None = None,
                 effect_retry: RetryPolicy = EFFECT_RETRY, kinds: Any = None,
                 spawn_limits: SpawnLimits | None = None, default_attempts: int | None = None,
                 max_replans: int = 2, approvals: Mapping[str, Approval | str] | None = None,
                 task_approvals: Mapping[str, Approval | str] | None = None,
                 can_replan: bool = False) -> None:
        check_policies(on_dead=on_dead, retry_budget=retry_budget, stale_after=stale_after,
                       stall_after=stall_after, max_reclaims=max_reclaims)
        if max_replans < 0:
            raise UsageError(f"max_replans must be >= 0, got {max_replans}")
        rng = random.Random(seed)  # one stream: retries' and effects' jitter, in turn
        self.book = book = Book(sink)
        self.ready = Readiness(book, critical_path=router.orders_by_critical_path)
        self.leases = Leases(book.tasks, stale_after)
        self.routing = Routing(book, self.ready, self.leases, router)
        self.growth = Growth(book, self.ready, kinds=kinds,
                             spawn_limits=spawn_limits or SpawnLimits(),
                             default_attempts=default_attempts, max_replans=max_replans,
                             can_replan=can_replan)
        self.failing = FailurePolicy(book, self.ready, self.routing, self.growth, retry=retry,
                                     retry_budget=retry_budget, max_reclaims=max_reclaims,
                                     on_dead=on_dead, rng=rng)
        self.approvals = Approvals(book, self.ready, self.failing, approvals=approvals,
                                   task_approvals=task_approvals)
        self.effects = Effects(book, effects, effect_retry, rng)
        book.keep(self.ready, self.routing, self.approvals, self.effects)
        if self.approvals.any:
            self.ready.gate = self.approvals.hold
        self.more_starts: list[Start] = self.routing.more_starts
        """Starts :meth:`finish` decided beyond the one it returned, until
        :meth:`extra_starts` hands them out (read only: the driver asks whether any wait)."""
        self.timing = Timing(book, self.ready, self.leases, self.failing, self.growth,
                             self.approvals, self.effects, deadline=deadline,
                             stall_after=stall_after)

    # What the driver reads.

    @property
    def tasks(self) -> dict[str, Task]:
        """Task id -> its current record (read only)."""
        return self.book.tasks

    @property
    def workers(self) -> dict[str, WorkerState]:
        """Worker name -> its live state."""
        return self.routing.workers

    @property
    def facts(self) -> RunFacts:
        """What the run came to, beyond its records."""
        return self.book.facts

    @property
    def awaiting(self) -> set[str]:
        """Ids of the tasks waiting for a person."""
        return self.approvals.awaiting

    @property
    def unfinished(self) -> int:
        """Tasks not final."""
        return self.book.unfinished

    @property
    def started(self) -> bool:
        """:meth:`start` was called."""
        return self.book.started

    @property
    def stale_after(self) -> float:
        """Lease length, from start (or the last heartbeat)."""
        return self.leases.stale_after

    @property
    def stopping(self) -> bool:
        """Nothing new starts: aborted, out of budget, or past the deadline."""
        return self.book.stopping

    @property
    def done(self) -> bool:
        """Every task final, every effect applied or given up on, every replan answered."""
        return self.timing.done

    # How the driver sets the run up.

    def use_sink(self, sink: Sink) -> None:
        """Hand decided changes to ``sink`` from now on."""
        self.book.sink = sink

    def use_log(self, note: Note | None) -> None:
        """Hand the events of the common changes (a task created, assigned, started,
        completed) to ``note`` as tuples ``(at, task id, event, worker, attempt, detail)``
        instead of to the sink; None: to the sink again. For a driver that only logs those
        changes (nothing to write, nobody listening): ``note`` may be a list's ``append``.
        Every other change still goes to the sink."""
        self.book.note = note

    def spent_before(self, events: Iterable[Any]) -> None:
        """A stored run carries on: what its ledger says it spent of the retry budget and of
        ``max_replans`` (and which deaths were re-planned) counts against this run."""
        self.failing.retries_used = retries_spent(events)
        self.growth.spent_before(events)

    def pause(self, paused: bool) -> None:
        """While paused nothing starts: the driver cannot record what would happen."""
        self.routing.paused = paused

    def add_worker(self, spec: WorkerSpec) -> WorkerState:
        """Register a worker the router may pick (a name once)."""
        return self.routing.add_worker(spec)

    def capable(self, kind: str) -> bool:
        """True when some registered worker does ``kind``."""
        return self.routing.capable(kind)

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
        return self.ready.add(tasks, now, default_attempts=default_attempts, known=known)

    def restore(self, tasks: Sequence[Task]) -> None:
        """Load stored records as they are (resume, or a coordinator's first read)."""
        for task in self.ready.restore(tasks):
            self.approvals.restored(task)

    def recover(self, now: float, reason: str | None = "supervisor restart") -> None:
        """Turn what a dead driver left into a state this one can run.

        With a ``reason``, tasks that were assigned or running are put back without counting
        a reclaim (their driver died, not they: only a lease that expired while a live worker
        held the task counts toward ``max_reclaims``); ``None`` leaves them to their workers.
        Failed tasks get their retry decided again; a death's dependents are cancelled; a
        budget stop stands; a decision written on a waiting record is carried out.
        """
        failing = self.failing
        for task in list(self.tasks.values()):
            if task.status in _IN_FLIGHT and reason is not None:
                failing.reclaim(task, reason)
            elif task.status is _FAILED:
                failing.decide_failed(self.tasks[task.id], now)
            elif task.status is _DEAD:
                failing.after_death(task, now)
            elif task.status is _CANCELLED and task.cause == "budget":
                failing.budget_stop(now)
            elif task.status is _WAITING:
                self.approvals.take_decision(task, now)

    # The run.

    def start(self, now: float) -> None:
        """Begin: queue every ready task."""
        self.ready.start(now)

    def dispatch(self, now: float) -> list[Start]:
        """In process: give every ready task to a worker's queue; return what starts now."""
        if self.approvals.asking:
            self.approvals.ask(now)
        if self.book.stopping:
            return []
        return self.routing.dispatch(now)

    def complete(self, task_id: str, token: int, result: Any, now: float,
                 worker: str | None, spawned: Sequence[SpawnRequest] = ()) -> bool:
        """An attempt returned ``result``; False when it was fenced off.

        ``spawned``: the tasks the attempt asked to add. They are validated first; an
        invalid addition makes the task dead (permanent) with every problem listed, and
        adds nothing. A valid one is handed to the sink right after the completion, so a
        driver writes both together. A task gated before its effect waits for a person.
        """
        book = self.book
        task = book.tasks[task_id]
        if task.token != token or task.status is not _RUNNING:
            return book.current(task_id, token, worker)  # logs the refusal
        addition = None
        if spawned:
            try:
                addition = self.growth.expansion(task, spawned, now)
            except InvalidPlan as exc:
                return self.failing.fail(task_id, token, spawn_refused(exc), now, worker)
        detail = {"spawned": len(addition.tasks)} if addition is not None else None
        approvals = self.approvals
        if approvals.any and approvals.holds_effect(task, result):
            approvals.wait(task, "effect", now, worker, result=result,
                           attempts=task.attempts + 1, lease=None, error=None,
                           error_class=None)
        else:
            new = completed(task, result, now)
            book.replace(task, new)
            note = book.note
            if note is None:
                book.sink(new, E.COMPLETED, worker, detail, token)
            else:
                note((now, task_id, E.COMPLETED, worker, token, detail))
        if addition is not None:
            self.growth.grow(addition, now)
        book.last_change = now
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
        starts = self.release(worker, self.book.tasks[task_id], now, dispatch=False)
        if len(starts) > 1:
            self.more_starts.extend(starts[1:])
        return starts[0][1] if starts else True

    def extra_starts(self) -> list[Start]:
        """Starts :meth:`finish` decided beyond the one it returned, each handed out once."""
        return self.routing.extra_starts()

    def release(self, worker: WorkerState, task: Task, now: float, *,
                dispatch: bool = True) -> list[Start]:
        """After an attempt ended on ``worker``: what starts now (queued work, freed locks).

        ``dispatch=False``: only what ``worker`` has queued starts; what became ready (a
        dependent, a task a freed lock held back) waits for the driver's next
        :meth:`dispatch`, which gives the ready tasks of several outcomes out at once.
        """
        routing = self.routing
        routing.ended(worker, task, now)
        starts = self.dispatch(now) if dispatch and self.ready.heap else []
        if worker.queue and worker.active < worker.spec.capacity:  # else nothing to start
            routing.pump(worker, now, starts)
        return starts

    def fail(self, task_id: str, token: int, failure: Failure, now: float,
             worker: str | None) -> bool:
        """An attempt raised; decide retry, death or budget stop. False when fenced off."""
        return self.failing.fail(task_id, token, failure, now, worker)

    def heartbeat(self, task_id: str, token: int, now: float) -> None:
        """The attempt ``token`` of ``task_id`` is alive: extend its lease."""
        self.leases.heartbeat(task_id, token, now)

    def budget_exhausted(self, now: float) -> None:
        """The run's budget is spent: nothing more starts, what has not started is cancelled."""
        self.failing.budget_stop(now)

    # A person's decisions.

    def approve(self, task_id: str, now: float, note: str | None = None,
                by: str | None = None) -> Task:
        """A person approved ``task_id``: it starts, or it completes and its effect is due.

        Raises:
            UsageError: the task is unknown or not waiting (approving twice included).
        """
        return self.approvals.approve(task_id, now, note, by)

    def reject(self, task_id: str, now: float, reason: str, by: str | None = None) -> Task:
        """A person rejected ``task_id``: it is ``dead`` with cause ``rejected``; its
        dependents follow ``on_dead``.

        Raises:
            UsageError: the task is unknown or not waiting, or ``reason`` is empty.
        """
        return self.approvals.reject(task_id, now, reason, by)

    def take_decision(self, record: Task, now: float) -> bool:
        """Carry out a decision another process wrote on a waiting record (True: one was)."""
        return self.approvals.take_decision(record, now)

    # What the driver carries out besides attempts.

    def effects_due(self, now: float) -> list[Task]:
        """Completed tasks whose effect is due now (each handed out once until it reports)."""
        return self.effects.take_due(now)

    def effect_applied(self, task_id: str, now: float) -> None:
        """The effect of ``task_id`` is applied and recorded."""
        self.effects.applied_now(task_id, now)

    def effect_failed(self, task_id: str, error: str, now: float,
                      transient: bool = True) -> float | None:
        """Applying the effect failed: when to try again (None: given up, recorded)."""
        return self.effects.failed(task_id, error, now, transient)

    def effect_known(self, task_id: str) -> None:
        """The effect of ``task_id`` was applied by an earlier process."""
        self.effects.applied.add(task_id)

    def replans_due(self) -> list[ReplanRequest]:
        """Replans the driver should ask its replanner for now (each handed out once)."""
        return self.growth.replans_due()

    def replan_done(self, request: ReplanRequest, fragment: Sequence[SpawnRequest] | None,
                    error: str | None, now: float) -> bool:
        """The replanner answered ``fragment`` (or failed with ``error``).

        The fragment is validated as an addition spawned by the dead task (the plan's
        checks and the spawn limits); valid, it joins the run with a ``replanned`` event
        on the dead task; otherwise ``replan_failed`` is recorded with the problems and the
        dependents stay cancelled. Returns whether the fragment was added.
        """
        return self.growth.replan_done(request, fragment, error, now)

    def has_due(self, now: float) -> bool:
        """Effects due at ``now`` or replans to ask for (:meth:`effects_due`,
        :meth:`replans_due`)."""
        if not self.growth.due and not self.effects.due:
            return False  # the common case, asked after every outcome
        return bool(self.growth.due) or self.effects.has_due(now)

    # Time.

    def set_deadline(self, at: float | None) -> None:
        """Past ``at`` nothing new starts (see :meth:`tick`); ``None``: no deadline."""
        self.timing.deadline = at

    def tick(self, now: float) -> None:
        """Everything due by ``now``: the deadline, expired leases, retries whose time came,
        approval timeouts."""
        self.timing.tick(now)

    def next_wakeup(self, now: float) -> float:
        """The next time something is due (see :meth:`Timing.next_wakeup`)."""
        return self.timing.next_wakeup(now)

    def wakes_before(self, at: float, now: float) -> bool:
        """True when the driver should look again before ``at``: the run is done or
        stopping, or something falls due before then (see :meth:`next_wakeup`)."""
        return self.timing.done or self.book.stopping or self.timing.next_wakeup(now) < at

    def stalled(self, now: float) -> bool:
        """No change for ``stall_after`` seconds, with work left and nothing scheduled."""
        return self.timing.stalled(now)

    def stall_message(self, run_id: str, now: float) -> str:
        """Why :meth:`stalled` is true, naming a few stuck tasks."""
        return self.timing.stall_message(run_id, now)

    def batch_due(self, now: float, waiting: int, slots: int, margin_s: float) -> bool:
        """Whether ``waiting`` calls in Batch API jobs must go live now (see
        :meth:`Timing.batch_due`)."""
        return self.timing.batch_due(now, waiting, slots, margin_s)

    # Tiers.

    def use_tiers(self, policy: TierPolicy | None) -> None:
        """The run's tiers, their learned latencies and its live slots, from now on."""
        self.timing.tiers = policy

    @property
    def chooses_tiers(self) -> bool:
        """True when :meth:`tier_for` may choose a tier (else None for every task)."""
        return self.timing.chooses_tiers

    def tier_for(self, task_id: str, now: float) -> TierChoice | None:
        """The tier the calls of ``task_id``'s attempt starting at ``now`` go at (see
        :meth:`Timing.tier_for`; the answers' latencies go to :meth:`Timing.answered`)."""
        return self.timing.tier_for(task_id, now)
