"""The store interface, its records, and the row mapping every database shares.

A store keeps the durable side of a run: the run itself, one row per task (every field of
:class:`planrun.core.Task`), the append-only ledger events, the side-effect records and,
for multi-process runs, the registered workers. It knows nothing about policy: the
supervisor decides what a change means; the store writes it in one transaction.

:class:`Store` is what a run needs of one. The limits shared by every process of a run are
a second, separate interface, :class:`planrun.core.SharedLimits`. Both are implemented once,
by :class:`~planrun.stores._sql.SQLStore` over a connector (SQLite, PostgreSQL, SQLite in
memory); the mapping below makes a task row mean the same thing everywhere.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit

from planrun.core import (
    Event,
    EventRow,
    Status,
    StoreError,
    Task,
    UnknownRun,
    UnstorableValue,
    UsageError,
    redact,
)
from planrun.stores._owners import owner_gone

__all__ = [
    "FINISHED_RUN",
    "INTERRUPTED",
    "SCHEMA_VERSION",
    "EffectRecord",
    "RunInfo",
    "RunOwner",
    "RunState",
    "RunSummary",
    "Store",
    "mask_url",
    "shown_status",
    "strict_json",
]

SCHEMA_VERSION = 6
"""The schema version this code creates and understands; ``open()`` refuses a newer one.

1: runs, tasks, events, effects, workers. 2: one event per ``(run, seq)``, so writing a
batch again (after a commit whose answer was lost) adds nothing. 3: the run's owner lease
(``owner``, ``owner_until``); in PostgreSQL, events numbered from a sequence and stamped
with their transaction id, so no writer waits for another to number its events. 4: limits
shared by every process: a rate-limiter row per limit key, a spend row per run. 5: tasks
created at run time (``parent``, ``joins``). 6: a rate-limiter row says whether its rates
are the provider's (``learned``)."""

FINISHED_RUN = frozenset({"finished", "aborted"})
"""Run statuses that mean the run is over: nothing is left to resume."""

INTERRUPTED = "interrupted"
"""The status shown for a run that is not over and has no live owner: resume it."""

@dataclass(frozen=True)
class RunInfo:
    """One run: what it is for and where it stands."""

    id: str
    created_at: float
    status: str = "running"
    """As the last driver recorded it; :func:`shown_status` tells what it means now."""
    goal: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)
    owner: str | None = None
    """The process holding the run's owner lease (None: nobody; see
    :meth:`Store.acquire_run`). ``create_run`` ignores it: a run starts unowned."""
    owner_until: float | None = None
    """When that lease ends (epoch seconds) unless its owner renews it."""


@dataclass(frozen=True)
class RunSummary:
    """A run with its task counts, as :meth:`Store.list_runs` returns it."""

    id: str
    created_at: float
    status: str
    goal: str
    counts: Mapping[str, int]
    """Number of tasks per status; every status is present, zero when none."""
    owner: str | None = None
    """As in :class:`RunInfo`."""
    owner_until: float | None = None
    """As in :class:`RunInfo`."""


@dataclass(frozen=True)
class RunOwner:
    """Who holds a run's owner lease, and until when (epoch seconds)."""

    name: str
    until: float

    def live(self, now: float) -> bool:
        """Whether the lease still holds at ``now``."""
        return self.until >= now


def shown_status(run: RunInfo | RunSummary, now: float) -> str:
    """What a run's status means at ``now``: how it stopped does not decide it.

    A finished or aborted run shows as recorded. Any other run shows as recorded while an
    owner's lease holds, and as :data:`INTERRUPTED` (resumable) when no live process owns
    it, whether it stopped on Ctrl-C (recorded ``failed``), SIGKILL or a lost machine
    (recorded ``running``). An owner that is provably gone (a process of this host that no
    longer exists, or whose pid another process now has: :func:`owner_gone`) owns nothing,
    even while its lease has time left: the run shows as interrupted at once, as resuming
    takes it over at once.
    """
    if run.status in FINISHED_RUN:
        return run.status
    if run.owner_until is not None and run.owner_until >= now and not (
            run.owner is not None and owner_gone(run.owner)):
        return run.status
    return INTERRUPTED


