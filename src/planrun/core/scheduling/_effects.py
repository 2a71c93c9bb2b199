"""Effects: what a completion of an effect kind does once, outside the run.

:class:`Effects` owns the kinds that have an effect, the effects due (by time), those handed
out and not reported yet, the tries of each, those applied, and the retry policy of a failing
effect (given up after its attempts, recorded in the run's facts).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Collection

from planrun.core._task import Task
from planrun.core.scheduling._book import Book
from planrun.core.scheduling._retry import RetryPolicy

__all__ = ["Effects"]


class Effects:
    """The effects of one run: due, being applied, applied, given up."""

    def __init__(self, book: Book, kinds: Collection[str], retry: RetryPolicy,
                 rng: random.Random) -> None:
        self.book = book
        self.kinds = frozenset(kinds)
        self.retry = retry
        self._rng = rng
        self.due: list[tuple[float, str]] = []
        """``(time, id)``: effects to apply from that time on."""
        self._open: set[str] = set()
        self._tries: dict[str, int] = {}
        self.applied: set[str] = set()

    def completed(self, task: Task) -> None:
        """``task`` completed: its effect is due, if its kind has one not applied yet."""
        if task.kind in self.kinds and task.id not in self.applied:
            heapq.heappush(self.due, (task.finished_at or 0.0, task.id))

    @property
    def pending(self) -> bool:
        """Effects due or being applied."""
        return bool(self.due or self._open)

    def has_due(self, now: float) -> bool:
        """An effect is due at ``now``."""
        due = self.due
        return bool(due) and due[0][0] <= now

    def take_due(self, now: float) -> list[Task]:
        """Completed tasks whose effect is due now (each handed out once until it reports)."""
        due: list[Task] = []
        tasks = self.book.tasks
        while self.due and self.due[0][0] <= now:
            _, tid = heapq.heappop(self.due)
            if tid in self.applied or tid in self._open:
                continue
            self._open.add(tid)
            due.append(tasks[tid])
        return due

    def applied_now(self, task_id: str, now: float) -> None:
        """The effect of ``task_id`` is applied and recorded."""
        self._open.discard(task_id)
        self.applied.add(task_id)
        self.book.facts.effects_failed.pop(task_id, None)
        self.book.touch(now)

    def failed(self, task_id: str, error: str, now: float, transient: bool = True) -> float | None:
        """Applying the effect failed: when to try again (None: given up, recorded)."""
        self._open.discard(task_id)
        tries = self._tries.get(task_id, 0) + 1
        self._tries[task_id] = tries
        self.book.touch(now)
        if not transient or tries >= self.retry.attempts:
            self.book.facts.effects_failed[task_id] = error
            return None
        at = now + self.retry.backoff(tries, self._rng)
        heapq.heappush(self.due, (at, task_id))
        return at
