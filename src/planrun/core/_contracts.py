"""Contracts between kinds: what a plan must do, not only what shape it has.

A kind declares its contract on the registry (:meth:`Registry.register`,
:meth:`Registry.kind`, or the :class:`KindSpec` fields of the same names):

``needs``
    kinds its inputs must come from: each entry is a kind, or a tuple of kinds any one of
    which will do, and at least one direct dependency must be of it (``analyse`` needs a
    ``research``).
``inputs``
    result models it reads from its dependencies: each must be the result model (or a
    subclass of it) of at least one direct dependency's kind. The kinds that produce it are
    derived from the registry's result models, so a typed pipeline states it once.
``delivers``
    tasks of this kind deliver the run's result: when any kind delivers, a plan must hold
    at least one such task (``no_deliverable``), and every task must lead to one through
    the tasks that depend on it (``dead_end``: a task whose result nothing uses).
``max_count``
    at most this many tasks of the kind in a plan (``too_many_of_kind``).
``unique``
    no two tasks of the kind carry the same payload (``duplicate_task``).

:func:`contract_problems` checks a plan (or a plan and what a running task adds to it)
against every contract at once; the validator calls it for plans, spawned tasks and
replanned fragments alike, so the rules live here and nowhere else.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pydantic import BaseModel

from planrun.core._problem import Problem
from planrun.core._registry import KindSpec, Registry

__all__ = [
    "CONTRACT_CODES",
    "DEAD_END",
    "DUPLICATE_TASK",
    "MISSING_INPUT",
    "NO_DELIVERABLE",
    "TOO_MANY_OF_KIND",
    "Node",
    "Unmet",
    "canonical_payload",
    "contract_problems",
    "describe_contract",
    "producers_of",
    "readers_of",
    "unmet_inputs",
]

MISSING_INPUT: Final = "missing_input"
"""A kind's declared inputs (kinds or result models) do not come from its dependencies."""
NO_DELIVERABLE: Final = "no_deliverable"
"""No task of a kind that delivers the run's result."""
DEAD_END: Final = "dead_end"
"""A task whose result nothing uses and that delivers nothing."""
DUPLICATE_TASK: Final = "duplicate_task"
"""Two tasks of one kind with the same payload."""
TOO_MANY_OF_KIND: Final = "too_many_of_kind"
"""More tasks of a kind than the kind allows."""

CONTRACT_CODES: Final[tuple[str, ...]] = (
    MISSING_INPUT, NO_DELIVERABLE, DEAD_END, DUPLICATE_TASK, TOO_MANY_OF_KIND,
)
"""The problem codes of contracts between kinds (a plan can be well formed and still
break one)."""


@dataclass(frozen=True)
class Node:
    """One task as the contracts see it: its kind, payload and direct dependencies (by
    position among the nodes), and whether it is checked (a task a run already holds is
    context for a spawn, not re-judged)."""

    kind: str
    payload: Any
    depends_on: tuple[int, ...]
    checked: bool = True
    label: int | None = None
    """The index problems name (the task's position in the plan or the addition)."""
    also_leads_to: tuple[int, ...] = ()
    """Nodes that wait for this one other than through ``depends_on`` (a join)."""


def contract_problems(nodes: Sequence[Node], registry: Registry) -> list[Problem]:
    """Every contract the checked nodes break, in node order.

    ``nodes`` is a whole plan, or a run's tasks (unchecked) followed by what a task adds
    (checked). Kinds the registry does not know are left to the validator's
    ``unknown_kind``.
    """
    specs = {spec.name: spec for spec in registry}
    problems: list[Problem] = []
    problems += _too_many(nodes, specs)
    problems += _duplicates(nodes, specs)
    for node in nodes:
        spec = specs.get(node.kind)
        if node.checked and spec is not None:
            problems += _missing_inputs(node, [nodes[d] for d in node.depends_on], spec,
                                        registry)
    delivering = {name for name, spec in specs.items() if spec.delivers}
    if delivering:
        problems += _deliverables(nodes, delivering)
    return sorted(problems, key=lambda p: (-1 if p.task is None else p.task))


def _too_many(nodes: Sequence[Node], specs: Mapping[str, KindSpec]) -> list[Problem]:
    counts: dict[str, int] = {}
    checked: set[str] = set()
    for node in nodes:
        counts[node.kind] = counts.get(node.kind, 0) + 1
        if node.checked:
            checked.add(node.kind)
    out = []
    for kind in sorted(checked):
        limit = specs[kind].max_count if kind in specs else None
        if limit is not None and counts[kind] > limit:
            out.append(Problem(TOO_MANY_OF_KIND, None,
                               f"{counts[kind]} tasks of kind {kind!r}; at most {limit} "
                               "are allowed — merge them"))
    return out


def _duplicates(nodes: Sequence[Node], specs: Mapping[str, KindSpec]) -> list[Problem]:
    seen: dict[tuple[str, str], Node] = {}
    out = []
    for node in nodes:
        spec = specs.get(node.kind)
        if spec is None or not spec.unique:
            continue
        key = (node.kind, canonical_payload(node.payload))
        first = seen.setdefault(key, node)
        if first is not node and node.checked:
            where = "an earlier task" if first.label is None or not first.checked \
                else f"task {first.label}"
            out.append(Problem(DUPLICATE_TASK, node.label,
                               f"{node.kind!r} with the same payload as {where}; drop it or "
                               "give it its own payload"))
    return out


