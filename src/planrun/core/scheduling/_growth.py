"""Growth: tasks a completion spawned, and replans of a death.

:class:`Growth` owns what the run may grow by (the registry additions are validated against,
the spawn limits, ``max_attempts`` of an added task), and the replans: how many were spent of
``max_replans``, which deaths were re-planned (each once), the replans the driver should ask
for, and those it has not answered yet. An addition, spawned or re-planned, is checked by
:func:`~planrun.core.scheduling._spawn.expand` and joins the run's graph
(:class:`~planrun.core.scheduling._ready.Readiness`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any

from planrun.core._errors import InvalidPlan
from planrun.core._ledger import EventName as E
from planrun.core._registry import SpawnRequest
from planrun.core._task import FINAL, Task
from planrun.core.scheduling._book import Book
from planrun.core.scheduling._common import (
    _CANCELLED,
    _COMPLETED,
    Fragment,
    ReplanRequest,
    _problem,
    replans_spent,
    spawn_refused,
)
from planrun.core.scheduling._ready import Readiness
from planrun.core.scheduling._spawn import Addition, SpawnLimits, expand

__all__ = ["Growth"]


class Growth:
    """What one run may grow by while it runs, and its replans."""

    def __init__(self, book: Book, ready: Readiness, *, kinds: Any,
                 spawn_limits: SpawnLimits, default_attempts: int | None, max_replans: int,
                 can_replan: bool) -> None:
        self.book = book
        self.tasks = book.tasks
        self.ready = ready
        self.kinds = kinds
        self.spawn_limits = spawn_limits
        self.default_attempts = default_attempts
        self.max_replans = max_replans
        self.can_replan = can_replan
        """The driver has a replanner to ask."""
        self.replans_used = 0
        self.replanned: set[str] = set()
        """Dead tasks a replan was asked for (once each)."""
        self.due: list[ReplanRequest] = []
        """Replans waiting to be handed out by :meth:`replans_due` (read only)."""
        self.open: set[str] = set()
        """Dead tasks whose replan was asked for and not answered yet."""

    def spent_before(self, events: Iterable[Any]) -> None:
        """What a stored run's ledger says it spent of ``max_replans``, and on which deaths."""
        self.replans_used, self.replanned = replans_spent(events)

    def expansion(self, spawner: Task, spawned: Sequence[SpawnRequest], now: float) -> Addition:
        """What ``spawned`` adds to this run (see :func:`planrun.core.scheduling.expand`).

        Raises:
            InvalidPlan: the addition's problems.
        """
        if self.kinds is None:
            raise InvalidPlan([_problem("unknown_kind", None,
                                        "this run has no registry to validate additions")])
        return expand(spawner, spawned, self.tasks, self.kinds, self.spawn_limits, now,
                      default_attempts=self.default_attempts)

    def grow(self, addition: Addition, now: float) -> None:
        """Add what a completion spawned: joiners wait longer, the new tasks join the run."""
        sink, ready = self.book.sink, self.ready
        for joiner in addition.joiners:
            old = self.tasks.get(joiner.id)
            if old is None or old.status in FINAL:
                continue
            new = old.evolve(depends_on=joiner.depends_on)
            ready.rewire(old, new)
            sink(new, E.JOINED, None, {"depends_on": len(new.depends_on)}, new.token)
        for task in addition.tasks:
            ready.insert(task)
            sink(task, E.CREATED, None, {"parent": task.parent}, task.token)
        ready.prioritise(list(addition.tasks))
        if self.book.started:
            for task in addition.tasks:
                ready.offer(task.id)

    def ask_replan(self, dead: Task, downstream: Collection[str]) -> None:
        """Queue a replan of ``dead`` unless the run cannot (no replanner, bound reached,
        asked before, stopping): then the dependents stay cancelled."""
        if (not self.can_replan or dead.id in self.replanned or self.book.stopping
                or self.replans_used >= self.max_replans):
            return
        self.replanned.add(dead.id)
        self.replans_used += 1
        tasks = self.tasks
        cancelled = tuple(tasks[d] for d in sorted(downstream, key=self.ready.order.__getitem__)
                          if tasks[d].status is _CANCELLED and tasks[d].cause == dead.id)
        results = {t.id: t.result for t in tasks.values() if t.status is _COMPLETED}
        self.due.append(ReplanRequest(dead, cancelled, results, self.replans_used))
        self.open.add(dead.id)

    def replans_due(self) -> list[ReplanRequest]:
        """Replans the driver should ask its replanner for now (each handed out once)."""
        due = self.due[:]
        self.due.clear()
        return due

    def replan_done(self, request: ReplanRequest, fragment: Sequence[SpawnRequest] | None,
                    error: str | None, now: float) -> bool:
        """See :meth:`planrun.core.scheduling.Scheduler.replan_done`."""
        book = self.book
        dead = self.tasks[request.dead.id]
        self.open.discard(dead.id)
        book.touch(now)
        if error is None and fragment is not None and not book.stopping:
            try:
                addition = self.expansion(dead, fragment, now)
            except InvalidPlan as exc:
                error = spawn_refused(exc).error
            else:
                book.sink(dead, E.REPLANNED, None,
                          {"cause": dead.error, "replan": request.number,
                           "tasks": [t.id for t in addition.tasks],
                           "replaces": [t.id for t in request.cancelled]}, dead.token)
                self.grow(addition, now)
                if isinstance(fragment, Fragment):  # the repairs of the plan it was read from
                    self.ready.repaired(addition.tasks, fragment.repairs)
                return True
        book.sink(dead, E.REPLAN_FAILED, None,
                  {"cause": dead.error, "replan": request.number,
                   "error": error or "stopping"}, dead.token)
        return False
