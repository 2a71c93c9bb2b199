"""Code repairs: what the registry settles in a plan without a guess is fixed by code.

The validator stays strict: :func:`~planrun.core.validate_plan` (and ``planrun validate``)
refuses a plan with a forward dependency however plain the fix. The decomposer, before it
asks the model to repair a plan, hands the model's reply to :func:`repair_plan`, which
applies small named rules, each fixing one problem code, and only where exactly one fix
follows from the plan and the kinds' contracts:

``drop_self_dependency`` (``self_dependency``)
    a task's dependency on itself is dropped.
``drop_unknown_dependency`` (``unknown_dependency``)
    a dependency on an index outside the plan (or an id no task has) is dropped; if the
    task needed it, its contract says so next and the rules below, or the model, add it.
``put_in_dependency_order`` (``forward_dependency``)
    when the dependencies form no cycle, the tasks are put in dependency order (the
    smallest such order: tasks already in order keep their place), every edge kept and
    every index renumbered.
``add_needed_input`` (``missing_input``)
    a task that needs an input its dependencies do not provide gets an edge to the one
    task of the plan that provides it (one only; and never an edge that closes a cycle).
``link_dead_end`` (``dead_end``)
    a task nothing depends on becomes a dependency of the one task of the plan whose kind
    reads its result.
``merge_duplicate`` (``duplicate_task``)
    a task of the same kind and payload as an earlier one is merged into it: its
    dependencies join the earlier task's and what depended on it depends on the earlier
    task (unless the two are linked, which would close a cycle).

Anything else, and any of the above that would need a choice (two producers, no
producer, no reader), is left as it is: an unknown kind, a payload that does not validate,
no deliverable, a cycle, too many tasks go back to the model with the problems. The
result is judged by the strict validator again, so a repair can never make an invalid plan
pass.
"""

from __future__ import annotations

import graphlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from planrun.core._contracts import (
    DEAD_END,
    DUPLICATE_TASK,
    MISSING_INPUT,
    canonical_payload,
    readers_of,
    unmet_inputs,
)
from planrun.core._errors import InvalidPlan
from planrun.core._plan import (
    FORWARD_DEPENDENCY,
    SELF_DEPENDENCY,
    UNKNOWN_DEPENDENCY,
    KindsLike,
    Plan,
    _registry,
    document_of,
    smallest_order,
)
from planrun.core._problem import Problem, Repair
from planrun.core._registry import Registry

__all__ = ["RULES", "CodeRule", "Repaired", "repair_plan"]


@dataclass
class _Task:
    """A task of the plan being repaired: dependencies by index or id, as the reply gave
    them until a rule turns them into indices."""

    kind: str
    payload: Any
    deps: list[int | str]
    id: str | None = None
    key: int = 0
    """The task's index in the reply: it follows the task through reorders and merges."""


@dataclass
class _Work:
    goal: str
    tasks: list[_Task] = field(default_factory=list)
    merged: dict[int, int] = field(default_factory=dict)
    """The key of a task merged away -> the key of the task it was merged into."""

    def final(self, key: int) -> int:
        """The index the task of ``key`` has now (a merged one: the task it went into)."""
        while key in self.merged:
            key = self.merged[key]
        return next(i for i, t in enumerate(self.tasks) if t.key == key)

    def target(self, dep: int | str, ids: Mapping[str, int] | None = None) -> int | None:
        """The index ``dep`` names, or None when no task has it (``ids``: :meth:`ids`)."""
        if isinstance(dep, str):
            return (self.ids() if ids is None else ids).get(dep)
        return dep if 0 <= dep < len(self.tasks) else None

    def ids(self) -> dict[str, int]:
        """Task id -> index, for the tasks that name themselves."""
        return {t.id: i for i, t in enumerate(self.tasks) if t.id is not None}

    def edges(self) -> list[list[int]]:
        """Each task's dependencies as indices (those that name no task left out)."""
        ids = self.ids()
        out = []
        for t in self.tasks:
            found = [self.target(d, ids) for d in t.deps]
            out.append([d for d in dict.fromkeys(found) if d is not None])
        return out

    def reaches(self, start: int, goal: int, edges: Sequence[Sequence[int]] | None = None,
                ) -> bool:
        """Whether task ``start`` depends on task ``goal``, directly or through others."""
        edges, seen, todo = edges or self.edges(), {start}, [start]
        while todo:
            for d in edges[todo.pop()]:
                if d == goal:
                    return True
                if d not in seen:
                    seen.add(d)
                    todo.append(d)
        return False

    def document(self) -> dict[str, Any]:
        tasks = []
        for t in self.tasks:
            doc: dict[str, Any] = {"kind": t.kind, "payload": t.payload,
                                   "depends_on": list(t.deps)}
            if t.id is not None:
                doc["id"] = t.id
            tasks.append(doc)
        return {"goal": self.goal, "tasks": tasks}