@dataclass(frozen=True)
class EffectRecord:
    """A side effect keyed by its task: begun (``"started"``) or done (``"applied"``)."""

    task_id: str
    key: str
    state: str
    """``"started"`` or ``"applied"``."""
    result: Any
    at: float


@dataclass(frozen=True)
class RunState:
    """Everything a store holds about one run, as :meth:`Store.load` returns it."""

    run: RunInfo
    tasks: list[Task]
    """In the order the tasks were first written."""
    events: list[Event]
    """Ordered by ``seq``."""
    effects: dict[str, EffectRecord]
    """By task id."""


class Store(Protocol):
    """Durable task rows and ledger events, written in one transaction per call.

    Every method is a coroutine, called from the supervisor's event loop (or a worker
    process's). Every failure is a :class:`planrun.StoreError`; no driver exception
    leaves a store. One exception: a value that cannot be stored as JSON is a
    :class:`planrun.core.UnstorableValue` (permanent, raised before anything is written:
    retrying the same value cannot help).
    """

    url: str
    """Where the store lives, with any password masked."""

    async def open(self) -> None:
        """Connect, then create or migrate the schema; refuse a schema newer than this code."""
        ...

    async def close(self) -> None:
        """Release connections; calling it twice is harmless."""
        ...

    async def create_run(self, run: RunInfo) -> None:
        """Insert a run; an existing id is :class:`~planrun.core.RunExists`."""
        ...

    async def set_run_status(self, run_id: str, status: str) -> None:
        """Change a run's status (``running``, ``completed``, ``aborted``, …)."""
        ...

    async def acquire_run(self, run_id: str, owner: str, ttl: float, now: float, *,
                          take_from: str | None = None) -> None:
        """Make ``owner`` the run's one owner until ``now + ttl``, atomically.

        Succeeds when the run has no owner, when its owner's lease ended before ``now``,
        when ``owner`` already holds it (then the lease is extended), or when the holder is
        still ``take_from`` (an owner the caller found to be a process that no longer
        exists: compare and set, so an owner that took the run meanwhile keeps it).
        Otherwise raises
        :class:`planrun.RunInUse` naming the live owner and when its lease ends; an
        unknown run is a :class:`planrun.UnknownRun`.
        """
        ...

    async def renew_run(self, run_id: str, owner: str, ttl: float, now: float) -> bool:
        """Extend ``owner``'s lease to ``now + ttl``; False when another owner holds the run
        (``owner`` lost it after its lease expired). An expired lease nobody took is renewed.
        """
        ...

    async def release_run(self, run_id: str, owner: str) -> None:
        """Give up the lease if ``owner`` holds it (else nothing changes)."""
        ...

    async def run_owner(self, run_id: str) -> RunOwner | None:
        """The run's owner and lease end as stored (maybe expired), or None when unowned."""
        ...

    async def add_tasks(self, run_id: str, tasks: Sequence[Task], events: Sequence[Event]) -> None:
        """Insert new task rows and their events in one transaction."""
        ...

    async def write(self, run_id: str, changes: Sequence[tuple[Task, Event]]) -> None:
        """Upsert every task row and append every event; the batch is all-or-nothing."""
        ...

    async def write_batch(self, run_id: str, tasks: Sequence[Task],
                          events: Sequence[EventRow]) -> None:
        """Upsert every row of ``tasks`` (each task once, as it is now) and append every
        event (as tuples, see :data:`planrun.core._ledger.EventRow`); all or nothing. What
        :meth:`write` does for the same changes, without an object per event: a driver's
        batch cut from its ledger, with the records of the tasks its events name."""
        ...

    async def append_event(self, run_id: str, event: Event) -> None:
        """Append one event that changes no task row (an ``effect``); the store numbers it."""
        ...

    async def record_decision(self, run_id: str, task_id: str, approve: bool,
                              note: str | None) -> Task:
        """Write a person's decision on a ``waiting`` task's row (it stays ``waiting``; the
        run's driver carries the decision out, now or at resume) and return the row.

        Raises:
            UsageError: no such task, the task is not waiting, or it was already decided.
        """
        ...

    async def load(self, run_id: str) -> RunState:
        """Everything about one run; an unknown run is a :class:`StoreError`."""
        ...

    async def load_tasks(self, run_id: str) -> RunState:
        """Like :meth:`load` without the events (``events`` is empty): a cheap poll."""
        ...

    async def load_some(self, run_id: str, ids: Sequence[str]) -> list[Task]:
        """The tasks of ``ids`` that exist, in task order (a worker reading its inputs)."""
        ...

    async def list_runs(self) -> list[RunSummary]:
        """Every run, oldest first, with its task counts."""
        ...

    async def effect_begin(self, run_id: str, task_id: str, key: str, at: float) -> EffectRecord:
        """Record that a task's effect is starting, unless it is already recorded; return
        the stored record (the new one, or the one that was there)."""
        ...

    async def effect_done(
        self, run_id: str, task_id: str, result: Any, at: float, event: Event | None = None
    ) -> bool:
        """Mark a begun effect applied with its result; a second call changes nothing.

        ``event`` (the ``effect`` event) is appended in the same transaction, and only by
        the call that marks the effect applied: one event per effect, however many
        processes (a supervisor that died with its commit in flight and the one resuming
        it) apply it. A negative ``event.seq`` is numbered by the store. Returns True when
        this call marked it applied.
        """
        ...

    async def register_worker(
        self, run_id: str, name: str, kinds: Sequence[str], capacity: int, at: float
    ) -> None:
        """Register (or re-register) a worker process for a run."""
        ...

    async def heartbeat_worker(self, run_id: str, name: str, at: float) -> None:
        """Record that a registered worker is alive."""
        ...

    async def list_workers(self, run_id: str) -> list[dict[str, Any]]:
        """Registered workers, by name: ``name``, ``kinds``, ``capacity`` and
        ``last_heartbeat``."""
        ...


