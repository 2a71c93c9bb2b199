"""The three numbers to watch, computed from a stored run.

Tasks by status (is the run converging?), per-worker active count (is the load spread, or
is one worker pinned while others idle?), and the age of the oldest unfinished task (a
task stuck in ``assigned`` shows up as an age that climbs while everything else looks
healthy). A task waiting for a person's approval is shown apart (``waiting``: what it waits
for and since when): it is not a stall, and not "oldest unfinished" in the alarming sense.
Beside them, when the store holds them: what the run spent and what its budget
leaves (``spend``), and the shared rate limiter's rates and the rate of its last minute
(``limiter``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from planrun.core import FINAL, Event, LimiterState, SpendState, Status
from planrun.stores.base import RunState, shown_status

__all__ = ["RunStatus", "Sample", "SpendSample", "run_status", "spend_timeline",
           "spent_by_task", "spent_by_tier", "timeline"]


@dataclass(frozen=True)
class RunStatus:
    """A snapshot of a run."""

    run_id: str
    run_status: str
    """What the run's status means now (:func:`planrun.stores.base.shown_status`): as
    recorded, or ``interrupted`` when it is not finished and no live process owns it."""
    counts: dict[str, int]
    active_by_worker: dict[str, int]
    oldest_unfinished_s: float | None
    oldest_unfinished: str | None
    recorded_status: str = ""
    """The status the last driver recorded (``running``, ``failed``, ``finished``...)."""
    owner: str | None = None
    """The process holding the run's owner lease, if any (it may have expired)."""
    owner_until: float | None = None
    """When that lease ends (epoch seconds)."""
    spend: dict[str, Any] | None = None
    """What the run spent and what its budget leaves (None: the store has no record)."""
    limiter: dict[str, Any] | None = None
    """The run's rate limit: its rates and key; for a shared one (``shared``) also
    ``recent_rpm``, ``acquired``, ``penalties`` and ``paused_for`` (None: no limit)."""
    waiting: list[dict[str, Any]] | None = None
    """Tasks waiting for approval, longest wait first: ``task``, ``for`` (``start`` or
    ``effect``), ``waiting_s``, ``timeout_at`` (they are not in ``oldest_unfinished``)."""
    not_completed: list[dict[str, Any]] = field(default_factory=list)
    """Tasks that ended without completing (``dead``, ``cancelled``) or whose last attempt
    failed (``failed``: a retry is due), in plan order: ``task``, ``kind``, ``status``,
    ``cause``, ``attempts``, ``error`` (whole; the text view shows its first line)."""
    by_tier: dict[str, dict[str, float]] = field(default_factory=dict)
    """What the run's tasks spent per tier that served their model requests
    (:func:`spent_by_tier`)."""

    @property
    def finished(self) -> bool:
        """The run is over (every task final, or the run is marked ended)."""
        unfinished = sum(v for k, v in self.counts.items() if Status(k) not in FINAL)
        return unfinished == 0 or self.run_status in ("finished", "aborted")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``planrun status --json``)."""
        return dict(self.__dict__)

    def render(self) -> str:
        """A few lines for a terminal."""
        counts = ", ".join(f"{k} {v}" for k, v in self.counts.items() if v) or "no tasks"
        workers = ", ".join(f"{w} {n}" for w, n in sorted(self.active_by_worker.items()))
        oldest = (f"{self.oldest_unfinished_s:.1f} s ({self.oldest_unfinished})"
                  if self.oldest_unfinished_s is not None else "-")
        lines = (f"run {self.run_id} [{self.run_status}]\n"
                 f"  tasks by status:        {counts}\n"
                 f"  active per worker:      {workers or '-'}\n"
                 f"  oldest unfinished task: {oldest}")
        if self.waiting:
            shown = ", ".join(f"{w['task']} ({w['for']}) {w['waiting_s']:.1f} s"
                              for w in self.waiting[:5])
            more = f" and {len(self.waiting) - 5} more" if len(self.waiting) > 5 else ""
            lines += f"\n  waiting for approval:   {shown}{more}"
        if self.spend is not None and (self.spend["requests"] or _budgeted(self.spend)):
            lines += f"\n  spent:                  {_spent(self.spend)}"
            lines += f"\n  budget left:            {_left(self.spend)}"
        if self.by_tier and set(self.by_tier) != {"default"}:
            shown = ", ".join(f"{k} {v['requests']:.0f} requests ${v['cost_usd']:.4f}"
                              for k, v in self.by_tier.items())
            lines += f"\n  by tier:                {shown}"
        if self.limiter is not None:
            lines += f"\n  rate limit:             {_rate(self.limiter)}"
        if self.not_completed:
            lines += "\n  did not complete:"
            for row in self.not_completed[:_SHOWN]:
                lines += f"\n    {_why(row)}"
            if len(self.not_completed) > _SHOWN:
                lines += (f"\n    ... and {len(self.not_completed) - _SHOWN} more "
                          "(--json lists them all)")
        return lines


_SHOWN = 10
"""Tasks that did not complete listed in the text view."""


def _why(row: Mapping[str, Any]) -> str:
    """One task that did not complete, in a line: why, and the first line of its error."""
    text = f"{row['task']} ({row['kind']}) {row['status']}"
    if row["cause"]:
        text += f", cause {row['cause']}"
    text += f", {row['attempts']} attempt{'s' if row['attempts'] != 1 else ''}"
    error = (row["error"] or "").strip().splitlines()
    return f"{text}: {error[0]}" if error else text


def _spent(spend: dict[str, Any]) -> str:
    return (f"{spend['requests']} requests, {spend['total_tokens']} tokens, "
            f"${spend['cost_usd']:.4f}")


def _budgeted(spend: dict[str, Any]) -> bool:
    return spend["tokens_left"] is not None or spend["cost_left"] is not None


def _left(spend: dict[str, Any]) -> str:
    parts = []
    if spend["tokens_left"] is not None:
        parts.append(f"{spend['tokens_left']} of {spend['max_tokens']} tokens")
    if spend["cost_left"] is not None:
        parts.append(f"${spend['cost_left']:.4f} of ${spend['max_cost']:.4f}")
    return ", ".join(parts) or "no budget"


def _rate(limiter: dict[str, Any]) -> str:
    limits = ", ".join(f"{limiter[k]:g} {k}" for k in ("rpm", "tpm") if limiter[k] is not None)
    if limiter.get("recent_rpm") is None:
        return f"{limits or 'none'} [{limiter['key']}], kept by the process running the run"
    text = (f"{limits or 'none'} [{limiter['key']}]; last minute "
            f"{limiter['recent_rpm']:.0f} requests")
    if limiter["paused_for"] > 0:
        text += f"; paused {limiter['paused_for']:.1f} s after a 429"
    return text


def run_status(
    state: RunState,
    now: float,
    spend: SpendState | None = None,
    limiter: LimiterState | Mapping[str, Any] | None = None,
) -> RunStatus:
    """The snapshot of ``state`` at time ``now`` (the clock the run's records use), with
    the run's ``spend`` and shared ``limiter`` rows when the store has them (``limiter``
    may instead be the rates the run recorded, for a limiter kept in one process)."""
    counts = {s.value: 0 for s in Status}
    active: Counter[str] = Counter()
    oldest: tuple[float, str] | None = None
    for task in state.tasks:
        counts[task.status.value] += 1
        if task.status in (Status.ASSIGNED, Status.RUNNING) and task.assigned_to:
            active[task.assigned_to] += 1
        created = task.created_at
        if task.status in FINAL or task.status is Status.WAITING or created is None:
            continue
        if oldest is None or created < oldest[0]:
            oldest = (created, task.id)
    run = state.run
    return RunStatus(
        waiting=_waiting(state, now),
        not_completed=[
            {"task": task.id, "kind": task.kind, "status": task.status.value,
             "cause": task.cause, "attempts": task.attempts, "error": task.error}
            for task in state.tasks if task.status in _DID_NOT_COMPLETE],
        run_id=run.id,
        run_status=shown_status(run, now),
        recorded_status=run.status,
        owner=run.owner,
        owner_until=run.owner_until,
        counts=counts,
        active_by_worker=dict(active),
        oldest_unfinished_s=None if oldest is None else max(0.0, now - oldest[0]),
        oldest_unfinished=None if oldest is None else oldest[1],
        spend=None if spend is None else spend.to_dict(),
        limiter=(None if limiter is None else dict(limiter) if isinstance(limiter, Mapping)
                 else {**limiter.to_dict(), "shared": True}),
        by_tier=spent_by_tier(state.events),
    )


_DID_NOT_COMPLETE = frozenset({Status.DEAD, Status.CANCELLED, Status.FAILED})


def _waiting(state: RunState, now: float) -> list[dict[str, Any]]:
    """Tasks waiting for approval, with the time of the event that made them wait."""
    since = {e.task: e.at for e in state.events if e.event == "waiting"}
    rows = []
    for task in state.tasks:
        if task.status is not Status.WAITING:
            continue
        at = since.get(task.id, task.finished_at or task.created_at or now)
        stage = (task.cause or "").split(":", 1)[-1] or "start"
        rows.append({"task": task.id, "for": stage, "waiting_s": max(0.0, now - at),
                     "timeout_at": task.not_before})
    return sorted(rows, key=lambda r: -r["waiting_s"])


@dataclass(frozen=True)
class Sample:
    """The three numbers at one instant of a run, computed from its ledger."""

    at: float
    """Seconds since the run's first event."""
    counts: dict[str, int]
    active_by_worker: dict[str, int]
    oldest_unfinished_s: float | None


