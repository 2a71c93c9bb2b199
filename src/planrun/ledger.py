"""The append-only event log of a run, and the audit computed from it alone.

Every status change of every task appends one :class:`Event`. The audit
(:func:`analyze`) never looks at task records or at what a worker says about itself: it
reads the log, so it also runs on the logs of other systems once they are converted to
JSON Lines of the same shape.

Event names:

``created``, ``assigned``, ``started``, ``completed``, ``failed`` (an attempt failed; its
``detail`` holds ``retry_at``), ``retry`` (the backoff is over; the task is pending again),
``reclaimed`` (the lease expired; the task is pending again), ``dead`` (a rejection by a
person is a ``dead`` whose ``detail`` holds ``cause: rejected``), ``cancelled``,
``waiting`` (the task waits for a person's approval; ``detail`` says ``for`` what and
``timeout_at``), ``approved`` (a person, or a timeout, approved it; ``detail`` holds ``note``);
and three that change no status: ``rejected`` (a late result carrying a stale fencing
token), ``effect`` (a side effect applied once, keyed by the task id) and
``effect_failed`` (one try of an effect failed; it is tried again). :class:`EventName`
holds them as constants.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from planrun.task import Task

__all__ = ["Audit", "Event", "EventName", "Ledger", "analyze", "read_jsonl"]

_Raw = tuple[int, float, str, str, "str | None", int, "Mapping[str, Any] | None"]
"""An event noted but not yet built: the fields of :class:`Event` in order."""


class EventName:
    """The ledger's event names, as constants (plain strings, stored as they are)."""

    CREATED = "created"
    ASSIGNED = "assigned"
    STARTED = "started"
    COMPLETED = "completed"
    FAILED = "failed"
    RETRY = "retry"
    RECLAIMED = "reclaimed"
    DEAD = "dead"
    CANCELLED = "cancelled"
    REJECTED = "rejected"
    EFFECT = "effect"
    EFFECT_FAILED = "effect_failed"
    REPLANNED = "replanned"
    """A dead task's part of the goal was re-planned: its replacement tasks were added."""
    REPLAN_FAILED = "replan_failed"
    """Re-planning a dead task failed (model error, invalid fragment): its dependents stay
    cancelled."""
    JOINED = "joined"
    """A pending task waits for more: tasks spawned by a task it joins."""
    WAITING = "waiting"
    APPROVED = "approved"