def mask_url(url: str) -> str:
    """Return ``url`` with its password (in the netloc or a ``password=`` query) as ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    masked = url
    if "@" in parts.netloc:
        userinfo, _, hostinfo = parts.netloc.rpartition("@")
        if ":" in userinfo:
            user = userinfo.split(":", 1)[0]
            masked = masked.replace(parts.netloc, f"{user}:***@{hostinfo}", 1)
    if "password=" in parts.query:
        pairs = [(k, "***" if k == "password" else v) for k, v in parse_qsl(parts.query, True)]
        masked = masked.replace(parts.query, urlencode(pairs, safe="*"), 1)
    return masked


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (drivers add DETAIL and HINT lines)."""
    text = " ".join(part.strip() for part in str(exc).splitlines() if part.strip())
    return text or type(exc).__name__


# --- JSON -----------------------------------------------------------------------------------


_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"))
_KEY_TYPES = (str, int, float, bool, type(None))


def strict_json(value: Any, what: str = "value") -> str:
    """Encode ``value`` as strict JSON text, or raise :class:`~planrun.core.UnstorableValue`.

    Strict: objects, arrays (lists and tuples), strings, finite numbers, booleans and null;
    no ``NaN`` or infinity, no ``datetime``, ``set``, ``bytes`` or other object. The error
    is one line that says what (``what``), where inside it and which type, e.g. ``task 'a'
    result cannot be stored as JSON: $.rows[2].when has type datetime.datetime``. The same value
    fails the same way every time: callers fail the task, they do not retry.
    """
    try:
        return _ENCODER.encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        path, type_name, why = _offender(value)
        raise UnstorableValue(f"{what} cannot be stored as JSON: {path} {why}",
                              path=path, type_name=type_name) from exc


