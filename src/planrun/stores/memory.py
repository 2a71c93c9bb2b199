"""The in-memory store: the same interface over dicts, for tests and simulation.

It keeps the same rows the SQL stores keep (JSON columns encoded), so a value that could
not be stored in a database fails here too, and a record read back is a copy, never the
caller's object. Every call is recorded in :attr:`InMemoryStore.calls`, the way
procrastinate's ``InMemoryConnector`` records its queries, so a test can assert on what the
supervisor asked of its store. Nothing awaits inside a call, so each is atomic on its loop.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from planrun.core import (
    FINAL,
    Event,
    EventRow,
    RunInUse,
    Status,
    StoreError,
    Task,
    as_event,
    transition,
)
from planrun.stores.base import (
    EFFECT_APPLIED,
    EFFECT_STARTED,
    Added,
    EffectRecord,
    LimiterState,
    RunInfo,
    RunOwner,
    RunState,
    RunSummary,
    SpendState,
    Waiters,
    WidenConflict,
    added_events,
    check_lease,
    decision_row,
    dump_json,
    effect_from_row,
    event_from_row,
    event_row,
    limiter_from_row,
    run_from_row,
    run_row,
    spend_from_row,
    started_event,
    summarize,
    task_from_row,
    task_row,
    unknown_run,
    worker_from_row,
)

__all__ = ["Call", "InMemoryStore"]

Row = dict[str, Any]
Call = tuple[str, dict[str, Any]]
"""A recorded call: the method name and its arguments by name."""

_FINAL = frozenset(s.value for s in FINAL)
_IN_FLIGHT = frozenset({Status.ASSIGNED.value, Status.RUNNING.value})
_NOT_NULL_TASK = ("id", "kind", "status", "payload", "depends_on", "resources")


@dataclass
class _Run:
    row: Row
    tasks: dict[str, Row] = field(default_factory=dict)
    events: list[Row] = field(default_factory=list)
    effects: dict[str, Row] = field(default_factory=dict)
    workers: dict[str, Row] = field(default_factory=dict)
    next_seq: int = 0
    seqs: set[int] = field(default_factory=set)


def _checked(row: Row) -> Row:
    """Refuse what a database's NOT NULL columns would refuse."""
    missing = [c for c in _NOT_NULL_TASK if row[c] is None]
    if missing:
        raise StoreError(f"task {row['id']!r}: NOT NULL violated for {', '.join(missing)}")
    return row


