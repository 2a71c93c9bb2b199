"""The scheduling core's shared ground: the state of a run and the one place a change
updates it (:class:`_State`), and the types and rules every part of
:class:`~planrun.core.scheduling.Scheduler` uses."""

from __future__ import annotations

import graphlib
import heapq
import itertools
import random
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from planrun.core._errors import ErrorClass, InvalidPlan, UsageError
from planrun.core._ledger import EventName as E
from planrun.core._routing import Balanced, Capability, LeastLoaded, Router, WorkerState
from planrun.core._task import (
    FINAL,
    Status,
    Task,
    advanced,
)
from planrun.core.scheduling._approval import (
    Approval,
    as_approval,
)
from planrun.core.scheduling._outcome import Failure
from planrun.core.scheduling._retry import RetryPolicy
from planrun.core.scheduling._spawn import SpawnLimits

if TYPE_CHECKING:
    from planrun.core._registry import SpawnRequest
    from planrun.core.scheduling._spawn import Addition

__all__ = ["EFFECT_RETRY", "OnDead", "ReplanRequest", "RunFacts", "Sink", "check_policies",
           "dependency_order", "replans_spent", "retries_spent", "spawn_refused"]

OnDead = Literal["cancel_dependents", "abort_run", "replan"]
ON_DEAD: tuple[str, ...] = ("cancel_dependents", "abort_run", "replan")


@dataclass(frozen=True)
class ReplanRequest:
    """A death to re-plan: the dead task, the dependents its death cancelled, and the
    results of the tasks completed so far (by id). The replacement fragment takes the dead
    task's place: its first tasks may depend on what the dead task depended on."""

    dead: Task
    cancelled: tuple[Task, ...]
    results: Mapping[str, Any]
    number: int
    """1 for the run's first replan."""

Entry = tuple[Any, ...]
"""An entry of the ready heap: sort keys, then the task id (see ``Scheduler._entry``)."""

Note = Callable[[tuple[float, str, str, "str | None", int, "Mapping[str, Any] | None"]], Any]
"""``note((at, task id, event, worker, attempt, detail))``: a change's event alone (see
:meth:`Scheduler.use_log`)."""

Sink = Callable[[Task, str, "str | None", "Mapping[str, Any] | None", int], None]
"""``sink(record, event, worker, detail, token)``: one decided change and its ledger event;
``token`` is the fencing token the change was decided under (the record's before it)."""

# The statuses as module constants: an attribute of an Enum class is looked up through
# EnumType.__getattr__ (some 1,000 instructions each); a module constant costs a global.
_PENDING = Status.PENDING
_ASSIGNED = Status.ASSIGNED
_RUNNING = Status.RUNNING
_COMPLETED = Status.COMPLETED
_FAILED = Status.FAILED
_DEAD = Status.DEAD
_CANCELLED = Status.CANCELLED
_WAITING = Status.WAITING

_IN_FLIGHT = frozenset({_ASSIGNED, _RUNNING})
_STATELESS = frozenset({LeastLoaded, Capability, Balanced})
"""Built-in routers whose pick among one candidate is that candidate, with no state kept."""
_INDEXED = _IN_FLIGHT | {_COMPLETED, _WAITING}
"""The statuses :meth:`Scheduler._index` has something to do for."""
_UNINDEXED = _IN_FLIGHT | {_WAITING}
"""The statuses :meth:`Scheduler._unindex` has something to undo for."""
_CANCELLABLE = frozenset({_PENDING, _ASSIGNED, _FAILED, _WAITING})

_ZEROS = itertools.repeat(0.0)
"""The default of every path length a critical path looks up (see _prioritise)."""

_DEFAULT_ATTEMPTS: int = Task.__dataclass_fields__["max_attempts"].default  # type: ignore[assignment]
"""``Task.max_attempts`` when it was not given."""

EFFECT_RETRY = RetryPolicy(attempts=6, base=1.0, cap=30.0, jitter=0.25, max_retry_after=60.0)
"""How a failing effect is tried again: 6 tries, 1 s doubling to 30 s."""


@dataclass
class RunFacts:
    """What the run came to, beyond its task records (for the driver's result)."""

    aborted_by: str | None = None
    budget_exhausted: bool = False
    deadline_reached: bool = False
    effects_failed: dict[str, str] = field(default_factory=dict)
    """Task id -> last error of an effect that was given up on."""
    batches_taken_back: bool = False
    """The deadline made the run's batched model calls go live (for the rest of the run)."""


