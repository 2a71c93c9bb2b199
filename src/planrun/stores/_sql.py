"""The store, written once: every call a transaction of named queries, over a connector.

:class:`SQLStore` implements :class:`~planrun.stores.base.Store` (runs, tasks and their
events, effects, the owner lease, decisions, workers) and
:class:`~planrun.core.SharedLimits` (the rate limiters' and budgets' rows) for any
:class:`~planrun.stores._connector.Connector`: :class:`~planrun.stores.SQLiteStore`,
:class:`~planrun.stores.PostgresStore` and :class:`~planrun.stores.InMemoryStore` are this
class over SQLite, psycopg and SQLite in memory. A call encodes its rows first (a value JSON
cannot hold fails before anything is written), then runs one transaction (see
:mod:`planrun.stores._connector`); what the rows mean is decided here and in
:mod:`planrun.stores.base`, the same for every database.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from planrun.core import (
    Event,
    EventRow,
    LimiterState,
    RunExists,
    RunInUse,
    SpendState,
    StoreError,
    Task,
)
from planrun.stores._connector import (
    EVENT_ROW,
    TASK_ROW,
    Connector,
    Mode,
    Query,
    Result,
    Rows,
    Script,
    Statement,
    Tx,
)
from planrun.stores.base import (
    EVENT_ROW_KEYS,
    SCHEMA_VERSION,
    EffectRecord,
    RunInfo,
    RunOwner,
    RunState,
    RunSummary,
    check_lease,
    decision_lost,
    decision_row,
    dump_json,
    effect_from_row,
    event_from_row,
    event_values,
    last_per_task,
    newer_schema,
    owner_from_row,
    row_values,
    run_from_row,
    run_row,
    summarize,
    task_from_row,
    task_values,
    unknown_run,
    worker_from_row,
)

T = TypeVar("T")

_EVENT_WIDTH = len(EVENT_ROW_KEYS)


def _just(*statements: Statement) -> Tx[Result]:
    """A transaction of ``statements``; the last one's result."""
    result = Result([], 0)
    for statement in statements:
        result = yield statement
    return result


def _require_run(run_id: str) -> Tx[None]:
    if (yield Query("get_run", {"run_id": run_id})).first() is None:
        raise unknown_run(run_id)


def _take_seq(run_id: str) -> Tx[int]:
    """A seq for an event the store makes (numbered after every seq of the run)."""
    row = (yield Query("take_seq", {"run_id": run_id})).first()
    if row is None:
        raise unknown_run(run_id)
    return int(row["seq"])


def _migrate(url: str) -> Tx[None]:
    """Create or migrate the schema to :data:`SCHEMA_VERSION`; refuse a newer one."""
    yield Query("schema_lock")
    yield Query("schema_table")
    row = (yield Query("schema_version")).first()
    found = int(row["version"] or 0) if row else 0
    if found > SCHEMA_VERSION:
        raise newer_schema(url, found)
    for version in range(found + 1, SCHEMA_VERSION + 1):
        yield Script(f"migrate_{version}")
    if found != SCHEMA_VERSION:
        yield Query("clear_version")
        yield Query("stamp_version", {"version": SCHEMA_VERSION})


