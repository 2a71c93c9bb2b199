"""Time: what falls due when, the stall, the end of a run, and the tiers' slack.

:class:`Timing` owns the run's deadline, its stall time and its tier policy (with the
latencies it learned). It reads the parts' times (lease ends, retry times, effects due,
approval timeouts) to say when the driver should look again, hands what fell due to the part
whose rule it is (:meth:`Timing.tick`), says when the run is stalled or finished, which tier
an attempt's calls go at, and when the run is too close to its deadline to keep calls in
Batch API jobs.
"""

from __future__ import annotations

from collections.abc import Iterable

from planrun.core._ledger import Event
from planrun.core._ledger import EventName as E
from planrun.core._task import FINAL, Task
from planrun.core.scheduling._book import Book
from planrun.core.scheduling._common import _FAILED, _PENDING, _WAITING
from planrun.core.scheduling._effects import Effects
from planrun.core.scheduling._failing import FailurePolicy
from planrun.core.scheduling._gates import Approvals
from planrun.core.scheduling._growth import Growth
from planrun.core.scheduling._leases import Leases
from planrun.core.scheduling._ready import Readiness
from planrun.core.scheduling._tiers import (
    TierChoice,
    TierPolicy,
    batch_take_back,
    depth_below,
    live_rounds,
)

__all__ = ["Timing"]


