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
and those that change no status: ``rejected`` (a late result carrying a stale fencing
token), ``effect`` (a side effect applied once, keyed by the task id),
``effect_failed`` (one try of an effect failed; it is tried again), ``usage`` (a model
request of the task), ``batched`` (a model call of the task went into a Batch API job) and
``repaired`` (a fix the run's plan went through before it was accepted, see
:func:`repair_events`). :class:`EventName` holds them as constants.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, cast

from planrun.core._problem import Repair
from planrun.core._task import Task

__all__ = ["Audit", "Event", "EventName", "EventRow", "Ledger", "analyze", "as_event",
           "read_jsonl", "repair_events"]

_Raw = tuple[float, str, str, "str | None", int, "Mapping[str, Any] | None"]
"""An event noted but not yet built: ``(at, task, event, worker, attempt, detail)``, the
fields of :class:`Event` after ``seq`` (its seq is its place in the ledger)."""

EventRow = tuple[int, float, str, str, "str | None", int, "Mapping[str, Any] | None"]
"""An event as a plain tuple: the fields of :class:`Event` in order, ``seq`` first; a
detail of None is an empty one (what a driver hands a store's ``write_batch``)."""


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
    USAGE = "usage"
    """A model request the task made (changes no status): ``detail`` holds ``model``,
    ``prompt_tokens``, ``cached_tokens``, ``completion_tokens``, ``cost_usd`` and, for a
    request that failed, ``error`` (the error's class)."""
    BATCHED = "batched"
    """The task's model call went into a Batch API job (changes no status): ``detail``
    holds ``batch`` (the run's key for it, recorded before it is submitted), ``line`` (the
    call's ``custom_id``) and, once the API answered, ``id`` (the API's batch id)."""
    REPAIRED = "repaired"
    """A fix the run's plan went through before it was accepted (changes no status; one
    per :attr:`~planrun.Plan.repairs` entry, in order, right after the ``created`` events):
    ``detail`` is :meth:`~planrun.core.Repair.to_dict` (``by``: ``code`` or ``model``,
    ``rule``, ``code``: the problem fixed, ``task``, ``detail``, ``attempt``: the model
    reply, ``final_task``). See :func:`repair_events` for the task it is on."""