def timeline(events: Sequence[Event], points: int = 100) -> list[Sample]:
    """Replay a ledger and sample, ``points`` times, tasks by status, per-worker active
    count (tasks running on it, not those queued) and the age of the oldest unfinished
    task: the article's three numbers."""
    ordered = sorted(events, key=lambda e: e.seq)
    if not ordered:
        return []
    start = min(e.at for e in ordered)
    end = max(e.at for e in ordered)
    step = (end - start) / max(1, points - 1)
    status: dict[str, str] = {}
    created: dict[str, float] = {}
    running_on: dict[str, str] = {}
    samples: list[Sample] = []
    i = 0
    for n in range(points):
        now = start + n * step if n < points - 1 else end
        while i < len(ordered) and ordered[i].at <= now:
            e = ordered[i]
            i += 1
            new = _EVENT_STATUS.get(e.event)
            if e.event == "approved":  # before an effect: its "completed" follows
                new = None if e.detail.get("for") == "effect" else "pending"
            if e.event == "created":
                created[e.task] = e.at
            if new is None:
                continue
            status[e.task] = new
            if new == "running" and e.worker:
                running_on[e.task] = e.worker
            else:
                running_on.pop(e.task, None)
        counts = {s.value: 0 for s in Status}
        for value in status.values():
            counts[value] += 1
        active: Counter[str] = Counter(running_on.values())
        open_ = [created[t] for t, s in status.items()
                 if s not in _FINAL_NAMES and s != "waiting" and t in created]
        samples.append(Sample(now - start, counts, dict(active),
                              (now - min(open_)) if open_ else None))
    return samples


