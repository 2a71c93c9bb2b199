"""The scheduling core, growth and replanning, deaths and what they cancel."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from planrun.core._errors import InvalidPlan
from planrun.core._ledger import EventName as E
from planrun.core._registry import SpawnRequest
from planrun.core._task import (
    FINAL,
    Task,
)
from planrun.core.scheduling._base import (
    _CANCELLABLE,
    _CANCELLED,
    _COMPLETED,
    ReplanRequest,
    _problem,
    spawn_refused,
)
from planrun.core.scheduling._gates import _Gates
from planrun.core.scheduling._spawn import Addition, expand


class _Growth(_Gates):
    """Growth and replanning, deaths and what they cancel."""

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
        for joiner in addition.joiners:
            old = self.tasks.get(joiner.id)
            if old is None or old.status in FINAL:
                continue
            new = old.evolve(depends_on=joiner.depends_on)
            self._rewire(old, new)
            self._sink(new, E.JOINED, None, {"depends_on": len(new.depends_on)}, new.token)
        for task in addition.tasks:
            self._insert(task)
            self._sink(task, E.CREATED, None, {"parent": task.parent}, task.token)
        self._prioritise(list(addition.tasks))
        if self.started:
            for task in addition.tasks:
                self._offer(task.id)

    def _rewire(self, old: Task, new: Task) -> None:
        """``new`` is ``old`` with more dependencies (a join widened)."""
        tid = new.id
        before = set(old.depends_on)
        for dep in new.depends_on:
            if dep not in before:
                self._dependents.setdefault(dep, []).append(tid)
        self.tasks[tid] = new
        self._waiting[tid] = sum(
            1 for d in new.depends_on
            if (t := self.tasks.get(d)) is None or t.status is not _COMPLETED)
        if self.started:
            self._offer(tid)

    def _after_death(self, task: Task, now: float) -> None:
        if self.on_dead == "abort_run":
            if self.facts.aborted_by is None:
                self.facts.aborted_by = task.id
            self._cancel_all(f"abort: {task.id} died", now)
            return
        stack = list(self._dependents.get(task.id, ()))
        seen: set[str] = set()
        while stack:
            dep_id = stack.pop()
            if dep_id in seen:
                continue
            seen.add(dep_id)
            stack.extend(self._dependents.get(dep_id, ()))
            dep = self.tasks.get(dep_id)
            if dep is not None and dep.status in _CANCELLABLE:
                self._cancel(dep, task.id, now)
        if self.on_dead == "replan":
            self._ask_replan(task, seen)

    def _ask_replan(self, dead: Task, downstream: Collection[str]) -> None:
        """Queue a replan of ``dead`` unless the run cannot (no replanner, bound reached,
        asked before, stopping): then the dependents stay cancelled."""
        if (not self.can_replan or dead.id in self.replanned or self.stopping
                or self.replans_used >= self.max_replans):
            return
        self.replanned.add(dead.id)
        self.replans_used += 1
        cancelled = tuple(self.tasks[d] for d in sorted(downstream, key=self._order.__getitem__)
                          if self.tasks[d].status is _CANCELLED
                          and self.tasks[d].cause == dead.id)
        results = {t.id: t.result for t in self.tasks.values() if t.status is _COMPLETED}
        self._replans_due.append(ReplanRequest(dead, cancelled, results, self.replans_used))
        self._replans_open.add(dead.id)

    def replans_due(self) -> list[ReplanRequest]:
        """Replans the driver should ask its replanner for now (each handed out once)."""
        due, self._replans_due = self._replans_due, []
        return due

    def replan_done(self, request: ReplanRequest, fragment: Sequence[SpawnRequest] | None,
                    error: str | None, now: float) -> bool:
        """The replanner answered ``fragment`` (or failed with ``error``).

        The fragment is validated as an addition spawned by the dead task (the plan's
        checks and the spawn limits); valid, it joins the run with a ``replanned`` event
        on the dead task; otherwise ``replan_failed`` is recorded with the problems and the
        dependents stay cancelled. Returns whether the fragment was added.
        """
        dead = self.tasks[request.dead.id]
        self._replans_open.discard(dead.id)
        self.touch(now)
        if error is None and fragment is not None and not self.stopping:
            try:
                addition = self.expansion(dead, fragment, now)
            except InvalidPlan as exc:
                error = spawn_refused(exc).error
            else:
                self._sink(dead, E.REPLANNED, None,
                           {"cause": dead.error, "replan": request.number,
                            "tasks": [t.id for t in addition.tasks],
                            "replaces": [t.id for t in request.cancelled]}, dead.token)
                self.grow(addition, now)
                return True
        self._sink(dead, E.REPLAN_FAILED, None,
                   {"cause": dead.error, "replan": request.number,
                    "error": error or "stopping"}, dead.token)
        return False

    def _cancel(self, task: Task, cause: str, now: float) -> None:
        self._change(task, _CANCELLED, E.CANCELLED, None, {"cause": cause}, cause=cause,
                     finished_at=now, lease=None)

    def _cancel_all(self, cause: str, now: float) -> None:
        for task in list(self.tasks.values()):
            if task.status in _CANCELLABLE:
                self._cancel(task, cause, now)

    def _budget_stop(self, now: float) -> None:
        if not self.facts.budget_exhausted:
            self.facts.budget_exhausted = True
        self._cancel_all("budget", now)

    def budget_exhausted(self, now: float) -> None:
        """The run's budget is spent: nothing more starts, what has not started is cancelled."""
        self._budget_stop(now)
