"""The Memory store's connection, runs and reads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from planrun.core import (
    RunInUse,
    StoreError,
    Task,
)
from planrun.stores.base import (
    RunInfo,
    RunOwner,
    RunState,
    RunSummary,
    check_lease,
    effect_from_row,
    event_from_row,
    run_from_row,
    run_row,
    summarize,
    task_from_row,
    unknown_run,
)

Row = dict[str, Any]
Call = tuple[str, dict[str, Any]]
"""A recorded call: the method name and its arguments by name."""

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


class _MemoryRows:
    """The Memory store's connection, runs and reads."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        """Every call so far, oldest first."""
        self._runs: dict[str, _Run] = {}
        self._limits: dict[str, Row] = {}
        self._spend: dict[str, Row] = {}
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

    async def set_run_status(self, run_id: str, status: str) -> None:
        """Change a run's status."""
        self._record("set_run_status", run_id=run_id, status=status)
        self._run(run_id).row["status"] = status

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
        """The run, its tasks and effects without the ledger (a cheap poll)."""
        state = await self.load(run_id)
        return RunState(state.run, state.tasks, [], state.effects)

    async def load_some(self, run_id: str, ids: Sequence[str]) -> list[Task]:
        """The tasks of ``ids`` that exist, in task order."""
        self._record("load_some", run_id=run_id, ids=list(ids))
        wanted = set(ids)
        return [task_from_row(r) for r in self._run(run_id).tasks.values() if r["id"] in wanted]

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