def dependency_order(batch: Sequence[Task]) -> list[Task]:
    """``batch`` reordered so that dependencies come first (stable; ties keep input order).

    Raises:
        InvalidPlan: the batch has a dependency cycle.
        UsageError: duplicate ids in the batch.
    """
    return _dependency_order(batch)[0]


def _dependency_order(batch: Sequence[Task]) -> tuple[list[Task], dict[str, int]]:
    """:func:`dependency_order`, and each id's position in ``batch``."""
    position = {t.id: i for i, t in enumerate(batch)}
    if len(position) != len(batch):
        raise UsageError("duplicate task ids in one batch")
    get = position.get
    if all(get(d, -1) < i for i, t in enumerate(batch) if t.depends_on for d in t.depends_on):
        # Nothing waits for a later task of the batch: the order given is already the
        # smallest dependency order (and has no cycle), so there is nothing to sort.
        return list(batch), position
    by_id = {t.id: t for t in batch}
    sorter: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter()
    for t in batch:
        sorter.add(t.id, *(d for d in t.depends_on if d in by_id))
    try:
        sorter.prepare()
    except graphlib.CycleError as exc:
        from planrun.core._plan import Problem

        cycle = list(exc.args[1]) if len(exc.args) > 1 else []
        raise InvalidPlan(
            [Problem("cycle", None, f"tasks form a dependency cycle: {' -> '.join(cycle)}")]
        ) from exc
    from planrun.core._plan import smallest_order

    return [by_id[i] for i in smallest_order(sorter, position.__getitem__)], position


def replans_spent(events: Iterable[Any]) -> tuple[int, set[str]]:
    """Replans of the run's ``max_replans`` spent by a stored run, and the dead tasks they
    were for (each asked once)."""
    asked = [e.task for e in events if e.event in (E.REPLANNED, E.REPLAN_FAILED)]
    return len(asked), set(asked)


def retries_spent(events: Iterable[Any]) -> int:
    """Retries of the run's budget spent by a stored run: one per ``retry`` event."""
    return sum(1 for e in events if e.event == E.RETRY)




def _with_joins(task: Task) -> Task:
    """A task that joins X waits for X itself too."""
    missing = tuple(j for j in task.joins if j not in task.depends_on)
    return task.evolve(depends_on=task.depends_on + missing) if missing else task


def spawn_refused(exc: InvalidPlan) -> Failure:
    """A refused addition as the permanent failure of the task that asked for it."""
    listed = "; ".join(str(p) for p in exc.problems)
    return Failure(f"InvalidPlan: spawn refused: {listed}", ErrorClass.PERMANENT)


def _problem(code: str, task: int | None, message: str) -> Any:
    from planrun.core._plan import Problem

    return Problem(code, task, message)


def check_policies(*, on_dead: str = "cancel_dependents", retry_budget: int | None = None,
                   timeout: float | None = None, stale_after: float = 1.0,
                   stall_after: float = 1.0, max_reclaims: int = 0,
                   max_attempts: int = 1, deadline_s: float | None = None) -> None:
    """Refuse settings no run can honour, with one clear message each."""
    if deadline_s is not None and not deadline_s > 0:
        raise UsageError(f"deadline_s must be > 0 or None, got {deadline_s}")
    if on_dead not in ON_DEAD:
        raise UsageError(f"on_dead must be 'cancel_dependents', 'abort_run' or 'replan', "
                         f"not {on_dead!r}")
    if max_attempts < 1:
        raise UsageError("max_attempts must be >= 1")
    if not (stale_after > 0 and stall_after > 0):
        raise UsageError("stale_after and stall_after must be > 0")
    if max_reclaims < 0:
        raise UsageError(f"max_reclaims must be >= 0, got {max_reclaims}")
    if retry_budget is not None and retry_budget < 0:
        raise UsageError(f"retry_budget must be >= 0 or None, got {retry_budget}")
    if timeout is not None and not timeout > 0:
        raise UsageError(f"timeout must be > 0 or None, got {timeout}")