def _type_name(value: Any) -> str:
    kind = type(value)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def _offender(value: Any) -> tuple[str, str, str]:
    """Where the first value JSON cannot hold sits in ``value``: (path, type, reason)."""
    stack: list[tuple[str, Any, int]] = [("$", value, 0)]
    seen: set[int] = set()
    while stack:
        path, item, depth = stack.pop()
        if isinstance(item, str | bool | int | type(None)):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                return path, "float", f"is the float {item} (JSON has no NaN or infinity)"
            continue
        if isinstance(item, dict | list | tuple):
            if id(item) in seen or depth > 900:
                return path, _type_name(item), "is nested too deep (or contains itself)"
            seen.add(id(item))
            if isinstance(item, dict):
                children = []
                for key, child in item.items():
                    if not isinstance(key, _KEY_TYPES):
                        return path, _type_name(key), f"has a key of type {_type_name(key)}"
                    text = str(key)
                    sub = f"{path}.{text}" if text.isidentifier() else f"{path}[{text!r}]"
                    children.append((sub, child, depth + 1))
            else:
                children = [(f"{path}[{i}]", child, depth + 1) for i, child in enumerate(item)]
            stack.extend(reversed(children))
            continue
        return path, _type_name(item), f"has type {_type_name(item)}"
    return "$", _type_name(value), f"has type {_type_name(value)}"  # pragma: no cover


def dump_json(value: Any, what: str) -> str:
    """Encode ``value`` as strict JSON (:func:`strict_json`); the common empty values skip
    the encoder, since every transition rewrites the row."""
    if value is None:
        return "null"
    if not value and isinstance(value, dict | list | tuple):
        return "{}" if isinstance(value, dict) else "[]"
    return strict_json(value, what)


def load_json(value: Any) -> Any:
    """Decode a JSON text column (``None`` stays ``None``)."""
    return None if value is None else json.loads(value)


Decoder = Callable[[Any], Any]
"""Turns a JSON column as the driver returns it into Python data."""


def keep_json(value: Any) -> Any:
    """The decoder for drivers that already decode JSON columns (psycopg's ``jsonb``)."""
    return value


# --- row mapping ----------------------------------------------------------------------------

TASK_COLUMNS: tuple[str, ...] = (
    "id", "kind", "payload", "status", "assigned_to", "attempts", "max_attempts", "result",
    "error", "error_class", "cause", "depends_on", "estimate_s", "resources", "lease",
    "token", "reclaims", "not_before", "created_at", "started_at", "finished_at", "parent",
    "joins",
)
"""The task columns, one per field of :class:`Task`, in declaration order."""


def last_per_task(changes: Sequence[tuple[Task, Event]]) -> list[Task]:
    """The last record of each task in a batch, in first-seen order (one row each)."""
    return list({t.id: t for t, _ in changes}.values())


TASK_ROW_KEYS: tuple[str, ...] = ("run_id", *TASK_COLUMNS)
"""The columns of a task row, in the order of :func:`task_values`."""

_STATUS_TEXT: dict[str, str] = {s.value: s.value for s in Status}
"""A status (a :class:`Status` hashes and compares as its value) -> its plain text."""


def _field_json(value: Any, task: Task, name: str) -> str:
    """:func:`dump_json` of a task's field; the error's wording is built only on failure."""
    if value is None:
        return "null"
    if not value and isinstance(value, dict | list | tuple):
        return "{}" if isinstance(value, dict) else "[]"
    try:
        return _ENCODER.encode(value)
    except (TypeError, ValueError, RecursionError):
        return strict_json(value, f"task {task.id!r} {name}")  # raises UnstorableValue