class SQLStore:
    """The store over ``connector``: every method one transaction (see the module)."""

    def __init__(self, connector: Connector) -> None:
        self.connector = connector
        self.url = connector.url
        """Where the store lives, with any password masked."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    async def _run(self, tx: Callable[[], Tx[T]], mode: Mode = "write") -> T:
        return await self.connector.run(tx, mode)

    async def _one(self, query: Query, mode: Mode = "single") -> Result:
        """Run one statement on its own."""
        return await self.connector.run(lambda: _just(query), mode)

    def _task_values(self, run_id: str, tasks: Iterable[Task]) -> list[Any]:
        """The rows of ``tasks``, flat (see :class:`~planrun.stores._connector.Rows`)."""
        null_text, null_real = self.connector.null_text, self.connector.null_real
        values: list[Any] = []
        for task in tasks:
            values += task_values(run_id, task, null_text, null_real)
        return values

    def _event_values(self, run_id: str, events: Iterable[Event],
                      seq: int | None = None) -> list[Any]:
        """The rows of ``events``, flat; ``seq`` replaces the seq of each."""
        null_text = self.connector.null_text
        values: list[Any] = []
        for event in events:
            values += event_values(run_id, event, seq, null_text)
        return values

    # --- lifecycle --------------------------------------------------------------------------

    async def open(self) -> None:
        """Connect, then create or migrate the schema; refuse a schema newer than this code."""
        await self.connector.open(self._migrate)

    def _migrate(self) -> Tx[None]:
        return _migrate(self.url)

    async def close(self) -> None:
        """Release connections; calling it twice is harmless."""
        await self.connector.close()

    # --- runs and their owner -------------------------------------------------------------

    async def create_run(self, run: RunInfo) -> None:
        """Insert a run; an existing id is :class:`~planrun.core.RunExists`."""
        if (await self._one(Query("create_run", run_row(run)))).rowcount == 0:
            raise RunExists(run.id, self.url)

    async def set_run_status(self, run_id: str, status: str) -> None:
        """Change a run's status."""
        query = Query("set_run_status", {"run_id": run_id, "status": status})
        if (await self._one(query)).rowcount == 0:
            raise unknown_run(run_id)

    async def acquire_run(self, run_id: str, owner: str, ttl: float, now: float, *,
                          take_from: str | None = None) -> None:
        """Own the run until ``now + ttl`` unless another owner's lease holds (RunInUse)."""
        check_lease(ttl)
        args = {"run_id": run_id, "owner": owner, "until": now + ttl, "now": now,
                "take_from": take_from}

        def tx() -> Tx[RunOwner | None]:
            if (yield Query("acquire_run", args)).rowcount == 1:
                return None
            row = (yield Query("get_owner", args)).first()
            if row is None:
                raise unknown_run(run_id)
            return owner_from_row(row)

        holder = await self._run(tx)
        if holder is not None:
            raise RunInUse(run_id, holder.name, holder.until, now)

    async def renew_run(self, run_id: str, owner: str, ttl: float, now: float) -> bool:
        """Extend ``owner``'s lease; False when another owner holds the run."""
        check_lease(ttl)
        args = {"run_id": run_id, "owner": owner, "until": now + ttl}

        def tx() -> Tx[bool]:
            if (yield Query("renew_run", args)).rowcount == 1:
                return True
            yield from _require_run(run_id)
            return False

        return await self._run(tx)

    async def release_run(self, run_id: str, owner: str) -> None:
        """Give up ``owner``'s lease (nothing changes when another holds it)."""

        def tx() -> Tx[None]:
            yield from _require_run(run_id)
            yield Query("release_run", {"run_id": run_id, "owner": owner})

        await self._run(tx)

    async def run_owner(self, run_id: str) -> RunOwner | None:
        """The stored owner and lease end, or None."""
        row = (await self._one(Query("get_owner", {"run_id": run_id}))).first()
        if row is None:
            raise unknown_run(run_id)
        return owner_from_row(row)

    # --- reads ------------------------------------------------------------------------------

    async def load(self, run_id: str) -> RunState:
        """Everything about one run, read in one snapshot."""
        return await self._read(run_id, events=True)

    async def load_tasks(self, run_id: str) -> RunState:
        """The run, its tasks and effects without the ledger (a cheap poll)."""
        return await self._read(run_id, events=False)

    async def _read(self, run_id: str, events: bool) -> RunState:
        decode = self.connector.decode
        args = {"run_id": run_id}

        def tx() -> Tx[RunState]:
            run = (yield Query("get_run", args)).first()
            if run is None:
                raise unknown_run(run_id)
            tasks = (yield Query("get_tasks", args)).rows
            ledger = (yield Query("get_events", args)).rows if events else []
            effects = (yield Query("get_effects", args)).rows
            return RunState(
                run_from_row(run, decode), [task_from_row(r, decode) for r in tasks],
                [event_from_row(r, decode) for r in ledger],
                {r["task_id"]: effect_from_row(r, decode) for r in effects})

        return await self._run(tx, "read")

    async def load_some(self, run_id: str, ids: Sequence[str]) -> list[Task]:
        """The tasks of ``ids`` that exist, in task order."""
        decode = self.connector.decode

        def tx() -> Tx[list[Task]]:
            yield from _require_run(run_id)
            got = yield Query("get_tasks_by_ids", {"run_id": run_id, "ids": list(ids)})
            return [task_from_row(r, decode) for r in got.rows]

        return await self._run(tx, "read")

    async def list_runs(self) -> list[RunSummary]:
        """Every run, oldest first, with its task counts."""
        decode = self.connector.decode

        def tx() -> Tx[list[RunSummary]]:
            runs = (yield Query("list_runs")).rows
            counts = (yield Query("count_tasks")).rows
            return summarize([run_from_row(r, decode) for r in runs], counts)

        return await self._run(tx, "read")

    # --- tasks and events -------------------------------------------------------------------

    async def add_tasks(self, run_id: str, tasks: Sequence[Task], events: Sequence[Event]) -> None:
        """Insert new task rows and their events in one transaction."""
        await self._write_rows(run_id, "insert_tasks", self._task_values(run_id, tasks),
                               self._event_values(run_id, events))

    async def write(self, run_id: str, changes: Sequence[tuple[Task, Event]]) -> None:
        """Upsert every task row and append every event, all or nothing."""
        if not changes:
            return
        # A task changed several times in one batch needs only its last row written.
        await self._write_rows(run_id, "upsert_tasks",
                               self._task_values(run_id, last_per_task(changes)),
                               self._event_values(run_id, (e for _, e in changes)))

    async def write_batch(self, run_id: str, tasks: Sequence[Task],
                          events: Sequence[EventRow]) -> None:
        """Upsert every row of ``tasks`` and append every event, all or nothing."""
        if not events and not tasks:
            return
        null_text = self.connector.null_text
        event_rows: list[Any] = []
        for row in events:
            event_rows += row_values(run_id, row, null_text)
        await self._write_rows(run_id, "upsert_tasks", self._task_values(run_id, tasks),
                               event_rows)

    async def _write_rows(self, run_id: str, tasks_query: str, tasks: list[Any],
                          events: list[Any]) -> None:
        """Write task rows with ``tasks_query`` (insert or upsert) and append event rows, in
        one transaction that keeps the run's seq counter past them."""

        def tx() -> Tx[None]:
            yield from _require_run(run_id)
            if tasks:
                yield Rows(tasks_query, TASK_ROW, tasks)
            if events:
                yield Rows("insert_events", EVENT_ROW, events)
                after = max(events[1::_EVENT_WIDTH]) + 1
                yield Query("raise_next_seq", {"run_id": run_id, "after": after})

        await self._run(tx)

    async def append_event(self, run_id: str, event: Event) -> None:
        """Append one event that changes no task row, numbered by the store."""
        values = self._event_values(run_id, [event])

        def tx() -> Tx[None]:
            row = list(values)
            row[1] = yield from _take_seq(run_id)
            yield Rows("insert_events", EVENT_ROW, row)

        await self._run(tx)

    async def record_decision(self, run_id: str, task_id: str, approve: bool,
                              note: str | None) -> Task:
        """Write a person's decision on a waiting row (see :meth:`Store.record_decision`)."""
        decode = self.connector.decode
        args = {"run_id": run_id, "ids": [task_id]}

        def stored() -> Tx[Task | None]:
            rows = (yield Query("get_tasks_by_ids", args)).rows
            return task_from_row(rows[0], decode) if rows else None

        def tx() -> Tx[Task]:
            yield from _require_run(run_id)
            found = yield from stored()
            update = decision_row(run_id, found, task_id, approve, note)
            if (yield Query("record_decision", update)).rowcount == 0:
                # Decided meanwhile: say how, as a later call would.
                decision_row(run_id, (yield from stored()), task_id, approve, note)
                raise decision_lost(task_id)
            decided = yield from stored()
            assert decided is not None  # the update found it
            return decided

        return await self._run(tx)

    # --- effects ----------------------------------------------------------------------------

    async def effect_begin(self, run_id: str, task_id: str, key: str, at: float) -> EffectRecord:
        """Insert a ``started`` effect unless one exists; return the stored record."""
        args = {"run_id": run_id, "task_id": task_id, "key": key, "at": at}

        def tx() -> Tx[EffectRecord]:
            yield from _require_run(run_id)
            yield Query("effect_begin", args)
            row = (yield Query("get_effect", args)).first()
            if row is None:  # only if the run was deleted in between
                raise unknown_run(run_id)
            return effect_from_row(row, self.connector.decode)

        return await self._run(tx)

    async def effect_done(
        self, run_id: str, task_id: str, result: Any, at: float, event: Event | None = None
    ) -> bool:
        """Mark a begun effect applied, with its event; an applied one stays as it is."""
        args = {"run_id": run_id, "task_id": task_id, "at": at,
                "result": dump_json(result, f"effect result of task {task_id!r}")}
        values = [] if event is None else self._event_values(run_id, [event])

        def tx() -> Tx[bool]:
            if (yield Query("effect_done", args)).rowcount == 0:
                if (yield Query("get_effect", args)).first() is None:
                    raise StoreError(f"no effect begun for task {task_id!r} of run {run_id!r}")
                return False
            if values:
                row = list(values)
                if row[1] < 0:
                    row[1] = yield from _take_seq(run_id)
                else:  # numbered by the caller
                    yield Query("raise_next_seq", {"run_id": run_id, "after": row[1] + 1})
                yield Rows("insert_events", EVENT_ROW, row)
            return True

        return await self._run(tx)

    # --- workers ----------------------------------------------------------------------------

    async def register_worker(
        self, run_id: str, name: str, kinds: Sequence[str], capacity: int, at: float
    ) -> None:
        """Register (or re-register) a worker for a run."""
        args = {"run_id": run_id, "name": name, "capacity": capacity, "at": at,
                "kinds": dump_json(list(kinds), f"kinds of worker {name!r}")}

        def tx() -> Tx[None]:
            yield from _require_run(run_id)
            yield Query("register_worker", args)

        await self._run(tx)

    async def heartbeat_worker(self, run_id: str, name: str, at: float) -> None:
        """Record that a registered worker is alive; an unknown worker is a StoreError."""
        query = Query("heartbeat_worker", {"run_id": run_id, "name": name, "at": at})
        if (await self._one(query)).rowcount == 0:
            raise StoreError(f"unknown worker {name!r} in run {run_id!r}")

    async def list_workers(self, run_id: str) -> list[dict[str, Any]]:
        """Registered workers, by name: ``name``, ``kinds``, ``capacity``, ``last_heartbeat``."""
        rows = (await self._one(Query("list_workers", {"run_id": run_id}))).rows
        return [worker_from_row(r, self.connector.decode) for r in rows]

    # --- limits shared by every process (planrun.core.SharedLimits) -----------------------
    # Time is the database's clock (see each dialect's "now"), read as each statement runs.

    async def limiter_configure(
        self, key: str, rpm: float | None, tpm: float | None, request_burst: float,
        token_burst: float, *, learned: bool = False,
    ) -> None:
        """Create the limiter row of ``key``, or set its rates (what it spent is kept);
        configured rates never replace the provider's (``learned``)."""
        await self._one(Query("limiter_configure", {
            "key": key, "rpm": rpm, "tpm": tpm, "request_burst": float(request_burst),
            "token_burst": float(token_burst), "learned": learned}))

    async def limiter_take(self, key: str, tokens: float) -> float:
        """Take one request and ``tokens`` if allowed now (0), else the seconds to wait."""
        args = {"key": key, "tokens": float(tokens)}

        def tx() -> Tx[float]:
            if (yield Query("limiter_take", args)).rowcount:
                return 0.0
            row = (yield Query("limiter_wait", args)).first()
            if row is None:
                raise StoreError(f"no limiter {key!r} (call limiter_configure first)")
            return max(1e-6, float(row["wait"]))

        return await self._run(tx, "single")

    async def limiter_give(self, key: str, tokens: float) -> None:
        """Give ``tokens`` back to the token bucket (negative: take more)."""
        await self._one(Query("limiter_give", {"key": key, "tokens": float(tokens)}))

    async def limiter_defer(self, key: str, requests: float | None,
                            tokens: float | None) -> None:
        """Each bucket full again no sooner than the given seconds from now."""
        await self._one(Query("limiter_defer",
                              {"key": key, "requests": requests, "tokens": tokens}))

    async def limiter_pause(self, key: str, seconds: float) -> None:
        """Nobody takes anything from ``key`` for ``seconds``."""
        await self._one(Query("limiter_pause", {"key": key, "seconds": float(seconds)}))

    async def limiter_state(self, key: str) -> LimiterState | None:
        """The limiter row of ``key``."""
        row = (await self._one(Query("limiter_state", {"key": key}))).first()
        return None if row is None else _limiter_state(row)

    async def spend_open(self, run_id: str, max_tokens: int | None,
                         max_cost: float | None) -> None:
        """Create the spend row of a run (a limit given replaces the stored one)."""
        await self._one(Query("spend_open", {"run_id": run_id, "max_tokens": max_tokens,
                                             "max_cost": max_cost}))

    async def spend_reserve(self, run_id: str, tokens: int, cost: float) -> SpendState | None:
        """Hold back ``tokens`` and ``cost`` if they fit (None), else the refusing row."""
        args = {"run_id": run_id, "tokens": int(tokens), "cost": float(cost)}

        def tx() -> Tx[SpendState | None]:
            if (yield Query("spend_reserve", args)).rowcount:
                return None
            row = (yield Query("spend_get", args)).first()
            if row is None:
                raise StoreError(f"run {run_id!r} has no spend row (call spend_open first)")
            return _spend_state(row)

        return await self._run(tx)

    async def spend_settle(
        self, run_id: str, reserved_tokens: int, reserved_cost: float, requests: int,
        prompt_tokens: int, cached_tokens: int, completion_tokens: int, cost_usd: float,
    ) -> None:
        """Give a reservation back and add what the request really used."""
        await self._one(Query("spend_settle", {
            "run_id": run_id, "reserved_tokens": int(reserved_tokens),
            "reserved_cost": float(reserved_cost), "requests": int(requests),
            "prompt_tokens": int(prompt_tokens), "cached_tokens": int(cached_tokens),
            "completion_tokens": int(completion_tokens), "cost_usd": float(cost_usd)}))

    async def spend_release_all(self, run_id: str) -> None:
        """Drop every reservation of a run."""
        await self._one(Query("spend_release_all", {"run_id": run_id}))

    async def spend(self, run_id: str) -> SpendState | None:
        """The spend row of a run."""
        row = (await self._one(Query("spend_get", {"run_id": run_id}))).first()
        return None if row is None else _spend_state(row)