def canonical_payload(payload: Any) -> str:
    """The one text of a payload two tasks are compared by (sorted keys, no spaces)."""
    return json.dumps(payload, sort_keys=True, default=str, separators=(",", ":"))


@dataclass(frozen=True)
class Unmet:
    """One declared input of a kind that a task's dependencies do not provide."""

    need: str | tuple[str, ...] | type[BaseModel]
    """The need as declared: a kind, a tuple of kinds, or a result model."""
    kinds: tuple[str, ...]
    """The kinds a dependency could be of to provide it."""


def unmet_inputs(spec: KindSpec, dep_kinds: Collection[str], registry: Registry) -> list[Unmet]:
    """What of ``spec``'s ``needs`` and ``inputs`` dependencies of ``dep_kinds`` leave
    unprovided (empty: the task has every input it declares)."""
    out = []
    for need in spec.needs:
        options = (need,) if isinstance(need, str) else tuple(need)
        if not set(dep_kinds).intersection(options):
            out.append(Unmet(need, options))
    for model in spec.inputs:
        if not any(_produces(registry, kind, model) for kind in dep_kinds):
            out.append(Unmet(model, tuple(producers_of(model, registry))))
    return out


def readers_of(kind: str, registry: Registry) -> list[str]:
    """The kinds that declare an input a task of ``kind`` provides (a need naming it, or a
    result model it produces)."""
    return [spec.name for spec in registry
            if any(kind in ((n,) if isinstance(n, str) else n) for n in spec.needs)
            or any(_produces(registry, kind, model) for model in spec.inputs)]


def _missing_inputs(node: Node, deps: Sequence[Node], spec: KindSpec,
                    registry: Registry) -> list[Problem]:
    out = []
    for unmet in unmet_inputs(spec, {d.kind for d in deps}, registry):
        if isinstance(unmet.need, type):
            which = " or ".join(repr(k) for k in unmet.kinds) or "no registered kind"
            out.append(Problem(MISSING_INPUT, node.label,
                               f"{node.kind!r} reads a {unmet.need.__name__}, which {which} "
                               "produces; depend on such a task"))
        else:
            which = " or ".join(repr(k) for k in unmet.kinds)
            out.append(Problem(MISSING_INPUT, node.label,
                               f"{node.kind!r} needs a {which} task among its dependencies "
                               "(add one and list its index in depends_on)"))
    return out


def producers_of(model: type[BaseModel], registry: Registry) -> list[str]:
    """The kinds whose result model is ``model`` (or a subclass of it)."""
    return [spec.name for spec in registry if _produces(registry, spec.name, model)]


def _produces(registry: Registry, kind: str, model: type[BaseModel]) -> bool:
    result = registry[kind].result_model if kind in registry else None
    return isinstance(result, type) and issubclass(result, model)


def _deliverables(nodes: Sequence[Node], delivering: set[str]) -> list[Problem]:
    if not any(node.kind in delivering for node in nodes):
        kinds = ", ".join(repr(k) for k in sorted(delivering))
        return [Problem(NO_DELIVERABLE, None,
                        f"no task delivers the result: the plan needs a task of kind {kinds}")]
    waits_for: list[list[int]] = [list(node.depends_on) for node in nodes]
    for i, node in enumerate(nodes):  # a joiner waits for what it joins
        for j in node.also_leads_to:
            waits_for[j].append(i)
    leads = [node.kind in delivering for node in nodes]
    todo = [i for i, lead in enumerate(leads) if lead]
    while todo:  # walk back from the deliverables along what each waits for
        for d in waits_for[todo.pop()]:
            if not leads[d]:
                leads[d] = True
                todo.append(d)
    kinds = ", ".join(repr(k) for k in sorted(delivering))
    return [Problem(DEAD_END, node.label,
                    f"nothing uses the result of this {node.kind!r} task and it delivers "
                    f"nothing: make a task that leads to a {kinds} task depend on it, or "
                    "drop it")
            for i, node in enumerate(nodes) if node.checked and not leads[i]]


def describe_contract(spec: KindSpec, registry: Registry) -> list[str]:
    """The kind's contract as lines a planner (a model, or a person) can follow."""
    lines = []
    for need in spec.needs:
        options = (need,) if isinstance(need, str) else tuple(need)
        lines.append(f"Needs: at least one {' or '.join(f'`{k}`' for k in options)} task "
                     "among its dependencies.")
    for model in spec.inputs:
        producers = " or ".join(f"`{k}`" for k in producers_of(model, registry))
        lines.append(f"Reads a {model.__name__}: depend on a {producers or '(none)'} task.")
    if spec.delivers:
        lines.append("Delivers the run's result: the plan needs at least one, and every other "
                     "task must lead to one.")
    if spec.max_count is not None:
        lines.append(f"At most {spec.max_count} per plan.")
    if spec.unique:
        lines.append("No two tasks of this kind with the same payload.")
    return lines
