"""The scheduling core's common terms: the types, status constants and small rules every
part of :class:`~planrun.core.scheduling.Scheduler` uses (no state of its own)."""

from __future__ import annotations

import graphlib
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from planrun.core._errors import ErrorClass, InvalidPlan, UsageError
from planrun.core._ledger import EventName as E
from planrun.core._problem import Repair
from planrun.core._registry import SpawnRequest
from planrun.core._routing import Balanced, Capability, LeastLoaded
from planrun.core._task import (
    Status,
    Task,
)
from planrun.core.scheduling._outcome import Failure
from planrun.core.scheduling._retry import RetryPolicy

if TYPE_CHECKING:
    pass

__all__ = ["EFFECT_RETRY", "Fragment", "OnDead", "ReplanRequest", "RunFacts", "Sink",
           "check_policies",
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


class Fragment(list[SpawnRequest]):
    """A replanner's answer: the tasks that replace a dead task (a list, as any replanner may
    return), and the repairs the plan they were read from went through, in order (each
    recorded as a ``repaired`` event on the fragment's task it fixed, as a plan's are)."""

    def __init__(self, tasks: Iterable[SpawnRequest] = (), repairs: Iterable[Repair] = ()):
        super().__init__(tasks)
        self.repairs: tuple[Repair, ...] = tuple(repairs)


Entry = tuple[Any, ...]
"""An entry of the ready heap: sort keys, then the task id (see ``Readiness.entry``)."""

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