def _limiter_state(row: dict[str, Any]) -> LimiterState:
    """A :class:`LimiterState` from a ``planrun_limits`` row read with its ``now``."""
    now = float(row["now"])
    minute = int(now // 60)
    count, prev = int(row["minute_count"]), int(row["prev_count"])
    if int(row["minute"]) == minute - 1:
        count, prev = 0, count
    elif int(row["minute"]) != minute:
        count, prev = 0, 0
    recent = count + prev * (1.0 - (now / 60 - minute))
    tpm = None if row["tpm"] is None else float(row["tpm"])
    tokens = None
    if tpm is not None:
        owed = max(0.0, float(row["tokens_full_at"]) - now) * tpm / 60
        tokens = float(row["token_burst"]) - owed
    return LimiterState(
        key=row["key"], rpm=None if row["rpm"] is None else float(row["rpm"]), tpm=tpm,
        request_burst=float(row["request_burst"]), token_burst=float(row["token_burst"]),
        acquired=int(row["acquired"]), penalties=int(row["penalties"]),
        paused_for=max(0.0, float(row["paused_until"]) - now), recent_rpm=round(recent, 3),
        tokens_available=tokens, learned=bool(row["learned"]),
    )


def _spend_state(row: dict[str, Any]) -> SpendState:
    """A :class:`SpendState` from a ``planrun_spend`` row."""
    return SpendState(
        run_id=row["run_id"],
        max_tokens=None if row["max_tokens"] is None else int(row["max_tokens"]),
        max_cost=None if row["max_cost"] is None else float(row["max_cost"]),
        requests=int(row["requests"]), prompt_tokens=int(row["prompt_tokens"]),
        cached_tokens=int(row["cached_tokens"]),
        completion_tokens=int(row["completion_tokens"]), cost_usd=float(row["cost_usd"]),
        reserved_tokens=int(row["reserved_tokens"]), reserved_cost=float(row["reserved_cost"]),
    )