@dataclass(frozen=True, slots=True)
class Event:
    """One entry of the ledger."""

    seq: int
    """Position in the log, from 0; the audit orders by it."""
    at: float
    """Clock time of the event."""
    task: str
    """Task id."""
    event: str
    worker: str | None = None
    attempt: int = 0
    """The task's fencing token when the event happened."""
    detail: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The event as JSON-ready data."""
        data = asdict(self)
        data["detail"] = dict(self.detail)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Event:
        """Build an event from :meth:`to_dict` output."""
        return cls(
            seq=int(data["seq"]),
            at=float(data.get("at", 0.0)),
            task=str(data["task"]),
            event=str(data["event"]),
            worker=data.get("worker"),
            attempt=int(data.get("attempt", 0)),
            detail=dict(data.get("detail") or {}),
        )


_AUDITED = frozenset({EventName.COMPLETED, EventName.EFFECT})
"""The events the audit reads."""

_new_object = object.__new__

_SLOTS = tuple(Event.__dict__[name].__set__ for name in Event.__slots__)
if Event.__slots__ != ("seq", "at", "task", "event", "worker", "attempt", "detail"):
    raise ImportError("planrun.ledger._event must set every field of Event, in order")
(_set_seq, _set_at, _set_task, _set_event, _set_worker, _set_attempt, _set_detail) = _SLOTS


def _event(seq: int, at: float, task: str, event: str, worker: str | None, attempt: int,
           detail: Mapping[str, Any]) -> Event:
    """``Event(seq, at, task, event, worker, attempt, detail)``, each slot set directly
    (the frozen dataclass's ``__init__`` goes through ``object.__setattr__`` per field, at
    twice the cost; a durable run builds four events per task)."""
    entry = _new_object(Event)
    _set_seq(entry, seq)
    _set_at(entry, at)
    _set_task(entry, task)
    _set_event(entry, event)
    _set_worker(entry, worker)
    _set_attempt(entry, attempt)
    _set_detail(entry, detail)
    return entry


class Ledger:
    """An append-only list of events with a running sequence number.

    :meth:`note` appends an event without building its :class:`Event` object: the entry is
    kept as a plain tuple and made an object only when someone reads the events (most runs
    without a store or a listener never do). The events the audit reads (``completed`` and
    ``effect``) are also listed apart as they are appended, so an audit reads those alone.
    """

    def __init__(self, events: Iterable[Event] = ()) -> None:
        built = sorted(events, key=lambda e: e.seq)
        self._next = built[-1].seq + 1 if built else 0
        self._events: list[Event | _Raw] = list(built)
        self._raw = False
        """Some entries are still tuples."""
        self._audited: list[tuple[int, str, str]] = [
            (e.seq, e.task, e.event) for e in built if e.event in _AUDITED]
        """``(seq, task, event)`` of the ``completed`` and ``effect`` entries, in order."""

    def append(
        self,
        at: float,
        task: str,
        event: str,
        *,
        worker: str | None = None,
        attempt: int = 0,
        detail: Mapping[str, Any] | None = None,
    ) -> Event:
        """Append one event and return it."""
        entry = _event(self._next, at, task, event, worker, attempt, detail or {})
        if event in _AUDITED:
            self._audited.append((self._next, task, event))
        self._next += 1
        self._events.append(entry)
        return entry

    def note(self, at: float, task: str, event: str, worker: str | None = None,
             attempt: int = 0, detail: Mapping[str, Any] | None = None) -> None:
        """Append one event like :meth:`append`, building its object only when it is read."""
        self._events.append((self._next, at, task, event, worker, attempt, detail))
        if event in _AUDITED:
            self._audited.append((self._next, task, event))
        self._next += 1
        self._raw = True

    def change_sink(
        self, now: Callable[[], float], on_reclaimed: Callable[[Task], None],
    ) -> Callable[[Task, str, str | None, Mapping[str, Any] | None, int], None]:
        """A scheduling core's sink for a run nobody watches: each decided change's event
        is noted (as :meth:`note` does) at ``now()``; a reclaim is also handed to
        ``on_reclaimed``. The attempt is the record's token, or for a rejected result the
        token it carried."""
        rejected, reclaimed = EventName.REJECTED, EventName.RECLAIMED
        audited = self._audited

        def sink(task: Task, event: str, worker: str | None,
                 detail: Mapping[str, Any] | None, token: int) -> None:
            seq = self._next
            self._events.append((seq, now(), task.id, event, worker,
                                 token if event == rejected else task.token, detail))
            if event in _AUDITED:
                audited.append((seq, task.id, event))
            self._next = seq + 1
            self._raw = True
            if event == reclaimed:
                on_reclaimed(task)

        return sink

    def _built(self) -> list[Event | _Raw]:
        if self._raw:
            self._events = [
                _event(e[0], e[1], e[2], e[3], e[4], e[5], e[6] or {}) if type(e) is tuple else e
                for e in self._events
            ]
            self._raw = False
        return self._events

    def _names(self, only: frozenset[str]) -> list[tuple[int, str, str]]:
        """``(seq, task, event)`` of the entries named in ``only``, oldest first, without
        building objects."""
        if only <= _AUDITED:  # listed apart as they were appended
            if only == _AUDITED:
                return list(self._audited)
            return [entry for entry in self._audited if entry[2] in only]
        if not self._raw:
            return [(e.seq, e.task, e.event) for e in self._events  # type: ignore[union-attr]
                    if e.event in only]  # type: ignore[union-attr]
        return [(e[0], e[2], e[3]) if type(e) is tuple
                else (e.seq, e.task, e.event)  # type: ignore[union-attr]
                for e in self._events
                if (e[3] if type(e) is tuple else e.event) in only]  # type: ignore[union-attr]

    @property
    def events(self) -> Sequence[Event]:
        """The events so far, oldest first (a read-only view)."""
        return tuple(self._built())  # type: ignore[arg-type]

    def view(self) -> Sequence[Event]:
        """The events so far as a sequence whose objects are built when first read."""
        return _EventView(self, len(self._events))

    def __len__(self) -> int:
        return len(self._events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self._built())  # type: ignore[arg-type]

    def write_jsonl(self, target: str | Path | IO[str]) -> None:
        """Write the events as JSON Lines to a path or an open text file."""
        if isinstance(target, str | Path):
            with open(target, "w", encoding="utf-8") as fh:
                self.write_jsonl(fh)
            return
        for e in self:
            target.write(json.dumps(e.to_dict(), sort_keys=True, default=str) + "\n")


class _EventView(Sequence[Event]):
    """The first ``size`` events of a ledger; the objects are built on first read."""

    __slots__ = ("_events", "_ledger", "_size")

    def __init__(self, ledger: Ledger, size: int) -> None:
        self._ledger: Ledger | None = ledger
        self._size = size
        self._events: tuple[Event, ...] = ()

    def _all(self) -> tuple[Event, ...]:
        if self._ledger is not None:
            self._events = tuple(self._ledger._built()[: self._size])  # type: ignore[arg-type]
            self._ledger = None
        return self._events

    def _names(self, only: frozenset[str]) -> list[tuple[int, str, str]]:
        if self._ledger is not None and len(self._ledger) == self._size:
            return self._ledger._names(only)
        return [(e.seq, e.task, e.event) for e in self._all() if e.event in only]

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, index: Any) -> Any:
        return self._all()[index]

    def __iter__(self) -> Iterator[Event]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str):
            return self._all() == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._all())


def read_jsonl(source: str | Path | IO[str]) -> list[Event]:
    """Read events written by :meth:`Ledger.write_jsonl` (or converted from another system)."""
    if isinstance(source, str | Path):
        with open(source, encoding="utf-8") as fh:
            return read_jsonl(fh)
    return [Event.from_dict(json.loads(line)) for line in source if line.strip()]


@dataclass(frozen=True)
class Audit:
    """What the log says about a run."""

    order_violations: int
    """Completions that came before (or without) a completion of a dependency."""
    duplicates: int
    """Completions beyond the first for the same task."""
    missing: list[str]
    """Tasks that never completed, in the order given."""
    duplicate_effects: int = 0
    """Effects applied more than once for the same task."""
    missing_effects: list[str] = field(default_factory=list)
    """Completed tasks of a kind with an effect whose effect was never logged."""

    @property
    def clean(self) -> bool:
        """No violation, no duplicate, nothing missing."""
        return not (self.order_violations or self.duplicates or self.missing
                    or self.duplicate_effects or self.missing_effects)

    def to_dict(self) -> dict[str, Any]:
        """The audit as JSON-ready data."""
        return asdict(self)


def analyze(
    tasks: Iterable[Task] | Mapping[str, Sequence[str]],
    events: Iterable[Event],
    effect_kinds: Iterable[str] = (),
) -> Audit:
    """Audit a run from its log alone.

    ``tasks`` gives the task ids and their dependencies: task records, or a mapping from id
    to the ids it depends on. Only ``completed`` and ``effect`` events are read (a task still
    ``waiting`` for approval is ``missing``). With task
    records and ``effect_kinds`` (the kinds whose completion has an effect), a completed task
    of such a kind with no ``effect`` event is listed in ``missing_effects``.
    """
    kinds = frozenset(effect_kinds)
    pairs: Iterable[tuple[str, Sequence[str]]]
    if isinstance(tasks, Mapping):
        pairs = [(str(k), list(v)) for k, v in tasks.items()]
    else:
        tasks = list(tasks)
        pairs = _id_deps(tasks)
    first: dict[str, int] = {}
    completions = 0
    effects: Counter[str] = Counter()
    names: Iterable[tuple[int, str, str]]
    if isinstance(events, Ledger | _EventView):  # in order already; no object needed
        names = events._names(_AUDITED)
    else:
        names = ((e.seq, e.task, e.event) for e in sorted(events, key=lambda ev: ev.seq))
    completed, effect = EventName.COMPLETED, EventName.EFFECT
    for seq, task_id, name in names:
        if name == completed:
            completions += 1
            if task_id not in first:
                first[task_id] = seq
        elif name == effect:
            effects[task_id] += 1
    violations = 0
    missing: list[str] = []
    for task_id, needs in pairs:
        at = first.get(task_id)
        if at is None:
            missing.append(task_id)
            continue
        for dep in needs:
            done = first.get(dep)
            if done is None or done > at:
                violations += 1
    with_effect = ([t.id for t in tasks if t.kind in kinds]
                   if kinds and not isinstance(tasks, Mapping) else [])
    return Audit(
        order_violations=violations,
        duplicates=completions - len(first),
        missing=missing,
        duplicate_effects=sum(n - 1 for n in effects.values() if n > 1),
        missing_effects=[t for t in with_effect if t in first and t not in effects],
    )


def _id_deps(tasks: Sequence[Task]) -> Iterator[tuple[str, Sequence[str]]]:
    """``(id, depends_on)`` of each record, read as the audit goes."""
    for t in tasks:
        yield t.id, t.depends_on
