"""Supervisor against peer boards, on the release scenario, audited from the ledger alone.

The release: ``migrate_db`` (skill db), ``deploy_app`` (deploy, needs the migration),
``smoke_test`` (qa, needs the deploy), listed out of order on purpose. Workers ``db-1``,
``deploy-1``, ``deploy-2`` and ``qa-1``; failure plans say how many times a worker fails a
task, so every run is deterministic.

Three systems run it:

* a naive peer board: each agent takes whatever of its skill it sees;
* a peer board with the protocol: check dependencies, claim atomically, retry failed work;
* the planrun supervisor (``on_dead="abort_run"``: a release stops rather than deploying onto
  an unmigrated database).

The peer board works in rounds: every agent picks from the board, then all picks run, which
models agents deciding before they see each other's results.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from planrun.clock import VirtualClock
from planrun.errors import TransientError
from planrun.ledger import Audit, Event, Ledger, analyze
from planrun.registry import KindSpec, Registry, TaskContext, WorkerSpec
from planrun.scheduling import RetryPolicy
from planrun.supervisor import RunResult, Supervisor
from planrun.task import Task

__all__ = [
    "RELEASE",
    "PeerBoard",
    "ReleaseWorker",
    "compare",
    "make_workers",
    "run_supervisor",
]

RELEASE: tuple[Task, ...] = (
    Task(id="deploy_app", kind="deploy", depends_on=("migrate_db",)),
    Task(id="smoke_test", kind="qa", depends_on=("deploy_app",)),
    Task(id="migrate_db", kind="db"),
)
"""The release, deliberately out of order: the system must restore the order, not the list."""


class ReleaseWorker:
    """A deterministic worker: fails a task as many times as its plan says, then succeeds."""

    def __init__(self, name: str, skill: str, fail_plan: Mapping[str, int] | None = None) -> None:
        self.name = name
        self.skill = skill
        self.fail_plan = dict(fail_plan or {})

    def attempt(self, task_id: str) -> None:
        """Do the task once; raise :class:`TransientError` while the plan says fail."""
        if self.fail_plan.get(task_id, 0) > 0:
            self.fail_plan[task_id] -= 1
            raise TransientError(f"{self.name} failed {task_id}")

    async def __call__(self, payload: Any, ctx: TaskContext) -> dict[str, str]:
        self.attempt(ctx.task_id)
        return {"done_by": self.name}


def make_workers(db_failures: int = 1, deploy1_failures: int = 0) -> list[ReleaseWorker]:
    """Fresh workers for one run (failure plans are consumed as they run)."""
    return [
        ReleaseWorker("deploy-1", "deploy", {"deploy_app": deploy1_failures}),
        ReleaseWorker("deploy-2", "deploy"),
        ReleaseWorker("qa-1", "qa"),
        ReleaseWorker("db-1", "db", {"migrate_db": db_failures}),
    ]


class PeerBoard:
    """Equal agents picking work from a shared board, with optional protocol rules."""

    def __init__(
        self,
        workers: Sequence[ReleaseWorker],
        *,
        check_deps: bool = False,
        use_claims: bool = False,
        retry_failed: bool = False,
        max_rounds: int = 10,
    ) -> None:
        self.workers = list(workers)
        self.check_deps = check_deps
        self.use_claims = use_claims
        self.retry_failed = retry_failed
        self.max_rounds = max_rounds

    def execute(self, tasks: Sequence[Task]) -> Ledger:
        """Run rounds until nobody picks anything; return the ledger."""
        ledger = Ledger()
        done: set[str] = set()
        failed: set[str] = set()
        for round_no in range(self.max_rounds):
            picks = self._pick(tasks, done, failed)
            if not picks:
                break
            for worker, task in picks:
                try:
                    worker.attempt(task.id)
                except TransientError as exc:
                    failed.add(task.id)
                    ledger.append(round_no, task.id, "failed", worker=worker.name,
                                  detail={"error": str(exc)})
                else:
                    done.add(task.id)
                    failed.discard(task.id)
                    ledger.append(round_no, task.id, "completed", worker=worker.name)
        return ledger

    def _pick(
        self, tasks: Sequence[Task], done: set[str], failed: set[str]
    ) -> list[tuple[ReleaseWorker, Task]]:
        picks: list[tuple[ReleaseWorker, Task]] = []
        claimed: set[str] = set()
        for worker in self.workers:
            for task in tasks:
                if task.kind != worker.skill or task.id in done:
                    continue
                if task.id in failed and not self.retry_failed:
                    continue  # "somebody else will deal with it"
                if self.check_deps and not set(task.depends_on) <= done:
                    continue
                if self.use_claims and task.id in claimed:
                    continue
                claimed.add(task.id)
                picks.append((worker, task))
                break
        return picks


def run_supervisor(
    workers: Sequence[ReleaseWorker],
    tasks: Sequence[Task] = RELEASE,
    *,
    max_retries: int = 2,
    on_event: Callable[[Event, Task], None] | None = None,
) -> RunResult:
    """Run the release under the planrun supervisor, in virtual time."""
    registry = Registry(KindSpec(k) for k in sorted({t.kind for t in tasks}))
    specs = [WorkerSpec(w.name, {w.skill: 1.0}, 1, {w.skill: w}) for w in workers]
    sup = Supervisor(
        registry,
        specs,
        strategy="balanced",
        max_attempts=max_retries + 1,
        backoff=RetryPolicy(base=1.0),
        on_dead="abort_run",
        clock=VirtualClock(),
        run_id="release",
        seed=0,
        on_event=on_event,
    )
    sup.add_tasks(tasks)
    return sup.run()


@dataclass(frozen=True)
class Row:
    """One line of the comparison table."""

    system: str
    audit: Audit

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape of one row of ``planrun compare --json``."""
        return {
            "system": self.system,
            "order_violations": self.audit.order_violations,
            "duplicates": self.audit.duplicates,
            "missing": list(self.audit.missing),
        }


def compare(tasks: Sequence[Task] = RELEASE) -> list[Row]:
    """Run the release through the three systems and audit each ledger."""
    naive = PeerBoard(make_workers()).execute(tasks)
    protocol = PeerBoard(
        make_workers(), check_deps=True, use_claims=True, retry_failed=True
    ).execute(tasks)
    supervised = run_supervisor(make_workers(), tasks)
    return [
        Row("peer (naive)", analyze(tasks, naive)),
        Row("peer (protocol)", analyze(tasks, protocol)),
        Row("supervisor", analyze(tasks, supervised.events)),
    ]
