"""The three numbers to watch, computed from a stored run.

Tasks by status (is the run converging?), per-worker active count (is the load spread, or
is one worker pinned while others idle?), and the age of the oldest unfinished task (a
task stuck in ``assigned`` shows up as an age that climbs while everything else looks
healthy).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from planrun.stores.base import RunState
from planrun.task import FINAL, Status

__all__ = ["RunStatus", "run_status"]


@dataclass(frozen=True)
class RunStatus:
    """A snapshot of a run."""

    run_id: str
    run_status: str
    counts: dict[str, int]
    active_by_worker: dict[str, int]
    oldest_unfinished_s: float | None
    oldest_unfinished: str | None

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
        return (f"run {self.run_id} [{self.run_status}]\n"
                f"  tasks by status:        {counts}\n"
                f"  active per worker:      {workers or '-'}\n"
                f"  oldest unfinished task: {oldest}")


def run_status(state: RunState, now: float) -> RunStatus:
    """The snapshot of ``state`` at time ``now`` (the clock the run's records use)."""
    counts = {s.value: 0 for s in Status}
    active: Counter[str] = Counter()
    oldest: tuple[float, str] | None = None
    for task in state.tasks:
        counts[task.status.value] += 1
        if task.status in (Status.ASSIGNED, Status.RUNNING) and task.assigned_to:
            active[task.assigned_to] += 1
        created = task.created_at
        if task.status in FINAL or created is None:
            continue
        if oldest is None or created < oldest[0]:
            oldest = (created, task.id)
    return RunStatus(
        run_id=state.run.id,
        run_status=state.run.status,
        counts=counts,
        active_by_worker=dict(active),
        oldest_unfinished_s=None if oldest is None else max(0.0, now - oldest[0]),
        oldest_unfinished=None if oldest is None else oldest[1],
    )