_EVENT_STATUS = {
    "created": "pending", "assigned": "assigned", "started": "running",
    "completed": "completed", "failed": "failed", "retry": "pending",
    "reclaimed": "pending", "dead": "dead", "cancelled": "cancelled", "waiting": "waiting",
}
_FINAL_NAMES = frozenset(s.value for s in FINAL)


_USAGE = "usage"
"""The ledger's event of a model request a task made (``EventName.USAGE``)."""


def spent_by_task(events: Sequence[Event]) -> dict[str, dict[str, float]]:
    """What each task's model requests used, from the ledger's ``usage`` events:
    ``{task: {"requests", "tokens", "cost_usd"}}`` (a task that made none is absent)."""
    spent: dict[str, dict[str, float]] = {}
    for e in events:
        if e.event != _USAGE:
            continue
        row = spent.setdefault(e.task, {"requests": 0, "tokens": 0, "cost_usd": 0.0})
        row["requests"] += 1
        row["tokens"] += int(e.detail.get("prompt_tokens", 0)) + int(
            e.detail.get("completion_tokens", 0))
        row["cost_usd"] += float(e.detail.get("cost_usd", 0.0))
    return spent


def spent_by_tier(events: Sequence[Event]) -> dict[str, dict[str, float]]:
    """What the run's tasks' model requests used per tier that served them, from the
    ledger's ``usage`` events: ``{tier: {"requests", "tokens", "cached_tokens",
    "cost_usd"}}``, cheapest tier first (a tier that served none is absent)."""
    spent: dict[str, dict[str, float]] = {}
    for e in events:
        if e.event != _USAGE:
            continue
        row = spent.setdefault(str(e.detail.get("tier", "default")),
                               {"requests": 0, "tokens": 0, "cached_tokens": 0,
                                "cost_usd": 0.0})
        row["requests"] += 1
        row["tokens"] += int(e.detail.get("prompt_tokens", 0)) + int(
            e.detail.get("completion_tokens", 0))
        row["cached_tokens"] += int(e.detail.get("cached_tokens", 0))
        row["cost_usd"] += float(e.detail.get("cost_usd", 0.0))
    order = ("batch", "flex", "default", "priority")
    return dict(sorted(spent.items(), key=lambda item: (
        order.index(item[0]) if item[0] in order else len(order))))


@dataclass(frozen=True)
class SpendSample:
    """What a run's tasks had spent at one instant, and its request rate then."""

    at: float
    """Seconds since the run's first event."""
    tokens: int
    cost_usd: float
    requests_per_minute: float
    """Model requests in the minute before ``at``."""


def spend_timeline(events: Sequence[Event], points: int = 60) -> list[SpendSample]:
    """Replay the ledger's ``usage`` events and sample, ``points`` times over the run,
    the tokens and dollars spent so far and the requests of the minute before (empty when
    the ledger holds none)."""
    used = sorted((e for e in events if e.event == _USAGE), key=lambda e: e.at)
    if not used:
        return []
    start = min(e.at for e in events)
    end = max(e.at for e in events)
    step = (end - start) / max(1, points - 1)
    samples: list[SpendSample] = []
    tokens, cost, i, first = 0, 0.0, 0, 0
    for n in range(points):
        now = start + n * step if n < points - 1 else end
        while i < len(used) and used[i].at <= now:
            d = used[i].detail
            tokens += int(d.get("prompt_tokens", 0)) + int(d.get("completion_tokens", 0))
            cost += float(d.get("cost_usd", 0.0))
            i += 1
        while first < i and used[first].at <= now - 60:
            first += 1
        samples.append(SpendSample(now - start, tokens, cost, float(i - first)))
    return samples