class InMemoryStore:
    """A :class:`~planrun.stores.base.Store` over dicts; nothing survives the process."""

    url = "memory://"

    def __init__(self) -> None:
        self.calls: list[Call] = []
        """Every call so far, oldest first."""
        self._runs: dict[str, _Run] = {}
        self._limits: dict[str, Row] = {}
        self._spend: dict[str, Row] = {}
        self._waiters = Waiters()
        self._open = False

    def __repr__(self) -> str:
        return "InMemoryStore()"

    def calls_to(self, name: str) -> list[dict[str, Any]]:
        """The arguments of every recorded call to method ``name``."""
        return [args for called, args in self.calls if called == name]

    def _record(self, method: str, /, **args: Any) -> None:
        self.calls.append((method, args))

    def _run(self, run_id: str) -> _Run:
        try:
            return self._runs[run_id]
        except KeyError:
            raise unknown_run(run_id) from None

    def _changed(self, run_id: str) -> None:
        self._waiters.notify(run_id)

    # --- lifecycle --------------------------------------------------------------------------

    async def open(self) -> None:
        """Nothing to connect to."""
        self._record("open")
        self._open = True

    async def close(self) -> None:
        """Nothing to release; the data stays until the object goes."""
        self._record("close")
        self._open = False

    # --- runs -------------------------------------------------------------------------------

    async def create_run(self, run: RunInfo) -> None:
        """Insert a run; an existing id is a StoreError."""
        self._record("create_run", run=run)
        row = run_row(run) | {"owner": None, "owner_until": None}
        if run.id in self._runs:
            raise StoreError(f"run {run.id!r} already exists")
        self._runs[run.id] = _Run(row)
        self._changed(run.id)

    async def set_run_status(self, run_id: str, status: str) -> None:
        """Change a run's status."""
        self._record("set_run_status", run_id=run_id, status=status)
        self._run(run_id).row["status"] = status
        self._changed(run_id)

    async def acquire_run(self, run_id: str, owner: str, ttl: float, now: float, *,
                          take_from: str | None = None) -> None:
        """Own the run until ``now + ttl`` unless another owner's lease holds (RunInUse)."""
        self._record("acquire_run", run_id=run_id, owner=owner, ttl=ttl, now=now)
        check_lease(ttl)
        row = self._run(run_id).row
        held, until = row["owner"], row["owner_until"]
        if (held is not None and held not in (owner, take_from) and until is not None
                and until >= now):
            raise RunInUse(run_id, held, until, now)
        row.update(owner=owner, owner_until=now + ttl)

    async def renew_run(self, run_id: str, owner: str, ttl: float, now: float) -> bool:
        """Extend ``owner``'s lease; False when another owner holds the run."""
        self._record("renew_run", run_id=run_id, owner=owner, ttl=ttl, now=now)
        check_lease(ttl)
        row = self._run(run_id).row
        if row["owner"] != owner:
            return False
        row["owner_until"] = now + ttl
        return True

    async def release_run(self, run_id: str, owner: str) -> None:
        """Give up ``owner``'s lease (nothing changes when another holds it)."""
        self._record("release_run", run_id=run_id, owner=owner)
        row = self._run(run_id).row
        if row["owner"] == owner:
            row.update(owner=None, owner_until=None)
        self._changed(run_id)

    async def run_owner(self, run_id: str) -> RunOwner | None:
        """The stored owner and lease end, or None."""
        self._record("run_owner", run_id=run_id)
        row = self._run(run_id).row
        if row["owner"] is None or row["owner_until"] is None:
            return None
        return RunOwner(row["owner"], row["owner_until"])

    async def load(self, run_id: str) -> RunState:
        """Everything about one run (copies)."""
        self._record("load", run_id=run_id)
        run = self._run(run_id)
        return RunState(
            run=run_from_row(run.row),
            tasks=[task_from_row(r) for r in run.tasks.values()],
            events=[event_from_row(r) for r in sorted(run.events, key=lambda r: r["seq"])],
            effects={k: effect_from_row(r) for k, r in sorted(run.effects.items())},
        )

    async def load_tasks(self, run_id: str) -> RunState:
        """The run, its tasks and effects without the ledger (a coordinator's poll)."""
        state = await self.load(run_id)
        return RunState(state.run, state.tasks, [], state.effects)

    async def load_some(self, run_id: str, ids: Sequence[str]) -> list[Task]:
        """The tasks of ``ids`` that exist, in task order."""
        self._record("load_some", run_id=run_id, ids=list(ids))
        wanted = set(ids)
        return [task_from_row(r) for r in self._run(run_id).tasks.values() if r["id"] in wanted]

    async def load_changed(self, run_id: str, after: int) -> tuple[list[Task], int]:
        """Tasks named by events after ``after``, and the last seq read."""
        self._record("load_changed", run_id=run_id, after=after)
        run = self._run(run_id)
        named = {e["task"] for e in run.events if e["seq"] > after}
        if not named:
            return [], after
        last = max(e["seq"] for e in run.events if e["seq"] > after)
        return [task_from_row(r) for r in run.tasks.values() if r["id"] in named], last

    async def list_runs(self) -> list[RunSummary]:
        """Every run, oldest first, with its task counts."""
        self._record("list_runs")
        runs = sorted(
            (run_from_row(r.row) for r in self._runs.values()),
            key=lambda r: (r.created_at, r.id),
        )
        counts: dict[tuple[str, str], int] = {}
        for run_id, run in self._runs.items():
            for row in run.tasks.values():
                key = (run_id, row["status"])
                counts[key] = counts.get(key, 0) + 1
        rows = [{"run_id": r, "status": s, "n": n} for (r, s), n in counts.items()]
        return summarize(runs, rows)

    # --- tasks and events -------------------------------------------------------------------

    def _append(self, run: _Run, events: Sequence[Row]) -> None:
        """Append events; one already stored under its seq is kept as it is (as the
        databases' unique ``(run, seq)`` does)."""
        for event in events:
            if event["seq"] not in run.seqs:
                run.seqs.add(event["seq"])
                run.events.append(event)
        if events:
            run.next_seq = max(run.next_seq, max(e["seq"] for e in events) + 1)

    async def add_tasks(self, run_id: str, tasks: Sequence[Task], events: Sequence[Event]) -> None:
        """Insert new task rows and their events, all or nothing."""
        self._record("add_tasks", run_id=run_id, tasks=list(tasks), events=list(events))
        run = self._run(run_id)
        rows = [_checked(task_row(run_id, t)) for t in tasks]
        event_rows = [event_row(run_id, e) for e in events]
        ids = [r["id"] for r in rows]
        duplicate = next((i for i in ids if i in run.tasks), None)
        if duplicate is None and len(set(ids)) != len(ids):
            duplicate = next(i for i in ids if ids.count(i) > 1)
        if duplicate is not None:
            raise StoreError(f"task {duplicate!r} already exists in run {run_id!r}")
        run.tasks.update((r["id"], r) for r in rows)
        self._append(run, event_rows)
        self._changed(run_id)

    async def write(self, run_id: str, changes: Sequence[tuple[Task, Event]]) -> None:
        """Upsert every task row and append every event, all or nothing."""
        self._record("write", run_id=run_id, changes=list(changes))
        if not changes:
            return
        run = self._run(run_id)
        rows = [_checked(task_row(run_id, t)) for t, _ in changes]
        event_rows = [event_row(run_id, e) for _, e in changes]
        for row in rows:
            run.tasks[row["id"]] = row
        self._append(run, event_rows)
        self._changed(run_id)

    async def write_batch(self, run_id: str, tasks: Sequence[Task],
                          events: Sequence[EventRow]) -> None:
        """:meth:`write` of the same changes: each event with its task's record."""
        by_id = {t.id: t for t in tasks}
        await self.write(run_id, [(by_id[r[2]], as_event(r)) for r in events])

    async def write_fenced(
        self, run_id: str, task: Task, event: Event, expect_token: int,
        added: Added = (), widened: Sequence[tuple[Task, Event]] = (),
    ) -> bool:
        """Apply one change only over ``expect_token`` and an unfinished row (with what it
        added and widened, all or nothing)."""
        self._record(
            "write_fenced", run_id=run_id, task=task, event=event, expect_token=expect_token
        )
        row = _checked(task_row(run_id, task))
        run = self._runs.get(run_id)
        stored = run.tasks.get(task.id) if run is not None else None
        if run is None or stored is None:
            return False
        if stored["token"] != expect_token or stored["status"] in _FINAL:
            return False
        self._grow(run, run_id, event, added, widened, row)
        return True

    async def write_added(
        self, run_id: str, event: Event, added: Added,
        widened: Sequence[tuple[Task, Event]] = (),
    ) -> None:
        """Append ``event`` with what it added and widened, all or nothing."""
        self._record("write_added", run_id=run_id, event=event, added=list(added))
        self._grow(self._run(run_id), run_id, event, added, widened)

    def _grow(self, run: Any, run_id: str, event: Event, added: Added,
              widened: Sequence[tuple[Task, Event]], row: Row | None = None) -> None:
        """Check, then apply all at once: the fenced ``row`` (if any), the widened joiners,
        the added rows, and ``event`` with theirs, numbered in order."""
        new_rows = [_checked(task_row(run_id, t)) for t, _ in added]
        duplicate = next((r["id"] for r in new_rows if r["id"] in run.tasks), None)
        if duplicate is not None:
            raise StoreError(f"task {duplicate!r} already exists in run {run_id!r}")
        events = [event_row(run_id, event, run.next_seq)]
        wide: list[Row] = []
        for other, other_event in widened:
            held = run.tasks.get(other.id)
            if held is None or held["status"] in _FINAL:
                continue
            if held["token"] != other.token - 1:
                raise WidenConflict(f"task {other.id!r} changed since it was read")
            wide.append(_checked(task_row(run_id, other)))
            events.append(event_row(run_id, other_event, run.next_seq + len(events)))
        for new_row in ([] if row is None else [row]) + wide + new_rows:
            run.tasks[new_row["id"]] = new_row
        for new_event in added_events(added):
            events.append(event_row(run_id, new_event, run.next_seq + len(events)))
        self._append(run, events)
        self._changed(run_id)

    async def record_decision(self, run_id: str, task_id: str, approve: bool,
                              note: str | None) -> Task:
        """Write a person's decision on a waiting row (see :meth:`Store.record_decision`)."""
        self._record("record_decision", run_id=run_id, task_id=task_id, approve=approve,
                     note=note)
        run = self._run(run_id)
        stored = run.tasks.get(task_id)
        args = decision_row(run_id, None if stored is None else task_from_row(stored), task_id,
                            approve, note)
        assert stored is not None  # decision_row refused an unknown task
        run.tasks[task_id] = {**stored, "cause": args["cause"], "error": args["error"]}
        return task_from_row(run.tasks[task_id])

    async def append_event(self, run_id: str, event: Event) -> None:
        """Append one event that changes no row, numbered by the store."""
        self._record("append_event", run_id=run_id, event=event)
        run = self._run(run_id)
        self._append(run, [event_row(run_id, event, run.next_seq)])
        self._changed(run_id)

    # --- effects ----------------------------------------------------------------------------

    async def effect_begin(self, run_id: str, task_id: str, key: str, at: float) -> EffectRecord:
        """Insert a ``started`` effect unless one exists; return the stored record."""
        self._record("effect_begin", run_id=run_id, task_id=task_id, key=key, at=at)
        effects = self._run(run_id).effects
        row = effects.setdefault(
            task_id,
            {"task_id": task_id, "key": key, "state": EFFECT_STARTED, "result": "null",
             "at": at},
        )
        return effect_from_row(row)

    async def effect_done(
        self, run_id: str, task_id: str, result: Any, at: float, event: Event | None = None
    ) -> bool:
        """Mark a begun effect applied (with its event); an applied one stays as it is."""
        self._record("effect_done", run_id=run_id, task_id=task_id, result=result, at=at,
                     event=event)
        encoded = dump_json(result, f"effect result of task {task_id!r}")
        rows = [] if event is None else [event_row(run_id, event)]  # encode before any change
        run = self._runs.get(run_id)
        row = run.effects.get(task_id) if run is not None else None
        if run is None or row is None:
            raise StoreError(f"no effect begun for task {task_id!r} of run {run_id!r}")
        if row["state"] != EFFECT_STARTED:
            return False
        row.update(state=EFFECT_APPLIED, result=encoded, at=at)
        if rows:
            if event is not None and event.seq < 0:
                rows[0]["seq"] = run.next_seq
            self._append(run, rows)
            self._changed(run_id)
        return True

    # --- workers and distribution -----------------------------------------------------------

    async def register_worker(
        self, run_id: str, name: str, kinds: Sequence[str], capacity: int, at: float
    ) -> None:
        """Register (or re-register) a worker for a run."""
        self._record(
            "register_worker", run_id=run_id, name=name, kinds=list(kinds),
            capacity=capacity, at=at,
        )
        run = self._run(run_id)
        run.workers[name] = {
            "name": name,
            "kinds": dump_json(list(kinds), f"kinds of worker {name!r}"),
            "capacity": capacity,
            "last_heartbeat": at,
        }
        self._changed(run_id)

    async def heartbeat_worker(self, run_id: str, name: str, at: float) -> None:
        """Record that a registered worker is alive; an unknown worker is a StoreError."""
        self._record("heartbeat_worker", run_id=run_id, name=name, at=at)
        run = self._runs.get(run_id)
        row = run.workers.get(name) if run is not None else None
        if row is None:
            raise StoreError(f"unknown worker {name!r} in run {run_id!r}")
        row["last_heartbeat"] = max(row["last_heartbeat"], at)

    async def list_workers(self, run_id: str) -> list[dict[str, Any]]:
        """Registered workers with their in-flight task counts (``active``)."""
        self._record("list_workers", run_id=run_id)
        run = self._runs.get(run_id)
        if run is None:
            return []
        out = []
        for name in sorted(run.workers):
            active = sum(
                1 for t in run.tasks.values()
                if t["assigned_to"] == name and t["status"] in _IN_FLIGHT
            )
            out.append(worker_from_row(run.workers[name] | {"active": active}))
        return out

    def _ready(self, run: _Run, row: Row, kinds: Sequence[str], now: float) -> bool:
        if row["status"] != Status.PENDING.value or row["kind"] not in kinds:
            return False
        if row["not_before"] is not None and row["not_before"] > now:
            return False
        deps = json.loads(row["depends_on"])
        return all(
            d in run.tasks and run.tasks[d]["status"] == Status.COMPLETED.value for d in deps
        )

    def _start(
        self, run: _Run, rows: list[Row], now: float, lease: float, claimer: str | None
    ) -> list[Task]:
        """Move ``rows`` to running; a claimer (pull mode) takes them with a new token."""
        tasks = []
        for row in rows:
            changes: dict[str, Any] = {"started_at": now, "lease": lease}
            if claimer is not None:
                changes.update(assigned_to=claimer, token=row["token"] + 1)
            task = transition(task_from_row(row), Status.RUNNING, **changes)
            row.update(task_row(row["run_id"], task))
            self._append(run, [event_row(row["run_id"], started_event(task, now, run.next_seq))])
            tasks.append(task)
        return tasks

    async def claim(
        self,
        run_id: str,
        worker: str,
        kinds: Sequence[str],
        now: float | None,
        lease_s: float,
        limit: int = 1,
    ) -> list[Task]:
        """Move up to ``limit`` ready tasks to running on ``worker`` (pull mode)."""
        now = time.time() if now is None else now
        self._record(
            "claim", run_id=run_id, worker=worker, kinds=list(kinds), now=now,
            lease_s=lease_s, limit=limit,
        )
        run = self._runs.get(run_id)
        if run is None or limit < 1:
            return []
        rows = [r for r in run.tasks.values() if self._ready(run, r, kinds, now)][:limit]
        tasks = self._start(run, rows, now, now + lease_s, worker)
        if tasks:
            self._changed(run_id)
        return tasks

    async def take_assigned(
        self, run_id: str, worker: str, now: float | None, lease_s: float, limit: int = 1
    ) -> list[Task]:
        """Move tasks assigned to ``worker`` to running (push mode)."""
        now = time.time() if now is None else now
        self._record(
            "take_assigned", run_id=run_id, worker=worker, now=now, lease_s=lease_s, limit=limit
        )
        run = self._runs.get(run_id)
        if run is None or limit < 1:
            return []
        rows = [
            r for r in run.tasks.values()
            if r["status"] == Status.ASSIGNED.value and r["assigned_to"] == worker
        ][:limit]
        tasks = self._start(run, rows, now, now + lease_s, None)
        if tasks:
            self._changed(run_id)
        return tasks

    async def renew(self, run_id: str, task_id: str, token: int, lease: float) -> bool:
        """Extend a lease; False when the token is stale or the task is not in flight."""
        self._record("renew", run_id=run_id, task_id=task_id, token=token, lease=lease)
        run = self._runs.get(run_id)
        row = run.tasks.get(task_id) if run is not None else None
        if row is None or row["token"] != token or row["status"] not in _IN_FLIGHT:
            return False
        row["lease"] = lease
        return True

    async def expired(self, run_id: str, now: float) -> list[Task]:
        """Assigned or running tasks whose lease is before ``now``."""
        self._record("expired", run_id=run_id, now=now)
        run = self._runs.get(run_id)
        if run is None:
            return []
        return [
            task_from_row(r) for r in run.tasks.values()
            if r["status"] in _IN_FLIGHT and r["lease"] is not None and r["lease"] < now
        ]

    async def wait_for_change(self, run_id: str, timeout: float) -> None:
        """Wait until this store changes the run, or ``timeout`` seconds."""
        self._record("wait_for_change", run_id=run_id, timeout=timeout)
        await self._waiters.wait(run_id, timeout)

    # --- limits shared by every process (the same rules as the SQL stores) ----------------

    async def limiter_configure(
        self, key: str, rpm: float | None, tpm: float | None, request_burst: float,
        token_burst: float,
    ) -> None:
        """Create the limiter row of ``key``, or set its rates."""
        self._record("limiter_configure", key=key, rpm=rpm, tpm=tpm)
        row = self._limits.setdefault(key, {
            "key": key, "requests_full_at": 0.0, "tokens_full_at": 0.0, "paused_until": 0.0,
            "acquired": 0, "penalties": 0, "minute": 0, "minute_count": 0, "prev_count": 0,
        })
        row.update(rpm=rpm, tpm=tpm, request_burst=request_burst, token_burst=token_burst)

    def _limit(self, key: str) -> Row:
        row = self._limits.get(key)
        if row is None:
            raise StoreError(f"no limiter {key!r} (call limiter_configure first)")
        return row

    async def limiter_take(self, key: str, tokens: float) -> float:
        """Take one request and ``tokens`` if allowed now (0), else the seconds to wait."""
        self._record("limiter_take", key=key, tokens=tokens)
        row, now = self._limit(key), time.time()
        ready = _ready_at(row, tokens)
        if ready > now + 1e-6:
            return ready - now
        if row["rpm"] is not None:
            row["requests_full_at"] = max(row["requests_full_at"], now) + 60.0 / row["rpm"]
        if row["tpm"] is not None:
            row["tokens_full_at"] = max(row["tokens_full_at"], now) + tokens * 60.0 / row["tpm"]
        row["acquired"] += 1
        minute = int(now // 60)
        if minute == row["minute"]:
            row["minute_count"] += 1
        else:
            row["prev_count"] = row["minute_count"] if minute == row["minute"] + 1 else 0
            row["minute_count"], row["minute"] = 1, minute
        return 0.0

    async def limiter_give(self, key: str, tokens: float) -> None:
        """Give ``tokens`` back to the token bucket (negative: take more)."""
        self._record("limiter_give", key=key, tokens=tokens)
        row, now = self._limit(key), time.time()
        if row["tpm"] is not None:
            row["tokens_full_at"] = max(
                now, max(row["tokens_full_at"], now) - tokens * 60.0 / row["tpm"])

    async def limiter_defer(self, key: str, requests: float | None,
                            tokens: float | None) -> None:
        """Each bucket full again no sooner than the given seconds from now."""
        self._record("limiter_defer", key=key, requests=requests, tokens=tokens)
        row, now = self._limit(key), time.time()
        for column, seconds in (("requests_full_at", requests), ("tokens_full_at", tokens)):
            if seconds is not None:
                row[column] = max(row[column], now + seconds)

    async def limiter_pause(self, key: str, seconds: float) -> None:
        """Nobody takes anything from ``key`` for ``seconds``."""
        self._record("limiter_pause", key=key, seconds=seconds)
        row = self._limit(key)
        row["paused_until"] = max(row["paused_until"], time.time() + seconds)
        row["penalties"] += 1

    async def limiter_state(self, key: str) -> LimiterState | None:
        """The limiter row of ``key``."""
        row = self._limits.get(key)
        return None if row is None else limiter_from_row({**row, "now": time.time()})

    async def spend_open(self, run_id: str, max_tokens: int | None,
                         max_cost: float | None) -> None:
        """Create the spend row of a run (a limit given replaces the stored one)."""
        self._record("spend_open", run_id=run_id, max_tokens=max_tokens, max_cost=max_cost)
        row = self._spend.setdefault(run_id, {
            "run_id": run_id, "max_tokens": None, "max_cost": None, "requests": 0,
            "prompt_tokens": 0, "cached_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0,
            "reserved_tokens": 0, "reserved_cost": 0.0,
        })
        if max_tokens is not None:
            row["max_tokens"] = max_tokens
        if max_cost is not None:
            row["max_cost"] = max_cost

    def _spend_row(self, run_id: str) -> Row:
        row = self._spend.get(run_id)
        if row is None:
            raise StoreError(f"run {run_id!r} has no spend row (call spend_open first)")
        return row

    async def spend_reserve(self, run_id: str, tokens: int, cost: float) -> SpendState | None:
        """Hold back ``tokens`` and ``cost`` if they fit (None), else the refusing row."""
        self._record("spend_reserve", run_id=run_id, tokens=tokens, cost=cost)
        row = self._spend_row(run_id)
        used = row["prompt_tokens"] + row["completion_tokens"]
        if (row["max_tokens"] is not None
                and used + row["reserved_tokens"] + tokens > row["max_tokens"]) or (
                row["max_cost"] is not None
                and row["cost_usd"] + row["reserved_cost"] + cost > row["max_cost"] + 1e-12):
            return spend_from_row(row)
        row["reserved_tokens"] += tokens
        row["reserved_cost"] += cost
        return None

    async def spend_settle(
        self, run_id: str, reserved_tokens: int, reserved_cost: float, requests: int,
        prompt_tokens: int, cached_tokens: int, completion_tokens: int, cost_usd: float,
    ) -> None:
        """Give a reservation back and add what the request really used."""
        self._record("spend_settle", run_id=run_id, reserved_tokens=reserved_tokens,
                     requests=requests, prompt_tokens=prompt_tokens,
                     completion_tokens=completion_tokens)
        row = self._spend_row(run_id)
        row["reserved_tokens"] = max(0, row["reserved_tokens"] - reserved_tokens)
        row["reserved_cost"] = max(0.0, row["reserved_cost"] - reserved_cost)
        row["requests"] += requests
        row["prompt_tokens"] += prompt_tokens
        row["cached_tokens"] += cached_tokens
        row["completion_tokens"] += completion_tokens
        row["cost_usd"] += cost_usd

    async def spend_release_all(self, run_id: str) -> None:
        """Drop every reservation of a run."""
        self._record("spend_release_all", run_id=run_id)
        row = self._spend.get(run_id)
        if row is not None:
            row["reserved_tokens"], row["reserved_cost"] = 0, 0.0

    async def spend(self, run_id: str) -> SpendState | None:
        """The spend row of a run."""
        row = self._spend.get(run_id)
        return None if row is None else spend_from_row(row)


def _ready_at(row: Row, tokens: float) -> float:
    """When one request and ``tokens`` may be taken (GCRA over both buckets and the pause)."""
    ready = float(row["paused_until"])
    if row["rpm"] is not None:
        ready = max(ready, row["requests_full_at"] - (row["request_burst"] - 1) * 60.0
                    / row["rpm"])
    if row["tpm"] is not None:
        need = min(tokens, row["token_burst"])
        ready = max(ready, row["tokens_full_at"] - (row["token_burst"] - need) * 60.0
                    / row["tpm"])
    return ready
