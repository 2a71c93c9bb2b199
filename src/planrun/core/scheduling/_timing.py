"""Time: what falls due when, the stall, and the end of a run.

:class:`Timing` owns the run's deadline and its stall time. It reads the parts' times (lease
ends, retry times, effects due, approval timeouts) to say when the driver should look again,
hands what fell due to the part whose rule it is (:meth:`Timing.tick`), and says when the run
is stalled, finished, or too close to its deadline to keep calls in Batch API jobs.
"""

from __future__ import annotations

from planrun.core._task import FINAL
from planrun.core.scheduling._batching import batch_take_back, live_rounds
from planrun.core.scheduling._book import Book
from planrun.core.scheduling._common import _FAILED, _PENDING, _WAITING
from planrun.core.scheduling._effects import Effects
from planrun.core.scheduling._failing import FailurePolicy
from planrun.core.scheduling._gates import Approvals
from planrun.core.scheduling._growth import Growth
from planrun.core.scheduling._leases import Leases
from planrun.core.scheduling._ready import Readiness

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

    def batch_due(self, now: float, waiting: int, slots: int, live_s: float,
                  margin_s: float) -> bool:
        """Whether ``waiting`` calls in Batch API jobs must go live now for the rest of the
        run to finish live by the deadline, ``slots`` calls at once (see
        :func:`batch_take_back` and :func:`live_rounds`). Once it says so, it says so for
        the rest of the run (the calls that follow go live too, rather than into batches
        that would be taken back in turn); past the deadline, at once."""
        facts = self.book.facts
        if self.deadline is None or waiting <= 0:
            return False
        if facts.deadline_reached or facts.batches_taken_back:
            return True
        unfinished = {t.id for t in self.book.tasks.values() if t.status not in FINAL}
        rounds = live_rounds(unfinished, self.ready.dependents, slots)
        facts.batches_taken_back = batch_take_back(
            now=now, deadline=self.deadline, waiting=waiting, rounds=rounds, live_s=live_s,
            margin_s=margin_s)
        return facts.batches_taken_back

