"""The task record and its state machine.

A task is frozen data. Every status change goes through :func:`transition`, which refuses
the changes the state machine does not allow and returns a new record; nothing else ever
changes a task's status.

    pending ──► assigned ──► running ──► completed
       ▲  │ └─────── claimed ──►│  │                             (a peer worker claims it)
       ▲  │         │  │        │  │
       │  │         │  │        │  └──► failed ──► pending      (retry after backoff)
       │  │         │  │        └─────► dead                    (permanent, or retries spent)
       │  └─────────┴──┴──────┴───────► cancelled               (a dependency died, abort,
       │                                                          budget: never did its work)
       └──────── reclaimed ◄────────┘                           (lease expired)

    pending ──► waiting ──► pending       (approval before start: a person approves)
    running ──► waiting ──► completed     (approval before the effect: result kept)
                waiting ──► dead          (rejected, cause "rejected")
                waiting ──► cancelled     (abort, deadline, budget)
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from planrun.core._errors import IllegalTransition
from planrun.core._records import fast_init

__all__ = ["FINAL", "Status", "Task", "allowed", "transition"]


class Status(str, enum.Enum):
    """Where a task stands."""

    PENDING = "pending"
    """Created or requeued; waiting for its dependencies and a worker."""
    ASSIGNED = "assigned"
    """Given to exactly one worker, not yet started."""
    RUNNING = "running"
    """The worker has begun."""
    COMPLETED = "completed"
    """Finished with a result."""
    FAILED = "failed"
    """An attempt failed and a retry is scheduled (``not_before``)."""
    DEAD = "dead"
    """Given up: retries exhausted, a permanent error, or too many reclaims."""
    CANCELLED = "cancelled"
    """Never run: a dependency died, the run was aborted, or the budget ran out."""
    WAITING = "waiting"
    """Waiting for a person to approve or reject it; ``cause`` says for what
    (``approval:start`` or ``approval:effect``). Not a stall: it waits for a decision."""

    def __str__(self) -> str:
        return self.value

    # Equal to its value, so hashed as it: a status and its string are the same set key,
    # and a membership test costs a C call, not Enum's Python-level __hash__.
    __hash__ = str.__hash__


FINAL: frozenset[Status] = frozenset({Status.COMPLETED, Status.DEAD, Status.CANCELLED})
"""The statuses a task never leaves."""

_ALLOWED: Mapping[Status, frozenset[Status]] = {
    Status.PENDING: frozenset(
        {Status.ASSIGNED, Status.RUNNING, Status.CANCELLED, Status.DEAD, Status.WAITING}
    ),
    Status.ASSIGNED: frozenset(
        {Status.RUNNING, Status.PENDING, Status.CANCELLED, Status.DEAD}
    ),
    Status.RUNNING: frozenset(
        {Status.COMPLETED, Status.FAILED, Status.DEAD, Status.PENDING, Status.CANCELLED,
         Status.WAITING}
    ),
    Status.WAITING: frozenset(
        {Status.PENDING, Status.COMPLETED, Status.DEAD, Status.CANCELLED}
    ),
    Status.FAILED: frozenset({Status.PENDING, Status.CANCELLED, Status.DEAD}),
    Status.COMPLETED: frozenset(),
    Status.DEAD: frozenset(),
    Status.CANCELLED: frozenset(),
}


def allowed(source: Status, target: Status) -> bool:
    """True when the state machine lets a task go from ``source`` to ``target``."""
    return target in _ALLOWED[source]


@fast_init
@dataclass(frozen=True)
class Task:
    """One unit of work, as data with a status.

    Every field exists because of a failure it guards against: ``attempts`` and
    ``max_attempts`` stop infinite retries; ``lease`` (a heartbeat deadline) lets the
    supervisor notice a worker that died silently; ``token`` fences off the late result of
    a reclaimed attempt; ``depends_on`` stops a task starting before what it needs exists;
    ``resources`` keeps tasks that touch the same thing from running at once.
    """

    id: str
    kind: str
    payload: Mapping[str, Any] = field(default_factory=dict)
    status: Status = Status.PENDING
    assigned_to: str | None = None
    attempts: int = 0
    """Attempts that ended (completed or failed); a reclaim does not count."""
    max_attempts: int = 3
    result: Any = None
    error: str | None = None
    error_class: str | None = None
    """``"transient"`` or ``"permanent"`` for the last error."""
    cause: str | None = None
    """Why a task was cancelled: the dead dependency's id, ``"abort"`` or ``"budget"``; what
    a ``waiting`` task waits for (``"approval:start"``, ``"approval:effect"``) or the decision
    recorded for it; ``"approved"`` once a person approved it; ``"rejected"`` for a dead task
    a person rejected."""
    depends_on: tuple[str, ...] = ()
    estimate_s: float = 1.0
    resources: tuple[str, ...] = ()
    lease: float | None = None
    """Heartbeat deadline of the current assignment; past it the task is reclaimed."""
    token: int = 0
    """Fencing token: grows with every assignment; a result carrying an older one is refused."""
    reclaims: int = 0
    not_before: float | None = None
    """Backoff: the earliest time a failed task may start again."""
    created_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    parent: str | None = None
    """The task that spawned this one at run time (None: given with the plan)."""
    joins: tuple[str, ...] = ()
    """Tasks whose spawned tasks (at any depth) this one waits for, besides ``depends_on``."""

    @property
    def finished(self) -> bool:
        """True once the task is completed, dead or cancelled."""
        return self.status in FINAL

    def evolve(self, **changes: Any) -> Task:
        """Return a copy with ``changes`` applied; use :func:`transition` for a status."""
        if "status" in changes:
            raise IllegalTransition("change a status with planrun.task.transition()")
        return _copy(self, changes)

    def to_dict(self) -> dict[str, Any]:
        """The record as plain JSON-ready data."""
        data = dataclasses.asdict(self)
        data["status"] = self.status.value
        data["payload"] = dict(self.payload)
        data["depends_on"] = list(self.depends_on)
        data["resources"] = list(self.resources)
        data["joins"] = list(self.joins)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Task:
        """Build a record from :meth:`to_dict` output (or a store row)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        values["status"] = Status(values.get("status", Status.PENDING))
        values["depends_on"] = tuple(values.get("depends_on") or ())
        values["resources"] = tuple(values.get("resources") or ())
        values["joins"] = tuple(values.get("joins") or ())
        values["payload"] = dict(values.get("payload") or {})
        return cls(**values)


