"""The scheduling core: every decision of a run, over plain data and a time given to it.

:class:`Scheduler` holds the state of one run (the records, who depends on whom, how many
dependencies each task still waits for, the ready heap ordered by critical path, resource
holders, leases, retry times, retries spent, effects due) and decides everything: what
becomes ready, which worker gets it, what a failure means (retry at a time, dead, budget
stop), what a death cancels, what an expired lease means, which effects are due, when the
run has passed its deadline, is stalled or is finished.

It does no I/O and reads no clock: every call passes ``now``. Each change it decides is a
new task record made by :func:`planrun.core._task.transition`, handed to the ``sink`` with its
ledger event; a driver persists the change (a batch for the store) and carries it out
(start an attempt, apply an effect). The driver feeds it the outcomes it saw
(:meth:`Scheduler.complete`, :meth:`Scheduler.fail`, :meth:`Scheduler.heartbeat`), whether
the attempt ran in its process or in a worker process on DBOS, which reports a failure as
it classified it and decides nothing.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from planrun.core._ledger import Event
from planrun.core._ledger import EventName as E
from planrun.core._task import (
    FINAL,
    Task,
)
from planrun.core.scheduling._base import (
    _FAILED,
    _PENDING,
    _RUNNING,
    _WAITING,
    EFFECT_RETRY,
    OnDead,
    ReplanRequest,
    RunFacts,
    Sink,
    check_policies,
    dependency_order,
    replans_spent,
    retries_spent,
    spawn_refused,
)
from planrun.core.scheduling._growth import _Growth
from planrun.core.scheduling._tiers import (
    TierChoice,
    TierPolicy,
    batch_take_back,
    depth_below,
    live_rounds,
)

__all__ = ["EFFECT_RETRY", "OnDead", "ReplanRequest", "RunFacts", "Scheduler", "Sink",
           "check_policies", "dependency_order", "replans_spent", "retries_spent",
           "spawn_refused"]


class Scheduler(_Growth):
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
        stale_after: lease length, from assignment (push) or start.
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

    def tick(self, now: float) -> None:
        """Everything due by ``now``: the deadline, expired leases, retries whose time came."""
        if self.deadline is not None and now >= self.deadline and not self.facts.deadline_reached:
            self.facts.deadline_reached = True
            self._cancel_all("deadline", now)
            self.touch(now)
        while self._leases and self._leases[0][0] <= now:
            _, tid, token = heapq.heappop(self._leases)
            task = self.tasks[tid]
            if task.token != token or task.status is not _RUNNING:
                continue
            if task.lease is not None and task.lease > now:
                continue  # renewed; a newer heap entry stands for it
            self.expire(task, now)
        while self._delayed and self._delayed[0][0] <= now:
            _, tid, token = heapq.heappop(self._delayed)
            task = self.tasks[tid]
            if task.token != token:
                continue
            if task.status is _FAILED:
                self._decided.discard(tid)
                self._change(task, _PENDING, E.RETRY, None, None, assigned_to=None,
                             not_before=None)
                self._offer(tid)
                self.touch(now)  # a record changed: the stall clock starts again
            elif task.status is _PENDING:
                self._offer(tid)
        while self._approval_timeouts and self._approval_timeouts[0][0] <= now:
            at, tid = heapq.heappop(self._approval_timeouts)
            task = self.tasks[tid]
            if task.status is _WAITING and task.not_before == at:
                self._timed_out(task, now)
        self._ask(now)

    def next_wakeup(self, now: float) -> float:
        """The next time something is due: a lease, a retry, an effect, an approval timeout,
        the deadline, a stall.

        While a retry or an effect waits for its time, or a task waits for a person, the stall
        time is not one of them: it may have passed already, and a time in the past would
        make the driver spin."""
        delayed, effects = self._delayed, self._effects_due
        if delayed or effects or self.awaiting:
            # a run that waits for a known time or a person is no stall (see stalled)
            at = float("inf")
            if delayed:
                at = delayed[0][0]
            if effects and effects[0][0] < at:
                at = effects[0][0]
        else:
            at = self.last_change + self.stall_after
        if self._leases and self._leases[0][0] < at:
            at = self._leases[0][0]
        if self._approval_timeouts and self._approval_timeouts[0][0] < at:
            at = self._approval_timeouts[0][0]
        if self._asking and now < at:
            at = now
        if self.deadline is not None and not self.facts.deadline_reached and self.deadline < at:
            at = self.deadline
        return at

    def wakes_before(self, at: float, now: float) -> bool:
        """True when the driver should look again before ``at``: the run is done or
        stopping, or something falls due before then (see :meth:`next_wakeup`)."""
        return self.done or self.stopping or self.next_wakeup(now) < at

    def has_due(self, now: float) -> bool:
        """Effects due at ``now`` or replans to ask for (:meth:`effects_due`,
        :meth:`replans_due`)."""
        due = self._effects_due
        return bool(self._replans_due) or (bool(due) and due[0][0] <= now)

    def stalled(self, now: float) -> bool:
        """No change for ``stall_after`` seconds, with work left and nothing scheduled.

        A task waiting for a known retry time, or an effect waiting for its next try, is not
        a stall: the run knows when it goes on. Nor is a task waiting for a person's
        approval: while one waits, the run is never called stalled.
        """
        if not self.unfinished and not self.effects_pending and not self._replans_open:
            return False
        if self.awaiting:
            return False
        if self._delayed or self._effects_due or self._replans_open:
            return False
        # the same sum as next_wakeup's: a wakeup at that time sees the stall (no float gap)
        return now >= self.last_change + self.stall_after

    tiers: TierPolicy | None = None
    """The run's tiers and their learned latencies (:meth:`tier_for`, :meth:`batch_due`);
    None: every call at the default tier, the batch rule's latency at its conservative
    figure. A driver gives it with :meth:`use_tiers`."""

    def use_tiers(self, policy: TierPolicy | None) -> None:
        """The run's tiers, their learned latencies and its live slots, from now on."""
        self.tiers = policy

    def tier_for(self, task_id: str, now: float) -> TierChoice | None:
        """The tier the calls of ``task_id``'s attempt starting at ``now`` go at (see
        :func:`~planrun.core.scheduling.choose_tier`); None when the run allows no tier
        beside the default one. Once batches were taken back, no call goes into one."""
        policy = self.tiers
        if policy is None or not policy.active:
            return None
        tasks = self.tasks
        open_ = _Open(tasks)
        exclude = ("batch",) if self.facts.batches_taken_back or self.facts.deadline_reached \
            else ()
        return policy.choose(now=now, deadline=self.deadline, kind=tasks[task_id].kind,
                             unfinished=self.unfinished,
                             depth=depth_below(task_id, open_, self._dependents),
                             exclude=exclude)

    def answered(self, kind: str | None, tier: str, seconds: float) -> None:
        """A model call of ``kind`` was answered at ``tier`` in ``seconds``: the tiers'
        learned latencies take it in (nothing without tiers)."""
        if self.tiers is not None:
            self.tiers.latencies.observe(kind, tier, seconds)

    def answered_before(self, events: Iterable[Event]) -> None:
        """Learn the latencies of a resumed run's earlier answers from its ledger's
        ``usage`` events (after :meth:`restore`, which says each task's kind)."""
        if self.tiers is None:
            return
        for e in events:
            seconds = e.detail.get("latency_s") if e.event == E.USAGE else None
            if seconds is not None:
                task = self.tasks.get(e.task)
                self.answered(task.kind if task else None, str(e.detail.get("tier", "default")),
                              float(seconds))

    def batch_due(self, now: float, waiting: int, slots: int, margin_s: float) -> bool:
        """Whether ``waiting`` calls in Batch API jobs must go live now for the rest of the
        run to finish live by the deadline, ``slots`` calls at once, each taking the
        default tier's learned latency (see :func:`batch_take_back` and
        :func:`live_rounds`). Once it says so, it says so for the rest of the run (the
        calls that follow go live too, rather than into batches that would be taken back
        in turn); past the deadline, at once."""
        facts = self.facts
        if self.deadline is None or waiting <= 0:
            return False
        if facts.deadline_reached or facts.batches_taken_back:
            return True
        unfinished = {t.id for t in self.tasks.values() if t.status not in FINAL}
        rounds = live_rounds(unfinished, self._dependents, slots)
        policy = self.tiers or TierPolicy()
        facts.batches_taken_back = batch_take_back(
            now=now, deadline=self.deadline, waiting=waiting, rounds=rounds,
            live_s=policy.latencies.of("default"), margin_s=margin_s)
        return facts.batches_taken_back

    def stall_message(self, run_id: str, now: float) -> str:
        """Why :meth:`stalled` is true, naming a few stuck tasks."""
        stuck = [t for t in self.tasks.values()
                 if t.status not in FINAL and t.status is not _WAITING]
        sample = ", ".join(f"{t.id} ({t.status.value})" for t in stuck[:5])
        more = f" and {len(stuck) - 5} more" if len(stuck) > 5 else ""
        return (f"run {run_id} stalled: no task changed for {now - self.last_change:.0f} s "
                f"with {len(stuck)} unfinished: {sample}{more}")


class _Open:
    """The unfinished tasks among ``tasks``, as a container (``id in open``)."""

    __slots__ = ("_tasks",)

    def __init__(self, tasks: dict[str, Task]) -> None:
        self._tasks = tasks

    def __contains__(self, tid: object) -> bool:
        task = self._tasks.get(tid) if isinstance(tid, str) else None
        return task is not None and task.status not in FINAL