def repair_events(repairs: Sequence[Repair],
                  task_ids: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    """The ``repaired`` events of a plan's ``repairs``: ``(task id, detail)``, in order.

    ``task_ids`` are the ids of the plan's tasks, by index. A fix of one task of the
    accepted plan (its :attr:`~planrun.core.Repair.final_task`) is on that task; a fix of
    none (a model repair, whose task was one of a reply the model replaced, and the
    reordering of the whole plan, and a ``final_task`` that is no index of the plan, as a
    hand-built :class:`~planrun.core.Plan` may carry) is on the plan's first task. A plan
    with no task has no events.
    """
    if not task_ids:
        return []
    size = len(task_ids)
    return [(task_ids[r.final_task] if r.final_task is not None and 0 <= r.final_task < size
             else task_ids[0], r.to_dict()) for r in repairs]


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
    raise ImportError("planrun.core._ledger._event must set every field of Event, in order")
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


def as_event(row: EventRow) -> Event:
    """The :class:`Event` of an :data:`EventRow`."""
    return _event(row[0], row[1], row[2], row[3], row[4], row[5], row[6] or {})


class Ledger:
    """An append-only list of events with a running sequence number.

    Events appended here are numbered by their place: the first gets the seq after the
    last event the ledger was made with (0 for a new one), each next one the seq after.
    An entry is kept as a plain tuple (:data:`_Raw`) and made an :class:`Event` only when
    someone reads the events (most runs without a store or a listener never do);
    :meth:`raw_appender` hands out the list's ``append`` for a driver's hot path.
    """

    def __init__(self, events: Iterable[Event] = ()) -> None:
        built = sorted(events, key=lambda e: e.seq)
        self._events: list[Event | _Raw] = list(built)
        """Entries in seq order: :class:`Event` objects before place :attr:`_upto`, tuples
        (:data:`_Raw`) from there on. Never replaced: :meth:`raw_appender` hands out its
        ``append``."""
        self._offset = (built[-1].seq + 1 if built else 0) - len(built)
        """The seq of the entry at place ``i`` (past the events given) is ``i + offset``."""
        self._upto = len(built)
        """Entries before this place are built."""

    @property
    def next_seq(self) -> int:
        """The seq the next event gets."""
        return len(self._events) + self._offset

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
        """Append one event and return it (the ledger builds its own copy when read)."""
        events = self._events
        seq = len(events) + self._offset
        events.append((at, task, event, worker, attempt, detail))
        return _event(seq, at, task, event, worker, attempt, detail or {})

    def note(self, at: float, task: str, event: str, worker: str | None = None,
             attempt: int = 0, detail: Mapping[str, Any] | None = None) -> None:
        """Append one event like :meth:`append`, building no object."""
        self._events.append((at, task, event, worker, attempt, detail))

    def raw_appender(self) -> Callable[[_Raw], None]:
        """``append(entry)`` for entries ``(at, task, event, worker, attempt, detail)``,
        each noted as :meth:`note` notes it (a C call, for a driver's hot path)."""
        return self._events.append

    def change_sink(
        self, now: Callable[[], float], on_reclaimed: Callable[[Task], None],
    ) -> Callable[[Task, str, str | None, Mapping[str, Any] | None, int], None]:
        """A scheduling core's sink for a run nobody watches: each decided change's event
        is noted (as :meth:`note` does) at ``now()``; a reclaim is also handed to
        ``on_reclaimed``. The attempt is the record's token, or for a rejected result the
        token it carried."""
        rejected, reclaimed = EventName.REJECTED, EventName.RECLAIMED
        add = self._events.append

        def sink(task: Task, event: str, worker: str | None,
                 detail: Mapping[str, Any] | None, token: int) -> None:
            add((now(), task.id, event, worker,
                 token if event == rejected else task.token, detail))
            if event == reclaimed:
                on_reclaimed(task)

        return sink

    def rows(self, start: int, end: int, skip: Collection[int] = ()) -> list[EventRow]:
        """The entries at places ``start`` to ``end`` as :data:`EventRow` tuples (none
        built), but those whose seq is in ``skip``."""
        upto = min(max(self._upto, start), end)
        events = self._events
        out: list[EventRow] = [
            (e.seq, e.at, e.task, e.event, e.worker, e.attempt, e.detail)
            for e in cast("list[Event]", events[start:upto])]
        offset = self._offset
        out += [(i + offset, *e) for i, e in zip(range(upto, end),
                                                 cast("list[_Raw]", events[upto:end]),
                                                 strict=True)]
        if skip:
            out = [r for r in out if r[0] not in skip]
        return out

    def _built(self) -> list[Event | _Raw]:
        """The entries, every one an :class:`Event` (built in place)."""
        events = self._events
        end = len(events)
        upto = self._upto
        if upto < end:
            offset = self._offset
            for i in range(upto, end):
                e = cast("_Raw", events[i])
                events[i] = _event(i + offset, e[0], e[1], e[2], e[3], e[4], e[5] or {})
            self._upto = end
        return events

    def _completions(self, size: int | None = None
                     ) -> tuple[dict[str, int], int, Counter[str]]:
        """What the audit reads of the first ``size`` entries, without building objects:
        for each task that completed, the rank of its first ``completed`` event among the
        run's completions (ranks keep the ledger's order), the number of ``completed``
        events, and the ``effect`` events per task."""
        events = self._events
        end = len(events) if size is None else min(size, len(events))
        upto = min(self._upto, end)
        completed, effect, audited = EventName.COMPLETED, EventName.EFFECT, _AUDITED
        built = cast("list[Event]", events[:upto])
        hits = [(e.event, e.task) for e in built if e.event in audited]
        raw = cast("list[_Raw]", events[upto:end] if upto or size is not None else events)
        hits += [(e[2], e[1]) for e in raw if e[2] in audited]
        done = [task for name, task in hits if name is completed or name == completed]
        effects = Counter(task for name, task in hits if name == effect) \
            if len(done) < len(hits) else Counter()
        # The earliest completion of each task: the last one a reversed pass assigns.
        first = {task: rank for rank, task in zip(range(len(done) - 1, -1, -1),
                                                   reversed(done), strict=True)}
        return first, len(done), effects

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

    def _completions(self) -> tuple[dict[str, int], int, Counter[str]]:
        if self._ledger is not None:
            return self._ledger._completions(self._size)
        return _completions_of(self._all())

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

    def describe(self, statuses: Mapping[str, str] | None = None) -> str:
        """The audit in words: ``clean``, or what the log shows.

        Tasks that never completed are no violation by themselves (a dead task and what
        it cancelled never complete); given ``statuses`` (task id -> status) they are
        named with the status each ended in.
        """
        if self.clean:
            return "clean"
        wrong = [text for count, text in (
            (self.order_violations, "completion(s) came before a dependency completed"),
            (self.duplicates, "task(s) completed more than once"),
            (self.duplicate_effects, "effect(s) applied more than once"),
            (len(self.missing_effects), "completed task(s) whose effect was never applied"),
        ) if count for text in [f"{count} {text}"]]
        head = "; ".join(wrong) if wrong else \
            "no task completed twice or before its dependencies"
        if not self.missing:
            return head
        return f"{head}; {len(self.missing)} did not complete " \
               f"({_by_status(self.missing, statuses or {})})"


def _by_status(ids: Sequence[str], statuses: Mapping[str, str], shown: int = 8) -> str:
    """``t1 dead; t2, t3 cancelled``: ids grouped by the status they ended in."""
    groups: dict[str, list[str]] = {}
    for task_id in ids:
        groups.setdefault(statuses.get(task_id, "unfinished"), []).append(task_id)
    parts = []
    for status, members in groups.items():
        more = f" and {len(members) - shown} more" if len(members) > shown else ""
        parts.append(f"{', '.join(members[:shown])}{more} {status}")
    return "; ".join(parts)


_AUDIT_FIELDS = ("order_violations", "duplicates", "missing", "duplicate_effects",
                 "missing_effects")


class _AuditWhenRead(Audit):
    """An :class:`Audit` computed when one of its fields is first read (a run's result
    is built cheaply; most callers read its counts, not its audit). It is equal to, hashes
    as, prints and pickles as the audit it computes."""

    def __init__(self, compute: Callable[[], Audit]) -> None:
        object.__setattr__(self, "_compute", compute)

    def __getattr__(self, name: str) -> Any:
        if name not in _AUDIT_FIELDS:
            raise AttributeError(name)
        state = self.__dict__
        compute = state.pop("_compute")
        audit = compute()
        for key in _AUDIT_FIELDS:
            state[key] = getattr(audit, key)
        return state[name]

    def _fields(self) -> tuple[Any, ...]:
        return tuple(getattr(self, key) for key in _AUDIT_FIELDS)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Audit):
            return self._fields() == tuple(getattr(other, key) for key in _AUDIT_FIELDS)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(Audit(*self._fields()))

    def __repr__(self) -> str:
        return repr(Audit(*self._fields()))

    def __reduce__(self) -> Any:
        return Audit, self._fields()


