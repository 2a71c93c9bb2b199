"""What the run viewer shows, built from what the store returns (no HTTP here).

Every read goes through the store's public methods and :func:`planrun.cli._read.read_status`
(what ``planrun status`` shows); every decision through :func:`planrun.runtime.approve_task`
and :func:`planrun.runtime.reject_task` (what ``planrun approve`` and ``reject`` call). Every
text that leaves here has been through :func:`planrun.core.redact`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from planrun.cli._read import read_status
from planrun.core import FINAL, Status, Task, UsageError, redact
from planrun.obs import spend_timeline, spent_by_task, timeline
from planrun.stores import RunState, SQLStore, shown_status
from planrun.stores.base import FINISHED_RUN

__all__ = ["PAGE_SIZE", "STATUSES", "Loaded", "clean", "decide", "decision_text",
           "run_view", "runs_page", "task_view"]

PAGE_SIZE = 25
"""Runs per page of the runs list."""

STATUSES: tuple[str, ...] = tuple(s.value for s in Status)
"""Task statuses in the order the compact task rows number them."""

_STATUS_INDEX = {s: i for i, s in enumerate(STATUSES)}
_ERROR_SHOWN = 300
"""Characters of a task's error in its row (the task's own view has all of it)."""


def clean_view(view: dict[str, Any]) -> dict[str, Any]:
    """:func:`clean` of a view (a dict stays a dict)."""
    cleaned: dict[str, Any] = clean(view)
    return cleaned


def clean(value: Any) -> Any:
    """``value`` with :func:`~planrun.core.redact` applied to every string in it."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


async def runs_page(runs: Loaded, page: int, now: float) -> dict[str, Any]:
    """Page ``page`` (from 1) of the store's runs, newest first: id, goal, status as
    ``planrun runs`` shows it (``interrupted`` when no live process owns an unfinished run),
    task counts, spend, start and duration."""
    store = runs.store
    listed = sorted(await store.list_runs(), key=lambda r: r.created_at, reverse=True)
    pages = max(1, math.ceil(len(listed) / PAGE_SIZE))
    page = min(max(1, page), pages)
    rows = []
    for run in listed[(page - 1) * PAGE_SIZE: page * PAGE_SIZE]:
        status = shown_status(run, now)
        spend = await store.spend(run.id)
        rows.append({
            "id": run.id, "goal": run.goal, "status": status, "recorded_status": run.status,
            "counts": {k: v for k, v in run.counts.items() if v},
            "tasks": sum(run.counts.values()), "created_at": run.created_at,
            "duration_s": await runs.duration(run.id, status, now),
            "cost_usd": None if spend is None else spend.cost_usd,
            "tokens": None if spend is None else spend.total_tokens,
        })
    return clean_view({"runs": rows, "page": page, "pages": pages, "total": len(listed)})


def _duration(state: RunState, status: str, now: float) -> float | None:
    """From the run's start to its last task's end (to now while it runs)."""
    start = state.run.created_at
    if status == "running":
        return max(0.0, now - start)
    ends = [t.finished_at for t in state.tasks if t.finished_at is not None]
    return max(0.0, max(ends) - start) if ends else None


class Loaded:
    """Runs read from the store, a finished run kept (it never changes again): its page
    and its tasks' details are not read again from the store, whose full read of a large
    run takes the longest part of showing it."""

    def __init__(self, store: SQLStore, keep: int = 4) -> None:
        self.store = store
        self._finished: dict[str, RunState] = {}
        self._durations: dict[str, float | None] = {}
        self._keep = keep

    async def duration(self, run_id: str, status: str, now: float) -> float | None:
        """The run's duration (:func:`_duration`), read once for a finished run."""
        if run_id in self._durations:
            return self._durations[run_id]
        state = self._finished.get(run_id) or await self.store.load_tasks(run_id)
        took = _duration(state, status, now)
        if status in FINISHED_RUN:
            self._durations[run_id] = took
        return took

    async def load(self, run_id: str) -> RunState:
        """Everything the store holds about the run (:meth:`Store.load`).

        Raises:
            UnknownRun: no such run.
        """
        state = self._finished.get(run_id)
        if state is not None:
            return state
        state = await self.store.load(run_id)
        if state.run.status in FINISHED_RUN:
            while len(self._finished) >= self._keep:
                self._finished.pop(next(iter(self._finished)))
            self._finished[run_id] = state
        return state


