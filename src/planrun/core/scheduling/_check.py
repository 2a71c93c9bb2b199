"""What the core's incremental state says that its records do not.

:class:`~planrun.core.scheduling.Scheduler` keeps counts and indexes current change by change: a
worker's load and active count, the resource locks, how many dependencies each task still
waits for, the tasks waiting for a person, how many tasks are unfinished, which ready tasks
are queued, the leases. Every status change's effect on them is written once, in
``Book.replace`` (through ``Book.index`` / ``Book.unindex``). :func:`index_problems` recomputes
each from the records alone; the tests run it after every step of random runs and at the
end of every run of every driver, so a change that leaves them wrong fails there rather than
in a user's run.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from planrun.core._task import FINAL, Status

if TYPE_CHECKING:
    from planrun.core.scheduling._scheduler import Scheduler

__all__ = ["index_problems"]

_IN_FLIGHT = (Status.ASSIGNED, Status.RUNNING)


def index_problems(core: Scheduler, *, queues: bool = True) -> list[str]:
    """Each way the core's incremental state differs from what its records imply.

    ``queues``: the core gives ready tasks to its workers' queues (in process, as
    :meth:`Scheduler.dispatch` does), so an assigned task that has not started must be in
    its worker's queue; not so when workers are handed tasks directly (push mode).
    """
    tasks = core.tasks
    problems: list[str] = []
    unfinished = sum(1 for t in tasks.values() if t.status not in FINAL)
    if core.unfinished != unfinished:
        problems.append(f"unfinished is {core.unfinished}, the records say {unfinished}")
    problems += _worker_problems(core, queues)
    locks = {r: t.id for t in tasks.values() if t.status in _IN_FLIGHT for r in t.resources}
    if core.ready.locks != locks:
        problems.append(f"locks are {core.ready.locks}, the records say {locks}")
    awaiting = {t.id for t in tasks.values() if t.status is Status.WAITING}
    if core.awaiting != awaiting:
        problems.append(f"awaiting is {sorted(core.awaiting)}, the records say {sorted(awaiting)}")
    for t in tasks.values():
        left = sum(1 for d in t.depends_on
                   if d not in tasks or tasks[d].status is not Status.COMPLETED)
        if core.ready.waiting.get(t.id) != left:
            problems.append(f"{t.id} waits for {core.ready.waiting.get(t.id)} dependencies, "
                            f"the records say {left}")
    problems += _lease_problems(core)
    problems += _forgotten(core)
    return problems


def _worker_problems(core: Scheduler, queues: bool) -> list[str]:
    problems: list[str] = []
    for name, worker in core.workers.items():
        mine = [t for t in core.tasks.values()
                if t.assigned_to == name and t.status in _IN_FLIGHT]
        active = sum(1 for t in mine if t.status is Status.RUNNING)
        if worker.active != active:
            problems.append(f"{name} has {worker.active} active, the records say {active}")
        load = sum(worker.cost(t) for t in mine)
        if abs(worker.load_s - load) > 1e-6 * max(1.0, load):
            problems.append(f"{name} has load {worker.load_s}, the records say {load}")
        if queues:
            queued = set(worker.queue)
            for t in mine:
                if t.status is Status.ASSIGNED and t.id not in queued:
                    problems.append(f"{t.id} is assigned to {name} but not in its queue")
    return problems


def _lease_problems(core: Scheduler) -> list[str]:
    leased = {(tid, token) for _, tid, token in core.leases.heap}
    return [f"{t.id} runs (token {t.token}) with no lease entry"
            for t in core.tasks.values()
            if t.status is Status.RUNNING and (t.id, t.token) not in leased]


def _forgotten(core: Scheduler) -> list[str]:
    """Pending tasks with nothing left to wait for that nothing will ever give out."""
    if not core.started or core.stopping:
        return []
    in_heaps = Counter(entry[-1] for entry in core.ready.heap)
    parked = {tid for waiting in core.ready.parked.values() for tid in waiting}
    delayed = {tid for _, tid, _ in core.ready.delayed}
    problems = [f"{tid} is marked queued but is in no ready heap"
                for tid in core.ready.queued if not in_heaps[tid]]
    for t in core.tasks.values():
        if t.status is not Status.PENDING or core.ready.waiting.get(t.id):
            continue
        if t.id in core.ready.queued or t.id in parked or t.id in delayed \
                or t.id in core.approvals.asking:
            continue
        problems.append(f"{t.id} is ready but nowhere queued, parked, delayed or asked for")
    return problems