def audit_when_read(compute: Callable[[], Audit]) -> Audit:
    """An :class:`Audit` that calls ``compute`` for its fields when one is first read."""
    return _AuditWhenRead(compute)


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
    if isinstance(events, Ledger | _EventView):  # in order already; no object needed
        first, completions, effects = events._completions()
    else:
        first, completions, effects = _completions_of(sorted(events, key=lambda ev: ev.seq))
    violations = 0
    missing: list[str] = []
    seen = first.get
    if isinstance(tasks, Mapping):
        for key, needs in tasks.items():
            task_id = str(key)
            at = seen(task_id)
            if at is None:
                missing.append(task_id)
                continue
            for dep in needs:
                done = seen(dep)
                if done is None or done > at:
                    violations += 1
    else:
        tasks = list(tasks)
        for t in tasks:
            at = seen(t.id)
            if at is None:
                missing.append(t.id)
                continue
            for dep in t.depends_on:
                done = seen(dep)
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


def _completions_of(events: Iterable[Event]) -> tuple[dict[str, int], int, Counter[str]]:
    """:meth:`Ledger._completions` of events in seq order."""
    first: dict[str, int] = {}
    effects: Counter[str] = Counter()
    completions = 0
    completed, effect = EventName.COMPLETED, EventName.EFFECT
    for e in events:
        if e.event == completed:
            if e.task not in first:
                first[e.task] = completions
            completions += 1
        elif e.event == effect:
            effects[e.task] += 1
    return first, completions, effects
