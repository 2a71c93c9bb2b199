"""The outcome of a run: its final records, its ledger and the ledger's audit."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from planrun.core._errors import DispatchError, RunAborted
from planrun.core._ledger import Audit, Event
from planrun.core._task import Status, Task

__all__ = ["RunResult"]

_STATUS = attrgetter("status")


@dataclass(frozen=True, repr=False)
class RunResult:
    """The outcome of a run: final records, the ledger and its audit."""

    run_id: str
    tasks: Mapping[str, Task]
    events: Sequence[Event]
    audit: Audit
    started_at: float
    finished_at: float
    aborted_by: str | None = None
    """Id of the task whose death aborted the run (``on_dead="abort_run"``)."""
    budget_exhausted: bool = False
    workers: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """Per worker: ``tasks`` completed and ``busy_s`` spent."""
    deadline_reached: bool = False
    """The run's deadline passed before every task finished."""
    effects_failed: Mapping[str, str] = field(default_factory=dict)
    """Task id -> last error, for effects that were given up on (the run is then not ok)."""

    @property
    def counts(self) -> dict[str, int]:
        """Tasks by status (every status present, zero included)."""
        return dict(self._counts())

    def _counts(self) -> dict[str, int]:
        # Counted once (the records are final): repr, ok and counts all read it.
        counts: dict[str, int] | None = self.__dict__.get("_counted")
        if counts is None:
            found = Counter(map(_STATUS, self.tasks.values()))
            counts = {s.value: found[s] for s in Status}
            object.__setattr__(self, "_counted", counts)
        return counts

    @property
    def ok(self) -> bool:
        """Every task completed and every effect applied."""
        return not self.effects_failed and self._counts()["completed"] == len(self.tasks)

    @property
    def makespan(self) -> float:
        """Seconds from the start of the run to its end."""
        return self.finished_at - self.started_at

    def raise_for_status(self) -> None:
        """Raise :class:`RunAborted` or :class:`DispatchError` unless the run is ok."""
        if self.aborted_by is not None:
            raise RunAborted(f"run {self.run_id} aborted: task {self.aborted_by!r} died")
        if self.effects_failed:
            raise DispatchError(f"run {self.run_id}: effects failed for "
                                f"{sorted(self.effects_failed)}")
        if not self.ok:
            bad = {k: v for k, v in self.counts.items() if v and k != "completed"}
            raise DispatchError(f"run {self.run_id} finished with {bad}")

    def __repr__(self) -> str:
        counts = {k: v for k, v in self._counts().items() if v}
        return (f"RunResult(run_id={self.run_id!r}, counts={counts}, "
                f"makespan={self.makespan:.3f}, events={len(self.events)})")