def transition(task: Task, to: Status, **changes: Any) -> Task:
    """Return ``task`` moved to status ``to`` with ``changes``; refuse an illegal change.

    This is the only place a status changes.

    Raises:
        IllegalTransition: ``to`` is not reachable from the task's current status.
    """
    return moved(task, to, changes)


def moved(task: Task, to: Status, changes: dict[str, Any]) -> Task:
    """:func:`transition` with the changes as a dict (taken over: it gets ``status``)."""
    if to not in _ALLOWED[task.status]:
        raise IllegalTransition(
            f"task {task.id!r}: {task.status.value} -> {to.value} is not allowed"
        )
    changes["status"] = to
    return _copy(task, changes)


def advanced(task: Task, to: Status, changes: dict[str, Any]) -> Task:
    """:func:`moved` for the scheduling core, whose changes name fields in its own code
    (they are not checked against the record's fields again)."""
    if to not in _ALLOWED[task.status]:
        raise IllegalTransition(
            f"task {task.id!r}: {task.status.value} -> {to.value} is not allowed"
        )
    state = task.__dict__.copy()  # shares the class's keys, as the original's does
    state.update(changes)
    state["status"] = to
    new = _new(Task)
    _set(new, "__dict__", state)
    return new


def assigned(task: Task, worker: str, lease: float | None) -> Task:
    """``task`` given to ``worker`` under a new fencing token (the core's assignment):
    :func:`advanced` with its fields stored one by one, as the hot path needs."""
    if _ASSIGNED not in _ALLOWED[task.status]:
        raise IllegalTransition(
            f"task {task.id!r}: {task.status.value} -> assigned is not allowed")
    state = task.__dict__.copy()
    state["status"] = _ASSIGNED
    state["assigned_to"] = worker
    state["token"] = task.token + 1
    state["lease"] = lease
    new = _new(Task)
    _set(new, "__dict__", state)
    return new


def started(task: Task, now: float, lease: float) -> Task:
    """``task`` started at ``now`` by the worker it was assigned to, its lease until
    ``lease`` (:func:`advanced` for the core's start)."""
    if _RUNNING not in _ALLOWED[task.status]:
        raise IllegalTransition(
            f"task {task.id!r}: {task.status.value} -> running is not allowed")
    state = task.__dict__.copy()
    state["status"] = _RUNNING
    state["started_at"] = now
    state["lease"] = lease
    new = _new(Task)
    _set(new, "__dict__", state)
    return new


def completed(task: Task, result: Any, now: float) -> Task:
    """``task`` completed at ``now`` with ``result``: one attempt more, no lease, no error
    (:func:`advanced` for the core's completion)."""
    if _COMPLETED not in _ALLOWED[task.status]:
        raise IllegalTransition(
            f"task {task.id!r}: {task.status.value} -> completed is not allowed")
    state = task.__dict__.copy()
    state["status"] = _COMPLETED
    state["result"] = result
    state["finished_at"] = now
    state["attempts"] = task.attempts + 1
    state["lease"] = None
    if task.error is not None or task.error_class is not None:
        state["error"] = state["error_class"] = None
    new = _new(Task)
    _set(new, "__dict__", state)
    return new


def created(task: Task, now: float, max_attempts: int | None = None) -> Task:
    """``task`` as a run takes it in: created at ``now``, and with ``max_attempts`` when
    one is given (no status change)."""
    state = task.__dict__.copy()
    state["created_at"] = now
    if max_attempts is not None:
        state["max_attempts"] = max_attempts
    new = _new(Task)
    _set(new, "__dict__", state)
    return new


def revised(task: Task, changes: dict[str, Any]) -> Task:
    """A copy of ``task`` with ``changes`` (no status among them), for the scheduling core
    (its changes name fields in its own code)."""
    state = task.__dict__.copy()  # shares the class's keys, as the original's does
    state.update(changes)
    new = _new(Task)
    _set(new, "__dict__", state)
    return new


def _copy(task: Task, changes: dict[str, Any]) -> Task:
    # dataclasses.replace re-runs __init__ and costs ~7x more; the supervisor copies a
    # record at every transition, so this stays a plain dict copy of a frozen instance.
    if not changes.keys() <= _FIELDS:
        raise TypeError(f"Task has no field(s) {sorted(changes.keys() - _FIELDS)}")
    state = task.__dict__.copy()  # shares the class's keys, as the original's does
    state.update(changes)
    new = _new(Task)
    _set(new, "__dict__", state)
    return new


_new = object.__new__
_set = object.__setattr__  # a frozen record's state is set once, whole
_ASSIGNED, _RUNNING, _COMPLETED = Status.ASSIGNED, Status.RUNNING, Status.COMPLETED

_FIELDS = frozenset(f.name for f in dataclasses.fields(Task))

