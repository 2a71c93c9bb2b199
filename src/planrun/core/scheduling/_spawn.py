"""Tasks created at run time: the one rule that turns what a handler asked for into records.

A handler asks with :meth:`planrun.TaskContext.spawn`; what it asked for travels with its
result. :func:`expand` checks the request as a plan is checked (the same validator and
problem codes: kinds from the registry, payload models, dependencies only on tasks that
exist or on earlier tasks of the same addition) and against the bounds of
:class:`SpawnLimits`, then makes the new records and the joiners' new dependencies.

Ids are made from the spawning task's id and the position in its addition
(``"<spawner>/<n>"``): a task completes once, so its addition is recorded once, with its
completion, in the same transaction. A reclaimed attempt's late result is fenced off together
with whatever it spawned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from planrun.core._contracts import Node, contract_problems
from planrun.core._errors import InvalidPlan, UsageError
from planrun.core._registry import Registry, SpawnRequest, spawn_id
from planrun.core._task import FINAL, Status, Task

__all__ = ["Addition", "SpawnLimits", "SpawnRequest", "expand", "spawn_depth"]


@dataclass(frozen=True)
class SpawnLimits:
    """How far a run may grow while it runs.

    Args:
        max_tasks: tasks in the whole run, those given up front included.
        max_per_task: tasks one task may add.
        max_depth: generations of spawning (a task of the plan is depth 0; what it spawns
            is depth 1; a spawn deeper than this is refused).
    """

    max_tasks: int = 100_000
    max_per_task: int = 10_000
    max_depth: int = 4

    def __post_init__(self) -> None:
        for name in ("max_tasks", "max_per_task", "max_depth"):
            if getattr(self, name) < 0:
                raise UsageError(f"SpawnLimits.{name} must be >= 0, got {getattr(self, name)}")

    def to_dict(self) -> dict[str, int]:
        """The limits as JSON-ready data (kept in the run's meta for worker processes)."""
        return {"max_tasks": self.max_tasks, "max_per_task": self.max_per_task,
                "max_depth": self.max_depth}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> SpawnLimits:
        """Limits from :meth:`to_dict` output (defaults for what is missing)."""
        return cls(**{k: int(v) for k, v in (data or {}).items()
                      if k in ("max_tasks", "max_per_task", "max_depth")})


@dataclass(frozen=True)
class Addition:
    """What one completion adds: new records, and the pending joiners that now wait longer."""

    tasks: tuple[Task, ...]
    joiners: tuple[Task, ...]
    requests: tuple[SpawnRequest, ...] = ()
    """What was asked for (to compute the addition again over fresher records)."""


def spawn_depth(task_id: str, tasks: Mapping[str, Task]) -> int:
    """Generations between ``task_id`` and the plan (0 for a task of the plan)."""
    depth = 0
    task = tasks.get(task_id)
    while task is not None and task.parent is not None:
        depth += 1
        task = tasks.get(task.parent)
    return depth


def joiners_of(spawner: str, tasks: Mapping[str, Task]) -> list[Task]:
    """Unfinished tasks that join ``spawner`` or one of its spawning ancestors."""
    line: set[str] = set()
    task = tasks.get(spawner)
    while task is not None:
        line.add(task.id)
        task = tasks.get(task.parent) if task.parent is not None else None
    return [t for t in tasks.values()
            if t.joins and t.status not in FINAL and line.intersection(t.joins)]


def expand(spawner: Task, requests: Sequence[SpawnRequest], tasks: Mapping[str, Task],
           kinds: Any, limits: SpawnLimits, now: float, *,
           default_attempts: int | None = None) -> Addition:
    """The records ``requests`` of ``spawner`` add to a run whose records are ``tasks``.

    Raises:
        InvalidPlan: every problem found, with the plan's codes; ``task`` is the position
            in the addition.
    """
    from planrun.core._plan import Problem, validate_plan

    own = {spawn_id(spawner.id, i): i for i in range(len(requests))}
    problems: list[Problem] = []
    doc: list[dict[str, Any]] = []
    for i, req in enumerate(requests):
        local: list[int] = []
        deps = req.depends_on + req.joins if req.joins else req.depends_on
        for dep in deps:
            if dep in own:
                local.append(own[dep])  # checked by the validator: forward, self
            elif dep not in tasks:
                problems.append(Problem("unknown_dependency", i,
                                        f"depends on {dep!r}, which is not a task of this run"))
        doc.append({"kind": req.kind, "payload": dict(req.payload), "depends_on": local})
    if doc:
        shape = validate_plan(doc, kinds, min_tasks=0, max_tasks=len(doc), contracts=False)
        problems.extend(shape)
        if not shape and not problems:
            problems.extend(_contract_problems(spawner, requests, tasks, Registry.of(kinds)))
    problems.extend(_bound_problems(spawner, len(requests), tasks, limits))
    if problems:
        problems.sort(key=lambda p: (-1 if p.task is None else p.task))
        raise InvalidPlan(problems)
    new = tuple(_record(spawner, i, req, now, default_attempts) for i, req in enumerate(requests))
    # A widened joiner's token moves on, so two spawns that read it at once cannot both
    # write over it (the second is refused and reads it again).
    joiners = tuple(j.evolve(depends_on=j.depends_on + tuple(t.id for t in new
                                                             if t.id not in j.depends_on),
                             token=j.token + 1)
                    for j in joiners_of(spawner.id, tasks)) if new else ()
    return Addition(new, joiners, tuple(requests))


def _contract_problems(spawner: Task, requests: Sequence[SpawnRequest],
                       tasks: Mapping[str, Task], registry: Registry) -> list[Any]:
    """What the addition breaks of the kinds' contracts, judged with the run's live tasks
    (a dead or cancelled one is being replaced, so it is no context)."""
    if not registry.has_contracts:
        return []
    live = [t for t in tasks.values() if t.status not in _GONE]
    at = {t.id: i for i, t in enumerate(live)}
    at.update({spawn_id(spawner.id, i): len(live) + i for i in range(len(requests))})
    joiners = tuple(at[j.id] for j in joiners_of(spawner.id, tasks) if j.id in at)
    nodes = [Node(t.kind, t.payload, tuple(at[d] for d in t.depends_on if d in at),
                  checked=False) for t in live]
    nodes += [Node(req.kind, dict(req.payload),
                   tuple(at[d] for d in (*req.depends_on, *req.joins) if d in at),
                   label=i, also_leads_to=joiners)
              for i, req in enumerate(requests)]
    return contract_problems(nodes, registry)


_GONE = frozenset((Status.DEAD, Status.CANCELLED))


def _bound_problems(spawner: Task, n: int, tasks: Mapping[str, Task],
                    limits: SpawnLimits) -> list[Any]:
    from planrun.core._plan import Problem

    out: list[Problem] = []
    if n > limits.max_per_task:
        out.append(Problem("too_many_tasks", None,
                           f"task {spawner.id!r} adds {n} tasks; at most {limits.max_per_task} "
                           "per task"))
    if len(tasks) + n > limits.max_tasks:
        out.append(Problem("too_many_tasks", None,
                           f"the run would have {len(tasks) + n} tasks; at most "
                           f"{limits.max_tasks}"))
    depth = spawn_depth(spawner.id, tasks) + 1
    if n and depth > limits.max_depth:
        out.append(Problem("too_many_tasks", None,
                           f"spawning from {spawner.id!r} would reach depth {depth} of "
                           f"spawning; at most {limits.max_depth}"))
    return out


def _record(spawner: Task, i: int, req: SpawnRequest, now: float,
            default_attempts: int | None) -> Task:
    deps = req.depends_on + req.joins if req.joins else req.depends_on
    if len(deps) > 1:
        deps = tuple(dict.fromkeys(deps))
    extra: dict[str, Any] = {} if default_attempts is None else {"max_attempts": default_attempts}
    return Task(id=spawn_id(spawner.id, i), kind=req.kind, payload=dict(req.payload),
                depends_on=deps, estimate_s=req.estimate_s, created_at=now, parent=spawner.id,
                joins=req.joins, **extra)