Fix = Callable[[_Work, Registry, Sequence[Problem]], list[Repair]]


@dataclass(frozen=True)
class CodeRule:
    """One code repair: its name, the problem code it fixes, and the fix."""

    name: str
    code: str
    fix: Fix

    def __call__(self, work: _Work, registry: Registry,
                 problems: Sequence[Problem]) -> list[Repair]:
        return self.fix(work, registry, [p for p in problems if p.code == self.code])


def _repair(rule: str, code: str, task: int | None, detail: str) -> Repair:
    return Repair("code", code, task, detail, rule=rule)


def _drop_self(work: _Work, registry: Registry, problems: Sequence[Problem]) -> list[Repair]:
    out, ids = [], work.ids()
    for i in sorted({p.task for p in problems if p.task is not None}):
        task = work.tasks[i]
        kept = [d for d in task.deps if work.target(d, ids) != i]
        if len(kept) < len(task.deps):
            task.deps = kept
            out.append(_repair("drop_self_dependency", SELF_DEPENDENCY, i,
                               f"dropped task {i}'s dependency on itself"))
    return out


def _drop_unknown(work: _Work, registry: Registry,
                  problems: Sequence[Problem]) -> list[Repair]:
    out, ids = [], work.ids()
    for i in sorted({p.task for p in problems if p.task is not None}):
        task = work.tasks[i]
        gone = [d for d in task.deps if work.target(d, ids) is None]
        if gone:
            task.deps = [d for d in task.deps if work.target(d, ids) is not None]
            out.append(_repair("drop_unknown_dependency", UNKNOWN_DEPENDENCY, i,
                               f"dropped task {i}'s dependency on {_named(gone)}, which "
                               f"does not exist (the plan has {len(work.tasks)} tasks)"))
    return out


def _named(deps: Sequence[int | str]) -> str:
    return ", ".join(f"id {d!r}" if isinstance(d, str) else f"task {d}" for d in deps)


def _reorder(work: _Work, registry: Registry, problems: Sequence[Problem]) -> list[Repair]:
    edges = work.edges()
    sorter: graphlib.TopologicalSorter[int] = graphlib.TopologicalSorter()
    for i, deps in enumerate(edges):
        sorter.add(i, *deps)
    try:
        sorter.prepare()
    except graphlib.CycleError:
        return []  # a cycle is the model's to break: which edge goes is a choice
    order = smallest_order(sorter)
    position = {old: new for new, old in enumerate(order)}
    work.tasks = [replace(work.tasks[old], deps=[position[d] for d in edges[old]])
                  for old in order]
    moved = ", ".join(f"{old}->{position[old]}" for old in order if position[old] != old)
    return [_repair("put_in_dependency_order", FORWARD_DEPENDENCY, None,
                    f"put the tasks in dependency order, every dependency kept (task "
                    f"old->new: {moved})")]