class _State:
    """The state of one run, and the one place a change of a record updates it
    (:meth:`_replace`). The parts of :class:`Scheduler` build on it, one concern each."""

    if TYPE_CHECKING:  # what the parts above this one define, and this one calls

        def _offer(self, tid: str) -> None: ...

        @property
        def effects_pending(self) -> bool: ...

        def _needs_start_approval(self, task: Task) -> bool: ...

        def _ask(self, now: float) -> None: ...

        def expansion(self, spawner: Task, spawned: Sequence[SpawnRequest],
                      now: float) -> Addition: ...

        def fail(self, task_id: str, token: int, failure: Failure, now: float,
                 worker: str | None) -> bool: ...

        def approval_for(self, task: Task) -> Approval | None: ...

        def _wait(self, task: Task, stage: str, now: float, worker: str | None,
                  **changes: Any) -> Task: ...

        def grow(self, addition: Addition, now: float) -> None: ...

        def _after_death(self, task: Task, now: float) -> None: ...

        def _budget_stop(self, now: float) -> None: ...

        def take_decision(self, record: Task, now: float) -> bool: ...

        def _rewire(self, old: Task, new: Task) -> None: ...


    def __init__(
        self,
        *,
        router: Router,
        retry: RetryPolicy,
        sink: Sink,
        retry_budget: int | None = None,
        max_reclaims: int = 3,
        on_dead: OnDead = "cancel_dependents",
        stale_after: float = 90.0,
        stall_after: float = 900.0,
        effects: Collection[str] = (),
        seed: int | None = None,
        deadline: float | None = None,
        effect_retry: RetryPolicy = EFFECT_RETRY,
        kinds: Any = None,
        spawn_limits: SpawnLimits | None = None,
        default_attempts: int | None = None,
        max_replans: int = 2,
        approvals: Mapping[str, Approval | str] | None = None,
        task_approvals: Mapping[str, Approval | str] | None = None,
        can_replan: bool = False,
    ) -> None:
        check_policies(on_dead=on_dead, retry_budget=retry_budget, stale_after=stale_after,
                       stall_after=stall_after, max_reclaims=max_reclaims)
        if max_replans < 0:
            raise UsageError(f"max_replans must be >= 0, got {max_replans}")
        self.router = router
        self.retry = retry
        self.retry_budget = retry_budget
        self.max_reclaims = max_reclaims
        self.on_dead: OnDead = on_dead
        self.stale_after = stale_after
        self.stall_after = stall_after
        self.effect_kinds = frozenset(effects)
        self.deadline = deadline
        self.effect_retry = effect_retry
        self.approvals = {k: as_approval(v) for k, v in (approvals or {}).items()}
        self.task_approvals = {k: as_approval(v) for k, v in (task_approvals or {}).items()}
        self.kinds = kinds
        self.spawn_limits = spawn_limits or SpawnLimits()
        self.default_attempts = default_attempts
        self.max_replans = max_replans
        self.can_replan = can_replan
        """The driver has a replanner to ask."""
        self._sink = sink
        self._note: Note | None = None
        """Where the common changes' events go as tuples, when a driver asks (:meth:`use_log`)."""
        self._rng = random.Random(seed)
        self._new_indexes()

    def _new_indexes(self) -> None:
        """The run's records and what is kept current from them, empty."""
        self.awaiting: set[str] = set()
        """Ids of the tasks in status ``waiting`` (waiting for a person)."""
        self._asking: list[str] = []
        self._approval_timeouts: list[tuple[float, str]] = []
        self.facts = RunFacts()
        self.replans_used = 0
        self.replanned: set[str] = set()
        """Dead tasks a replan was asked for (once each)."""
        self._replans_due: list[ReplanRequest] = []
        self._replans_open: set[str] = set()
        self.tasks: dict[str, Task] = {}
        self._order: dict[str, int] = {}
        self._dependents: dict[str, list[str]] = {}
        """Task id -> the ids that depend on it (no entry when none does)."""
        self._waiting: dict[str, int] = {}
        self._entry: dict[str, Entry] = {}
        """Task id -> its entry in the ready heap: ``(order, id)``, or under a critical-path
        router ``(-longest path to the end, order, id)`` (flat: cheaper to compare)."""
        self._ready: list[Entry] = []
        self._queued: set[str] = set()
        self._delayed: list[tuple[float, str, int]] = []
        self._decided: set[str] = set()
        self._leases: list[tuple[float, str, int]] = []
        self._locks: dict[str, str] = {}
        self._parked: dict[str, list[str]] = {}
        self._avoid: dict[str, str] = {}
        self.workers: dict[str, WorkerState] = {}
        self._capable: dict[str, list[WorkerState]] = {}
        """Kind -> the workers that do it, in registration order (cleared when they change)."""
        self._effects_due: list[tuple[float, str]] = []
        self._effect_tries: dict[str, int] = {}
        self._effects_open: set[str] = set()
        self.effects_applied: set[str] = set()
        self.unfinished = 0
        self.retries_used = 0
        self.last_change = 0.0
        self.started = False
        self.paused = False
        """While true nothing starts (the driver cannot record what would happen)."""
        self._held_back = False  # a worker's queue waited for the pause to end
        self.more_starts: list[tuple[WorkerState, Task]] = []
        """Starts :meth:`finish` decided beyond the one it returned, until
        :meth:`extra_starts` hands them out (read only: the driver asks whether any wait)."""

    def spent_before(self, events: Iterable[Any]) -> None:
        """A stored run carries on: what its ledger says it spent of the retry budget and of
        ``max_replans`` (and which deaths were re-planned) counts against this run."""
        self.retries_used = retries_spent(events)
        self.replans_used, self.replanned = replans_spent(events)

    def set_deadline(self, at: float | None) -> None:
        """Past ``at`` nothing new starts (see :meth:`tick`); ``None``: no deadline."""
        self.deadline = at

    def pause(self, paused: bool) -> None:
        """While paused nothing starts: the driver cannot record what would happen."""
        self.paused = paused

    @property
    def stopping(self) -> bool:
        """Nothing new starts: aborted, out of budget, or past the deadline."""
        f = self.facts
        return f.aborted_by is not None or f.budget_exhausted or f.deadline_reached

    def use_sink(self, sink: Sink) -> None:
        """Hand decided changes to ``sink`` from now on (a driver that stopped needing
        what its first sink did)."""
        self._sink = sink

    def use_log(self, note: Note | None) -> None:
        """Hand the events of the common changes (a task created, assigned, started,
        completed) to ``note`` as tuples ``(at, task id, event, worker, attempt, detail)``
        instead of to the sink; None: to the sink again. For a driver that only logs those
        changes (nothing to write, nobody listening): ``note`` may be a list's ``append``.
        Every other change still goes to the sink."""
        self._note = note

    def touch(self, now: float) -> None:
        """Something changed at ``now`` (the stall clock starts again)."""
        self.last_change = now

    def _change(self, task: Task, to: Status, event: str, worker: str | None,
                detail: Mapping[str, Any] | None = None, **changes: Any) -> Task:
        new = advanced(task, to, changes)
        self._replace(task, new)
        self._sink(new, event, worker, detail, task.token)
        return new

    def _replace(self, old: Task, new: Task) -> None:
        """Put ``new`` in place of ``old`` and keep every index right."""
        tid = new.id
        self.tasks[tid] = new
        was, now_is = old.status, new.status
        if (was is _ASSIGNED and now_is is _RUNNING and not old.resources
                and not new.resources and old.assigned_to == new.assigned_to
                and old.kind == new.kind and old.estimate_s == new.estimate_s):
            # A start on the worker it was assigned to: its load stays, one more is active
            # (what _unindex then _index would do, without taking the load off and back).
            worker = self.workers.get(new.assigned_to or "")
            if worker is not None:
                worker.active += 1
            return
        if was in _UNINDEXED:
            self._unindex(old)
        if now_is in _INDEXED and (now_is is not _COMPLETED or self.effect_kinds):
            self._index(new)
        if was not in FINAL:
            if now_is in FINAL:
                self.unfinished -= 1
        elif now_is not in FINAL:
            self.unfinished += 1  # a mirror that ran ahead of the store, corrected
        if now_is is _COMPLETED and was is not _COMPLETED and tid in self._dependents:
            self._released(tid)

    def _released(self, tid: str) -> None:
        """``tid`` completed: each dependent waits for one dependency less."""
        dependents = self._dependents.get(tid)
        if dependents:
            waiting = self._waiting
            for dep in dependents:
                left = waiting[dep] - 1
                waiting[dep] = left
                if not left and self.started:
                    self._offer(dep)

    def _index(self, task: Task) -> None:
        status = task.status
        if status is _WAITING:
            self.awaiting.add(task.id)
        elif status in _IN_FLIGHT:
            for r in task.resources:
                self._locks[r] = task.id
            worker = self.workers.get(task.assigned_to or "")
            if worker is not None:
                worker.load_s += worker.cost(task)
                if status is _RUNNING:
                    worker.active += 1
        elif status is _COMPLETED and task.kind in self.effect_kinds \
                and task.id not in self.effects_applied:
            heapq.heappush(self._effects_due, (task.finished_at or 0.0, task.id))

    def _unindex(self, task: Task) -> None:
        status = task.status
        if status is _WAITING:
            self.awaiting.discard(task.id)
        if status not in _IN_FLIGHT:
            return
        worker = self.workers.get(task.assigned_to or "")
        if worker is not None:
            load = worker.load_s - worker.cost(task)
            worker.load_s = load if load > 0.0 else 0.0
            if status is _RUNNING:
                worker.active -= 1
        if not task.resources:
            return
        freed: list[str] = []
        for r in task.resources:
            if self._locks.get(r) == task.id:
                del self._locks[r]
                freed.append(r)
        for r in freed:
            for tid in self._parked.pop(r, ()):
                self._offer(tid)