async def run_view(runs: Loaded, run_id: str, now: float,
                   since: str | None = None) -> dict[str, Any]:
    """The run's page data: the run, what ``planrun status`` shows of it, its tasks as
    compact rows (see :func:`_rows`), and over time (from the ledger) its tasks by status,
    what they spent and the request rate.

    ``since``: the ``version`` the caller has; when nothing changed, only
    ``{"version", "unchanged": True}`` comes back.

    Raises:
        UnknownRun: the store holds no run ``run_id``.
    """
    state = await runs.load(run_id)
    status = (await read_status(runs.store, state, now)).to_dict()
    kinds = list(dict.fromkeys(t.kind for t in state.tasks))
    rows = _rows(state.tasks, kinds, spent_by_task(state.events))
    version = _version(state, status, rows)
    if since is not None and since == version:
        return {"version": version, "unchanged": True}
    finished = status["run_status"] in ("finished", "aborted") or all(
        t.status in FINAL for t in state.tasks)
    samples_of_timeline = timeline(state.events, points=60)
    started = min((e.at for e in state.events), default=state.run.created_at)
    return clean_view({
        "version": version,
        "run": {"id": state.run.id, "goal": state.run.goal, "created_at": state.run.created_at,
                "duration_s": _duration(state, status["run_status"], now),
                "workers": state.run.meta.get("workers", "local"),
                "app": state.run.meta.get("app"), "finished": finished},
        "status": status,
        "statuses": list(STATUSES),
        "kinds": kinds,
        "tasks": rows,
        "timeline": {"start": started,
                     "at": [round(s.at, 3) for s in samples_of_timeline],
                     "counts": [[s.counts[k] for k in STATUSES] for s in samples_of_timeline]},
        "spend": [[round(s.at, 3), s.tokens, s.cost_usd, s.requests_per_minute]
                  for s in spend_timeline(state.events, points=60)],
        "now": now,
    })


def _rows(tasks: Sequence[Task], kinds: list[str],
          spent: Mapping[str, Mapping[str, float]]) -> list[list[Any]]:
    """One compact row per task, in task order: ``[id, kind index, status index, attempts,
    dependency indices, parent index (-1: none), cause, error (its first 300 characters),
    started_at, finished_at, joined indices, tokens, cost_usd]`` (tokens and cost: None
    when the ledger records no model request of the task)."""
    index = {t.id: i for i, t in enumerate(tasks)}
    kind_index = {k: i for i, k in enumerate(kinds)}
    rows = []
    for t in tasks:
        error = t.error[:_ERROR_SHOWN] if t.error else t.error
        rows.append([t.id, kind_index[t.kind], _STATUS_INDEX[t.status.value], t.attempts,
                     [index[d] for d in t.depends_on if d in index],
                     index.get(t.parent, -1) if t.parent else -1, t.cause, error,
                     t.started_at, t.finished_at, [index[j] for j in t.joins if j in index],
                     *_spent(spent.get(t.id))])
    return rows


def _spent(row: Mapping[str, float] | None) -> tuple[int | None, float | None]:
    return (None, None) if row is None else (int(row["tokens"]), row["cost_usd"])


def _version(state: RunState, status: Mapping[str, Any], rows: list[list[Any]]) -> str:
    """A digest of what the page shows: equal digests, nothing to redraw."""
    digest = hashlib.blake2b(digest_size=12)
    digest.update(json.dumps([status["run_status"], status["spend"], status["limiter"],
                              len(state.events), rows], default=str).encode())
    return digest.hexdigest()


async def task_view(runs: Loaded, run_id: str, task_id: str) -> dict[str, Any]:
    """One task in full: its record, its result and payload, and its ledger events.

    Raises:
        UnknownRun: no such run.
        UsageError: the run has no task ``task_id``.
    """
    state = await runs.load(run_id)
    task = next((t for t in state.tasks if t.id == task_id), None)
    if task is None:
        raise UsageError(f"run {run_id!r} has no task {task_id!r}")
    record = {name: getattr(task, name) for name in (
        "id", "kind", "attempts", "max_attempts", "error", "error_class", "cause",
        "assigned_to", "created_at", "started_at", "finished_at", "parent", "not_before")}
    spent = spent_by_task([e for e in state.events if e.task == task_id]).get(task_id)
    return clean_view({
        **record, "status": task.status.value, "spent": spent, "depends_on": list(task.depends_on),
        "joins": list(task.joins), "payload": dict(task.payload), "result": task.result,
        "events": [e.to_dict() for e in state.events if e.task == task_id],
        "effect": None if task_id not in state.effects else {
            "state": state.effects[task_id].state, "at": state.effects[task_id].at},
    })


def decision_text(who: str | None, note: str | None, at: float) -> str:
    """The note recorded with a decision taken in the viewer: who, when, and the note."""
    name = " ".join((who or "").split())[:60] or "ui"
    when = datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    text = f"by {name} at {when} in planrun ui"
    note = (note or "").strip()
    return f"{text}: {note}" if note else text


async def decide(store: SQLStore, run_id: str, task_id: str, approve: bool, who: str | None,
                 note: str | None, now: float) -> Task:
    """Approve or reject a waiting task as ``planrun approve``/``reject`` do, the note
    saying who decided and when (:func:`decision_text`).

    Raises:
        UsageError: no such task, it is not waiting, or it was already decided.
        UnknownRun: no such run.
    """
    from planrun.runtime import approve_task, reject_task

    text = decision_text(who, note, now)
    if approve:
        return await approve_task(store, run_id, task_id, text)
    return await reject_task(store, run_id, task_id, text)