def task_values(run_id: str, task: Task, null_text: Any = None,
                null_real: Any = None) -> tuple[Any, ...]:
    """The row of ``task`` in run ``run_id`` as a tuple in :data:`TASK_ROW_KEYS` order: JSON
    columns encoded, status as text.

    ``null_text`` and ``null_real`` stand for a missing value of a nullable text column
    (``assigned_to``, ``error``, ``error_class``, ``cause``, ``parent``) and of a nullable
    number column (``lease``, ``not_before`` and the three times): a driver that binds
    ``None`` slowly passes sentinels its statement turns back into NULL.
    """
    payload = task.payload
    status = task.status
    depends_on = task.depends_on
    resources = task.resources
    joins = task.joins
    assigned_to = task.assigned_to
    error = task.error
    error_class = task.error_class
    cause = task.cause
    lease = task.lease
    not_before = task.not_before
    created_at = task.created_at
    started_at = task.started_at
    finished_at = task.finished_at
    parent = task.parent
    return (
        run_id,
        task.id,
        task.kind,
        "{}" if type(payload) is dict and not payload
        else _field_json(dict(payload), task, "payload"),
        _STATUS_TEXT.get(status) or Status(status).value,
        null_text if assigned_to is None else assigned_to,
        task.attempts,
        task.max_attempts,
        _field_json(task.result, task, "result"),
        null_text if error is None else redact(error) if error else error,
        null_text if error_class is None else error_class,
        null_text if cause is None else cause,
        "[]" if depends_on == () else _field_json(list(depends_on), task, "depends_on"),
        task.estimate_s,
        "[]" if resources == () else _field_json(list(resources), task, "resources"),
        null_real if lease is None else lease,
        task.token,
        task.reclaims,
        null_real if not_before is None else not_before,
        null_real if created_at is None else created_at,
        null_real if started_at is None else started_at,
        null_real if finished_at is None else finished_at,
        null_text if parent is None else parent,
        "[]" if joins == () else _field_json(list(joins), task, "joins"),
    )


def decision_row(run_id: str, task: Task | None, task_id: str, approve: bool,
                 note: str | None) -> dict[str, Any]:
    """The arguments of a store's ``record_decision`` update for the stored ``task``.

    Raises:
        UsageError: no such task, not waiting, or already decided.
    """
    from planrun.core.scheduling import decide_record

    if task is None:
        raise UsageError(f"run {run_id!r} has no task {task_id!r}")
    decided = decide_record(task, approve, note)
    return {"run_id": run_id, "id": task.id, "cause": decided.cause,
            "error": redact(note) if note else note, "expect_cause": task.cause}


def decision_lost(task_id: str) -> UsageError:
    """The error of a decision whose row changed between its read and its write."""
    return UsageError(f"task {task_id!r} changed while the decision was written; try again")