class Timing:
    """What falls due when in one run, its deadline, its stall and its end."""

    def __init__(self, book: Book, ready: Readiness, leases: Leases, failing: FailurePolicy,
                 growth: Growth, approvals: Approvals, effects: Effects, *,
                 deadline: float | None, stall_after: float) -> None:
        self.book = book
        self.ready = ready
        self.leases = leases
        self.failing = failing
        self.growth = growth
        self.approvals = approvals
        self.effects = effects
        self.deadline = deadline
        """Time after which nothing new starts (None: no deadline)."""
        self.stall_after = stall_after
        """Seconds without any change before the run is stalled."""
        self.tiers: TierPolicy | None = None
        """The run's tiers and their learned latencies (:meth:`tier_for`,
        :meth:`batch_due`); None: every call at the default tier, the batch rule's latency
        at its conservative figure."""

    @property
    def done(self) -> bool:
        """Every task final, every effect applied or given up on, every replan answered."""
        return not self.book.unfinished and not self.effects.pending and not self.growth.open

    def tick(self, now: float) -> None:
        """Everything due by ``now``: the deadline, expired leases, retries whose time came,
        approval timeouts."""
        facts = self.book.facts
        if self.deadline is not None and now >= self.deadline and not facts.deadline_reached:
            facts.deadline_reached = True
            self.failing.cancel_all("deadline", now)
            self.book.touch(now)
        for task in self.leases.expired(now):
            self.failing.expire(task, now)
        for task in self.ready.due(now):
            if task.status is _FAILED:
                self.failing.retry_now(task, now)
            elif task.status is _PENDING:
                self.ready.offer(task.id)
        for task in self.approvals.timed_out(now):
            self.approvals.time_out(task, now)
        self.approvals.ask(now)

    def next_wakeup(self, now: float) -> float:
        """The next time something is due: a lease, a retry, an effect, an approval timeout,
        the deadline, a stall.

        While a retry or an effect waits for its time, or a task waits for a person, the stall
        time is not one of them: it may have passed already, and a time in the past would
        make the driver spin."""
        delayed, effects = self.ready.delayed, self.effects.due
        if delayed or effects or self.approvals.awaiting:
            # a run that waits for a known time or a person is no stall (see stalled)
            at = float("inf")
            if delayed:
                at = delayed[0][0]
            if effects and effects[0][0] < at:
                at = effects[0][0]
        else:
            at = self.book.last_change + self.stall_after
        lease = self.leases.next_end()
        if lease is not None and lease < at:
            at = lease
        timeouts = self.approvals.timeouts
        if timeouts and timeouts[0][0] < at:
            at = timeouts[0][0]
        if self.approvals.asking and now < at:
            at = now
        if self.deadline is not None and not self.book.facts.deadline_reached \
                and self.deadline < at:
            at = self.deadline
        return at

    def stalled(self, now: float) -> bool:
        """No change for ``stall_after`` seconds, with work left and nothing scheduled.

        A task waiting for a known retry time, or an effect waiting for its next try, is not
        a stall: the run knows when it goes on. Nor is a task waiting for a person's
        approval: while one waits, the run is never called stalled.
        """
        if self.approvals.awaiting or self.ready.delayed or self.effects.due \
                or self.growth.open:
            return False
        if not self.book.unfinished and not self.effects.pending:
            return False
        # the same sum as next_wakeup's: a wakeup at that time sees the stall (no float gap)
        return now >= self.book.last_change + self.stall_after

    def stall_message(self, run_id: str, now: float) -> str:
        """Why :meth:`stalled` is true, naming a few stuck tasks."""
        stuck = [t for t in self.book.tasks.values()
                 if t.status not in FINAL and t.status is not _WAITING]
        sample = ", ".join(f"{t.id} ({t.status.value})" for t in stuck[:5])
        more = f" and {len(stuck) - 5} more" if len(stuck) > 5 else ""
        return (f"run {run_id} stalled: no task changed for "
                f"{now - self.book.last_change:.0f} s with {len(stuck)} unfinished: "
                f"{sample}{more}")

    @property
    def chooses_tiers(self) -> bool:
        """True when the run allows a tier beside the default one (else :meth:`tier_for`
        answers None for every task)."""
        return self._choosing() is not None

    def _choosing(self) -> TierPolicy | None:
        """The run's tiers when they allow one beside the default one."""
        policy = self.tiers
        return policy if policy is not None and policy.active else None

    def tier_for(self, task_id: str, now: float) -> TierChoice | None:
        """The tier the calls of ``task_id``'s attempt starting at ``now`` go at (see
        :func:`~planrun.core.scheduling.choose_tier`); None when the run allows no tier
        beside the default one. Once batches were taken back, no call goes into one."""
        policy = self._choosing()
        if policy is None:
            return None
        book, facts = self.book, self.book.facts
        exclude = ("batch",) if facts.batches_taken_back or facts.deadline_reached else ()
        return policy.choose(now=now, deadline=self.deadline, kind=book.tasks[task_id].kind,
                             unfinished=book.unfinished,
                             depth=depth_below(task_id, _Open(book.tasks),
                                               self.ready.dependents),
                             exclude=exclude)

    def answered(self, kind: str | None, tier: str, seconds: float) -> None:
        """A model call of ``kind`` was answered at ``tier`` in ``seconds``: the tiers'
        learned latencies take it in (nothing without tiers)."""
        if self.tiers is not None:
            self.tiers.latencies.observe(kind, tier, seconds)

    def resumed_tiers(self, stored: Iterable[str] | None, events: Iterable[Event]) -> None:
        """A resumed run's tiers: those it was started with (``stored``, unless the driver
        gave others), and the latencies of its earlier answers, learned from its ledger's
        ``usage`` events (after the records are restored, which say each task's kind)."""
        if self.tiers is None:
            return
        self.tiers.resume(stored)
        for e in events:
            seconds = e.detail.get("latency_s") if e.event == E.USAGE else None
            if seconds is not None:
                task = self.book.tasks.get(e.task)
                self.answered(task.kind if task else None, str(e.detail.get("tier", "default")),
                              float(seconds))

    def batch_due(self, now: float, waiting: int, slots: int, margin_s: float) -> bool:
        """Whether ``waiting`` calls in Batch API jobs must go live now for the rest of the
        run to finish live by the deadline, ``slots`` calls at once, each taking the
        default tier's learned latency (see :func:`batch_take_back` and
        :func:`live_rounds`). Once it says so, it says so for the rest of the run (the
        calls that follow go live too, rather than into batches that would be taken back
        in turn); past the deadline, at once."""
        facts = self.book.facts
        if self.deadline is None or waiting <= 0:
            return False
        if facts.deadline_reached or facts.batches_taken_back:
            return True
        unfinished = {t.id for t in self.book.tasks.values() if t.status not in FINAL}
        rounds = live_rounds(unfinished, self.ready.dependents, slots)
        policy = self.tiers or TierPolicy()
        facts.batches_taken_back = batch_take_back(
            now=now, deadline=self.deadline, waiting=waiting, rounds=rounds,
            live_s=policy.latencies.of("default"), margin_s=margin_s)
        return facts.batches_taken_back


class _Open:
    """The unfinished tasks among ``tasks``, as a container (``id in open``)."""

    __slots__ = ("_tasks",)

    def __init__(self, tasks: dict[str, Task]) -> None:
        self._tasks = tasks

    def __contains__(self, tid: object) -> bool:
        task = self._tasks.get(tid) if isinstance(tid, str) else None
        return task is not None and task.status not in FINAL