def _add_input(work: _Work, registry: Registry, problems: Sequence[Problem]) -> list[Repair]:
    out = []
    edges = work.edges()
    for i in sorted({p.task for p in problems if p.task is not None}):
        task = work.tasks[i]
        have = {work.tasks[d].kind for d in edges[i]}
        for unmet in unmet_inputs(registry[task.kind], have, registry):
            producers = [j for j, t in enumerate(work.tasks) if j != i and t.kind in unmet.kinds]
            if len(producers) != 1 or work.reaches(producers[0], i, edges):
                continue  # none, several, or one that waits for this task: not ours to pick
            j = producers[0]
            task.deps.append(j)
            edges[i].append(j)
            out.append(_repair("add_needed_input", MISSING_INPUT, i,
                               f"task {i} ({task.kind!r}) now depends on task {j}, the plan's "
                               f"one {work.tasks[j].kind!r} task, which provides what it "
                               "needs"))
    return out


def _link_dead_end(work: _Work, registry: Registry,
                   problems: Sequence[Problem]) -> list[Repair]:
    out = []
    edges = work.edges()
    used = {d for deps in edges for d in deps}
    for i in sorted({p.task for p in problems if p.task is not None}):
        if i in used:
            continue  # its dependents are the dead ends to fix, not it
        kind = work.tasks[i].kind
        kinds = set(readers_of(kind, registry))
        readers = [j for j, t in enumerate(work.tasks) if j != i and t.kind in kinds]
        if len(readers) != 1 or work.reaches(i, readers[0], edges):
            continue
        j = readers[0]
        work.tasks[j].deps.append(i)
        edges[j].append(i)
        out.append(_repair("link_dead_end", DEAD_END, i,
                           f"task {j} ({work.tasks[j].kind!r}), the plan's one task that "
                           f"reads a {kind!r} result, now depends on task {i}"))
    return out


def _merge_duplicate(work: _Work, registry: Registry,
                     problems: Sequence[Problem]) -> list[Repair]:
    for j in sorted({p.task for p in problems if p.task is not None}):
        dup = work.tasks[j]
        key = canonical_payload(dup.payload)
        i = next((k for k, t in enumerate(work.tasks[:j])
                  if t.kind == dup.kind and canonical_payload(t.payload) == key), None)
        edges = work.edges()
        if i is None or work.reaches(i, j, edges) or work.reaches(j, i, edges):
            continue  # linked copies: merging them would close a cycle
        _merge(work, keep=i, drop=j)
        return [_repair("merge_duplicate", DUPLICATE_TASK, j,
                        f"merged task {j} into task {i} (same kind {dup.kind!r}, same "
                        f"payload); what depended on it depends on task {i}")]
    return []


def _merge(work: _Work, *, keep: int, drop: int) -> None:
    """Fold task ``drop`` into task ``keep`` and renumber: one merge, indices after."""
    edges = work.edges()
    edges[keep] = list(dict.fromkeys(edges[keep] + [d for d in edges[drop] if d != keep]))
    renumber = {old: (keep if old == drop else old - (old > drop)) for old in range(len(edges))}
    tasks = []
    for old, task in enumerate(work.tasks):
        if old == drop:
            continue
        deps: list[int | str] = list(dict.fromkeys(renumber[d] for d in edges[old]))
        tasks.append(replace(task, deps=deps))
    work.merged[work.tasks[drop].key] = work.tasks[keep].key
    work.tasks = tasks


RULES: Final[tuple[CodeRule, ...]] = (
    CodeRule("drop_self_dependency", SELF_DEPENDENCY, _drop_self),
    CodeRule("drop_unknown_dependency", UNKNOWN_DEPENDENCY, _drop_unknown),
    CodeRule("put_in_dependency_order", FORWARD_DEPENDENCY, _reorder),
    CodeRule("merge_duplicate", DUPLICATE_TASK, _merge_duplicate),
    CodeRule("add_needed_input", MISSING_INPUT, _add_input),
    CodeRule("link_dead_end", DEAD_END, _link_dead_end),
)
"""The code repairs, in the order they are tried: the graph first (contracts are judged
only on a sound graph), then duplicates, then the edges contracts require."""