def task_from_row(row: Mapping[str, Any], decode: Decoder = load_json) -> Task:
    """Build a task from a row; ``decode`` turns a JSON column into Python data."""
    return Task(
        id=row["id"],
        kind=row["kind"],
        payload=dict(decode(row["payload"]) or {}),
        status=Status(row["status"]),
        assigned_to=row["assigned_to"],
        attempts=row["attempts"],
        max_attempts=row["max_attempts"],
        result=decode(row["result"]),
        error=row["error"],
        error_class=row["error_class"],
        cause=row["cause"],
        depends_on=tuple(decode(row["depends_on"]) or ()),
        estimate_s=row["estimate_s"],
        resources=tuple(decode(row["resources"]) or ()),
        lease=row["lease"],
        token=row["token"],
        reclaims=row["reclaims"],
        not_before=row["not_before"],
        created_at=row["created_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        parent=row["parent"],
        joins=tuple(decode(row["joins"]) or ()),
    )


EVENT_ROW_KEYS: tuple[str, ...] = (
    "run_id", "seq", "at", "task", "event", "worker", "attempt", "detail")
"""The columns of an event row, in the order of :func:`event_values`."""


def event_values(run_id: str, event: Event, seq: int | None = None,
                 null_text: Any = None) -> tuple[Any, ...]:
    """The row of ``event`` as a tuple in :data:`EVENT_ROW_KEYS` order; ``seq`` replaces the
    event's own; ``null_text`` stands for a missing worker (see :func:`task_values`)."""
    detail = event.detail
    worker = event.worker
    return (
        run_id,
        event.seq if seq is None else seq,
        event.at,
        event.task,
        event.event,
        null_text if worker is None else worker,
        event.attempt,
        "{}" if type(detail) is dict and not detail
        else dump_json(_redacted(detail), f"event {event.event!r} detail"),
    )


def row_values(run_id: str, row: EventRow, null_text: Any = None) -> tuple[Any, ...]:
    """:func:`event_values` of an event given as a tuple (:data:`planrun.core._ledger.EventRow`)."""
    detail = row[6]
    worker = row[4]
    return (
        run_id, row[0], row[1], row[2], row[3],
        null_text if worker is None else worker,
        row[5],
        "{}" if not detail else dump_json(_redacted(detail), f"event {row[3]!r} detail"),
    )


def _redacted(detail: Mapping[str, Any]) -> dict[str, Any]:
    """An event's detail with secrets removed from its text values (an error, a reason)."""
    return {k: redact(v) if isinstance(v, str) else v for k, v in detail.items()}


def event_from_row(row: Mapping[str, Any], decode: Decoder = load_json) -> Event:
    """Build an event from a row."""
    return Event(
        seq=row["seq"],
        at=row["at"],
        task=row["task"],
        event=row["event"],
        worker=row["worker"],
        attempt=row["attempt"],
        detail=dict(decode(row["detail"]) or {}),
    )


def run_row(run: RunInfo) -> dict[str, Any]:
    """The row of a run (a new run has no owner: :meth:`Store.acquire_run` sets one)."""
    return {
        "id": run.id,
        "created_at": run.created_at,
        "status": run.status,
        "goal": run.goal,
        "meta": dump_json(dict(run.meta), f"run {run.id!r} meta"),
    }


def run_from_row(row: Mapping[str, Any], decode: Decoder = load_json) -> RunInfo:
    """Build a run from a row."""
    until = row.get("owner_until")
    return RunInfo(
        id=row["id"],
        created_at=row["created_at"],
        status=row["status"],
        goal=row["goal"],
        meta=dict(decode(row["meta"]) or {}),
        owner=row.get("owner"),
        owner_until=None if until is None else float(until),
    )


def owner_from_row(row: Mapping[str, Any] | None) -> RunOwner | None:
    """The owner of a run row (``owner``, ``owner_until``), None when unowned."""
    if row is None or row["owner"] is None or row["owner_until"] is None:
        return None
    return RunOwner(row["owner"], float(row["owner_until"]))


def effect_from_row(row: Mapping[str, Any], decode: Decoder = load_json) -> EffectRecord:
    """Build an effect record from a row."""
    return EffectRecord(
        task_id=row["task_id"],
        key=row["key"],
        state=row["state"],
        result=decode(row["result"]),
        at=row["at"],
    )


def worker_from_row(row: Mapping[str, Any], decode: Decoder = load_json) -> dict[str, Any]:
    """A registered worker as the plain dict :meth:`Store.list_workers` returns."""
    return {
        "name": row["name"],
        "kinds": list(decode(row["kinds"]) or ()),
        "capacity": row["capacity"],
        "last_heartbeat": row["last_heartbeat"],
    }


def summarize(runs: Sequence[RunInfo], counts: Sequence[Mapping[str, Any]]) -> list[RunSummary]:
    """Join runs with ``(run_id, status, n)`` count rows into summaries."""
    by_run: dict[str, dict[str, int]] = {r.id: dict.fromkeys(map(str, Status), 0) for r in runs}
    for row in counts:
        by_run[row["run_id"]][row["status"]] = int(row["n"])
    return [RunSummary(r.id, r.created_at, r.status, r.goal, by_run[r.id], r.owner,
                       r.owner_until) for r in runs]


def unknown_run(run_id: str) -> StoreError:
    """The error for a run the store does not hold (an :class:`UnknownRun`)."""
    return UnknownRun(f"unknown run {run_id!r}")


def check_lease(ttl: float) -> None:
    """Refuse a lease that ends before it starts."""
    if not ttl > 0:
        raise UsageError(f"an owner lease needs a positive ttl, not {ttl!r}")


def newer_schema(url: str, found: int) -> StoreError:
    """The error for a database stamped by a newer planrun."""
    return StoreError(
        f"{url}: schema version {found} is newer than this planrun understands "
        f"({SCHEMA_VERSION}); upgrade planrun"
    )