_FIXABLE: Final = frozenset(rule.code for rule in RULES)


@dataclass(frozen=True)
class Repaired:
    """What :func:`repair_plan` made of a plan."""

    plan: Plan | None
    """The plan, accepted by the strict validator (its ``repairs`` the code repairs); None
    when a problem is left that needs the model."""
    repairs: tuple[Repair, ...]
    """The code repairs applied, in order (on a plan that still needs the model, those made
    before the rules ran out)."""
    problems: list[Problem]
    """What is left to fix (empty with a plan)."""


def repair_plan(raw: object, kinds: KindsLike, *, min_tasks: int = 1,
                max_tasks: int = 50) -> Repaired:
    """Validate ``raw`` (as :func:`~planrun.core.validate_plan` does) and fix by code what
    :data:`RULES` fix without a guess, until the plan validates or no rule applies.

    A plan that validates as given comes back with no repairs. Each rule's fix is judged
    by the strict validator again before the next; a plan with a problem no rule fixes
    (not JSON, a schema fault, an unknown kind, an invalid payload, a cycle, the bounds, no
    deliverable, too many of a kind) comes back as None with its problems.

    Raises:
        UsageError: ``kinds`` or the bounds are themselves wrong.
    """
    registry = _registry(kinds)
    plan, problems = _judged(raw, registry, min_tasks, max_tasks)
    if plan is not None:
        return Repaired(plan, (), [])
    work = _working(raw, problems)
    repairs: list[Repair] = []
    # Each fix removes a dependency, adds one that was missing, merges two tasks or sorts
    # the plan once: far fewer rounds than this bound.
    concerned: list[int | None] = []  # per repair, the key of the task it concerns
    for _ in range(4 * len(work.tasks) + 8 if work else 0):
        assert work is not None
        keys = [t.key for t in work.tasks]
        done = _apply_one(work, registry, problems)
        if not done:
            break
        repairs += done
        concerned += [None if r.task is None else keys[r.task] for r in done]
        plan, problems = _judged(work.document(), registry, min_tasks, max_tasks)
        if plan is not None:
            final = tuple(r if key is None else replace(r, final_task=work.final(key))
                          for r, key in zip(repairs, concerned, strict=True))
            return Repaired(replace(plan, repairs=final), final, [])
    return Repaired(None, tuple(repairs), problems)


def _apply_one(work: _Work, registry: Registry, problems: Sequence[Problem]) -> list[Repair]:
    """The fixes of the first rule that fixes something; none when a problem is beyond
    every rule (it needs the model however the others are fixed)."""
    if any(p.code not in _FIXABLE for p in problems):
        return []
    codes = {p.code for p in problems}
    for rule in RULES:
        if rule.code in codes:
            done = rule(work, registry, problems)
            if done:
                return done
    return []


def _judged(raw: object, registry: Registry, min_tasks: int,
            max_tasks: int) -> tuple[Plan | None, list[Problem]]:
    try:
        return Plan.parse(raw, registry, min_tasks=min_tasks, max_tasks=max_tasks), []
    except InvalidPlan as exc:
        return None, list(exc.problems)


def _working(raw: object, problems: Sequence[Problem]) -> _Work | None:
    """The plan as rules edit it; None when a problem is beyond every rule (then its
    entries may not even be tasks)."""
    if any(p.code not in _FIXABLE for p in problems):
        return None
    doc = document_of(raw)
    if doc is None:
        return None
    tasks = [_Task(entry["kind"], entry.get("payload", {}),
                   list(dict.fromkeys(entry.get("depends_on") or ())), entry.get("id"), key)
             for key, entry in enumerate(doc["tasks"])]
    return _Work(doc["goal"], tasks)
