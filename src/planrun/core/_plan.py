"""The plan document: parsing, validation with every problem listed, JSON Schema, order.

A plan is untrusted input, usually the text a model wrote. :func:`validate_plan` reads it
(raw text, a plan document or a bare list of tasks), checks it against the worker kinds
that exist and returns *every* problem it finds, each with a stable code, the task index
and a message that a person, or a model asked to repair the plan, can act on. It never
raises on bad input. :meth:`Plan.parse` does the same and returns a :class:`Plan` or raises
:class:`planrun.InvalidPlan` carrying the problems.

    {"goal": "ship it",
     "tasks": [{"kind": "migrate_db", "payload": {}, "depends_on": []},
               {"kind": "deploy_app", "payload": {}, "depends_on": [0]}]}

``depends_on`` holds zero-based indices of earlier tasks. A task may also carry a string
``id`` and name its dependencies by id; ids may point forward, and cycles among them are
found with :mod:`graphlib` and reported as ``cycle``.

Problem codes (stable): ``not_json``, ``schema``, ``unknown_kind``, ``invalid_payload``,
``self_dependency``, ``forward_dependency``, ``unknown_dependency``, ``cycle``,
``too_few_tasks``, ``too_many_tasks``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import gc
import graphlib
import heapq
import json
import re
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Final, TypeAlias

from pydantic import BaseModel, ValidationError

from planrun.core._contracts import CONTRACT_CODES, Node, contract_problems
from planrun.core._errors import InvalidPlan, UsageError
from planrun.core._problem import Problem, Repair
from planrun.core._registry import KindSpec, Registry
from planrun.core._task import Task

__all__ = [
    "CONTRACT_CODES",
    "CYCLE",
    "FORWARD_DEPENDENCY",
    "INVALID_PAYLOAD",
    "NOT_JSON",
    "PROBLEM_CODES",
    "SCHEMA",
    "SELF_DEPENDENCY",
    "TOO_FEW_TASKS",
    "TOO_MANY_TASKS",
    "TRUNCATED",
    "UNKNOWN_DEPENDENCY",
    "UNKNOWN_KIND",
    "KindsLike",
    "Plan",
    "PlanTask",
    "Problem",
    "Repair",
    "document_of",
    "plan_schema",
    "smallest_order",
    "validate_plan",
]

KindsLike: TypeAlias = "Registry | Iterable[str] | Mapping[str, type[BaseModel] | None]"
"""What names the kinds a plan may use: a registry, kind names, or name -> payload model."""

NOT_JSON: Final = "not_json"
"""The text holds no parseable JSON object or list."""
SCHEMA: Final = "schema"
"""Wrong shape or types: a missing ``kind``, ``depends_on`` not a list, a duplicate id, ..."""
UNKNOWN_KIND: Final = "unknown_kind"
"""A kind no registered worker can do."""
INVALID_PAYLOAD: Final = "invalid_payload"
"""The payload fails the kind's payload model."""
SELF_DEPENDENCY: Final = "self_dependency"
"""A task depends on itself."""
FORWARD_DEPENDENCY: Final = "forward_dependency"
"""A task depends on a later index."""
UNKNOWN_DEPENDENCY: Final = "unknown_dependency"
"""An index outside the plan, or an id no task has."""
CYCLE: Final = "cycle"
"""Tasks that depend on each other in a circle (possible where ids name dependencies)."""
TOO_FEW_TASKS: Final = "too_few_tasks"
"""Fewer tasks than ``min_tasks``."""
TOO_MANY_TASKS: Final = "too_many_tasks"
"""More tasks than ``max_tasks``."""
TRUNCATED: Final = "truncated"
"""The model's reply was cut at its output bound (the decomposer's repair loop reports it)."""

PROBLEM_CODES: Final[tuple[str, ...]] = (
    NOT_JSON,
    SCHEMA,
    UNKNOWN_KIND,
    INVALID_PAYLOAD,
    SELF_DEPENDENCY,
    FORWARD_DEPENDENCY,
    UNKNOWN_DEPENDENCY,
    CYCLE,
    TOO_FEW_TASKS,
    TOO_MANY_TASKS,
    *CONTRACT_CODES,
    TRUNCATED,
)
"""Every problem code, in the order of the design's table."""

_GRAPH_CODES: Final = frozenset(
    (SELF_DEPENDENCY, FORWARD_DEPENDENCY, UNKNOWN_DEPENDENCY, CYCLE, SCHEMA))
"""Problems after which the plan's graph cannot be trusted to judge its contracts."""

_TASK_FIELDS: Final[tuple[str, ...]] = ("kind", "payload", "depends_on", "id")
_TASK_FIELD_SET: Final = frozenset(_TASK_FIELDS)
_SHAPE_HINT: Final = (
    '{"goal": "...", "tasks": [{"kind": "...", "payload": {...}, "depends_on": [...]}]}'
)
_MAX_CANDIDATES: Final = 32
_MAX_STRICT_PROBLEMS: Final = 20
_BIG_INT_BITS: Final = 256
_MAX_LISTED_KINDS: Final = 60
_MAX_CYCLES: Final = 20
"""Cycles reported one by one; past this many, one more problem counts the rest."""
_MAX_DEPTH: Final = 64
"""How deeply a plan document may nest (the document itself is level 1, a payload level 4)."""
_FENCE: Final = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[ \t]*\r?\n?(.*?)```", re.DOTALL)
_JSON_START: Final = re.compile(r"[\[{]")
_JSON_TOKEN: Final = re.compile(r'"(?:[^"\\\n]|\\.)*"|[\[\]{}]')
_TOO_DEEP: Final = object()


@dataclass(frozen=True)
class PlanTask:
    """One task of a validated plan; ``depends_on`` holds indices into the plan's tasks."""

    kind: str
    payload: dict[str, Any] = field(default_factory=dict)
    depends_on: tuple[int, ...] = ()
    id: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "depends_on", tuple(self.depends_on))


@dataclass(frozen=True)
class Plan:
    """A validated plan: a goal and tasks whose dependencies are indices into ``tasks``.

    Build one with :meth:`parse` (untrusted input) or :meth:`from_tasks`.
    """

    goal: str
    tasks: tuple[PlanTask, ...]
    repairs: tuple[Repair, ...] = ()
    """The fixes it went through before it was accepted, in order: by the compiler's code
    repairs and by the model (see :func:`planrun.core.repair_plan`); empty for a plan that
    validated as given."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "tasks", tuple(self.tasks))
        object.__setattr__(self, "repairs", tuple(self.repairs))

    @classmethod
    def parse(
        cls,
        raw: object,
        kinds: KindsLike,
        *,
        min_tasks: int = 1,
        max_tasks: int = 50,
        contracts: bool = True,
    ) -> Plan:
        """Parse and validate ``raw`` (text, a plan document or a list of tasks), its
        kinds' contracts included unless ``contracts=False`` (a stored run's plan, read
        back to report on it, is not judged again).

        Raises:
            InvalidPlan: with every problem found; ``raw_outputs`` holds ``raw`` when it
                was text.
            UsageError: ``kinds`` or the bounds are themselves wrong.
        """
        problems, plan = _check(raw, kinds, min_tasks, max_tasks, contracts=contracts)
        if plan is None:
            raise InvalidPlan(problems, raw_outputs=_raw_text(raw))
        return plan

    @classmethod
    def from_tasks(cls, tasks: Sequence[Task], goal: str = "") -> Plan:
        """A plan of task records, their ``depends_on`` ids turned into indices.

        Raises:
            UsageError: a duplicate task id, or a dependency on an id not among ``tasks``.
        """
        index: dict[str, int] = {}
        for i, task in enumerate(tasks):
            if task.id in index:
                raise UsageError(f"task id {task.id!r} appears twice")
            index[task.id] = i
        plan_tasks = []
        for task in tasks:
            missing = [d for d in task.depends_on if d not in index]
            if missing:
                raise UsageError(f"task {task.id!r} depends on unknown task(s) {missing}")
            plan_tasks.append(
                PlanTask(
                    kind=task.kind,
                    payload=copy.deepcopy(dict(task.payload)),
                    depends_on=tuple(index[d] for d in task.depends_on),
                    id=task.id,
                )
            )
        return cls(goal=goal, tasks=tuple(plan_tasks))

    def _sorter(self) -> graphlib.TopologicalSorter[int]:
        n = len(self.tasks)
        sorter: graphlib.TopologicalSorter[int] = graphlib.TopologicalSorter()
        for i, task in enumerate(self.tasks):
            for d in task.depends_on:
                if not 0 <= d < n or d == i:
                    raise InvalidPlan(
                        [Problem(UNKNOWN_DEPENDENCY, i, f"task {i} depends on task {d}")]
                    )
            sorter.add(i, *task.depends_on)
        try:
            sorter.prepare()
        except graphlib.CycleError as exc:
            nodes = sorted(set(exc.args[1]))
            raise InvalidPlan(
                [Problem(CYCLE, nodes[0], f"tasks {nodes} depend on each other in a cycle")]
            ) from exc
        return sorter

    def topological_order(self) -> list[int]:
        """Task indices, every task after its dependencies; ties go in index order.

        This is the smallest such order, so a plan whose dependencies all point backwards
        comes out as ``[0, 1, ..., n-1]``.
        """
        if all(0 <= d < i for i, t in enumerate(self.tasks) for d in t.depends_on):
            return list(range(len(self.tasks)))  # already in order: nothing to sort
        return smallest_order(self._sorter())

    def levels(self) -> list[list[int]]:
        """Task indices in waves: each wave depends only on earlier waves (sorted within)."""
        sorter = self._sorter()
        waves: list[list[int]] = []
        while sorter.is_active():
            wave = sorted(sorter.get_ready())
            waves.append(wave)
            sorter.done(*wave)
        return waves

    def task_ids(self, id_prefix: str = "t") -> list[str]:
        """The id each task gets: its own ``id``, else ``f"{id_prefix}{index}"`` (made unique)."""
        own = [t.id for t in self.tasks]
        if own.count(None) == len(own):  # no task names itself
            return [f"{id_prefix}{i}" for i in range(len(own))]  # distinct: no clash
        taken = {t for t in own if t is not None}
        ids: list[str] = []
        for i, task_id in enumerate(own):
            if task_id is not None:
                ids.append(task_id)
                continue
            candidate, k = f"{id_prefix}{i}", 1
            while candidate in taken:
                candidate, k = f"{id_prefix}{i}_{k}", k + 1
            taken.add(candidate)
            ids.append(candidate)
        return ids

    def to_tasks(self, id_prefix: str = "t", **defaults: Any) -> list[Task]:
        """Task records for this plan, in index order, with ``depends_on`` as ids.

        ``defaults`` sets other :class:`~planrun.core.Task` fields on every record
        (``max_attempts=5``, ``estimate_s=2.0``, ...).

        Raises:
            UsageError: ``defaults`` names a field that is not a settable Task field.
        """
        settable = {f.name for f in dataclasses.fields(Task)} - {
            "id",
            "kind",
            "payload",
            "depends_on",
            "status",
        }
        bad = sorted(set(defaults) - settable)
        if bad:
            raise UsageError(f"to_tasks: cannot set {bad}; settable fields: {sorted(settable)}")
        ids = self.task_ids(id_prefix)
        if defaults:
            return [
                Task(id=ids[i], kind=task.kind, payload=_copied(task.payload),
                     depends_on=tuple([ids[d] for d in task.depends_on]), **defaults)
                for i, task in enumerate(self.tasks)
            ]
        return [  # the same records, built without an empty ** per task
            Task(ids[i], task.kind, _copied(task.payload),
                 depends_on=tuple([ids[d] for d in task.depends_on]) if task.depends_on else ())
            for i, task in enumerate(self.tasks)
        ]

    def to_document(self) -> dict[str, Any]:
        """The plan as the design's index-based document, ready for ``json.dumps``.

        Tasks are written in :meth:`topological_order` (the identity for plans whose
        dependencies all point backwards) so that every ``depends_on`` index is an earlier
        one; a task's ``id`` is kept when it has one. A plan that went through repairs has
        them under ``"repairs"`` (:meth:`Repair.to_dict`, in order).
        """
        order = self.topological_order()
        position = {old: new for new, old in enumerate(order)}
        tasks: list[dict[str, Any]] = []
        for old in order:
            task = self.tasks[old]
            doc: dict[str, Any] = {}
            if task.id is not None:
                doc["id"] = task.id
            doc["kind"] = task.kind
            doc["payload"] = _copied(task.payload)
            doc["depends_on"] = [position[d] for d in task.depends_on]
            tasks.append(doc)
        if self.repairs:
            return {"goal": self.goal, "tasks": tasks,
                    "repairs": [r.to_dict() for r in self.repairs]}
        return {"goal": self.goal, "tasks": tasks}


def _copied(payload: Any) -> Any:
    """A deep copy of a payload (see :func:`_json_copy`)."""
    if type(payload) is dict and not payload:
        return {}
    return _json_copy(payload)


def smallest_order(sorter: graphlib.TopologicalSorter[Any], key: Any = None) -> list[Any]:
    """Drain a prepared ``sorter``: every node after its dependencies, and among the nodes
    ready at once the smallest first (by ``key``, default the node itself)."""
    rank = key or (lambda node: node)
    ready = [(rank(n), n) for n in sorter.get_ready()]
    heapq.heapify(ready)
    order: list[Any] = []
    while ready:
        _, node = heapq.heappop(ready)
        order.append(node)
        sorter.done(node)
        for nxt in sorter.get_ready():
            heapq.heappush(ready, (rank(nxt), nxt))
    return order


def validate_plan(
    raw: object,
    kinds: KindsLike,
    *,
    min_tasks: int = 1,
    max_tasks: int = 50,
    contracts: bool = True,
) -> list[Problem]:
    """Every problem with ``raw``; an empty list means the plan is valid.

    ``raw`` is model text (JSON, JSON in a code fence, or JSON inside prose), ``bytes``,
    a plan document (``{"goal", "tasks"}``) or a bare list of tasks. ``kinds`` is whatever
    :meth:`Registry.of` accepts. Bad input never raises; it yields problems. With
    ``contracts`` (the default) a well-formed plan is also held to the contracts its kinds
    declare (``missing_input``, ``no_deliverable``, ``dead_end``, ``duplicate_task``,
    ``too_many_of_kind``); ``contracts=False`` checks the shape alone.

    Raises:
        UsageError: ``kinds`` or the bounds are themselves wrong (a caller's mistake).
    """
    return _check(raw, kinds, min_tasks, max_tasks, contracts=contracts)[0]


def document_of(raw: object) -> dict[str, Any] | None:
    """The plan document ``raw`` holds, read as :func:`validate_plan` reads it (JSON text,
    fenced or in prose, UTF-8 bytes, a document, a bare list of tasks made a document), or
    None when there is no list of tasks to read."""
    doc = _decoded(raw)
    if isinstance(doc, list | tuple):
        return {"goal": "", "tasks": list(doc)}
    if isinstance(doc, Mapping) and isinstance(doc.get("tasks"), list | tuple):
        goal = doc.get("goal")
        return {"goal": goal if isinstance(goal, str) else "", "tasks": list(doc["tasks"])}
    return None


def plan_schema(kinds: KindsLike, *, min_tasks: int = 1, max_tasks: int = 50,
                goal: bool = True) -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of the plan document for the kinds that exist.

    Each task is one of a variant per kind (``anyOf``), holding that kind's payload schema;
    pydantic ``$defs`` are hoisted to the top level (renamed per kind on a clash), so the
    schema is self-contained. The schema is strict (every property required, no extra
    ones), as structured-output APIs want it. ``goal=False`` leaves the goal out: the
    decomposer asks the model for the tasks only, and the plan keeps the user's goal.

    Of the kinds' contracts, the schema says what JSON Schema can: that the tasks contain
    one of a delivering kind (``contains``; strict structured output drops the keyword and
    the validator enforces it). Needs, counts per kind and unique payloads are beyond it
    (they would take ``allOf`` of ``contains``, which strict mode refuses); the validator
    and the decomposer's prompt carry them.
    """
    _check_bounds(min_tasks, max_tasks)
    registry = _registry(kinds)
    defs: dict[str, Any] = {}
    variants: list[dict[str, Any]] = []
    for spec in registry:
        variants.append(_task_variant(spec, defs))
    items: Any = {"anyOf": variants} if variants else False
    tasks: dict[str, Any] = {
        "type": "array",
        "minItems": min_tasks,
        "maxItems": max_tasks,
        "items": items,
    }
    delivering = [spec.name for spec in registry if spec.delivers]
    if delivering:
        tasks["contains"] = {"type": "object", "properties": {"kind": {"enum": delivering}},
                             "required": ["kind"]}
    schema: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Plan",
        "description": (
            ("A goal and the tasks that reach it." if goal else "The tasks that reach the goal.")
            + " depends_on holds zero-based indices of earlier tasks."
        ),
        "type": "object",
        "properties": {**({"goal": {"type": "string"}} if goal else {}), "tasks": tasks},
        "required": ["goal", "tasks"] if goal else ["tasks"],
        "additionalProperties": False,
    }
    if defs:
        schema["$defs"] = defs
    return schema


# --------------------------------------------------------------------------- internals


def _task_variant(spec: KindSpec, defs: dict[str, Any]) -> dict[str, Any]:
    """The schema of a task of ``spec``'s kind (its payload's ``$defs`` hoisted into
    ``defs``)."""
    payload = _hoist_defs(copy.deepcopy(spec.payload_schema()), spec.name, defs)
    variant: dict[str, Any] = {
        "type": "object",
        "properties": {
            "kind": {"type": "string", "enum": [spec.name]},
            "payload": payload,
            "depends_on": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        },
        "required": ["kind", "payload", "depends_on"],
        "additionalProperties": False,
    }
    if spec.description:
        variant["description"] = spec.description
    return variant


class _Draft:
    """What pass one learned about a task entry (:func:`_read_task` sets every field).

    A plain class with slots: one is made per task of every plan read, and each container
    made here outlives the read (the garbage collector's passes count them)."""

    __slots__ = ("deps", "id", "kind", "ok", "payload")

    def __init__(self, payload: dict[str, Any]) -> None:
        self.kind: str | None = None
        self.payload = payload
        self.deps: Sequence[int | str] = ()
        self.id: str | None = None
        self.ok = True


_new_object: Final = object.__new__


def _plan_task(kind: str, payload: dict[str, Any], depends_on: tuple[int, ...],
               task_id: str | None) -> PlanTask:
    """``PlanTask(kind, payload, depends_on, task_id)`` from fields already checked: stored
    in order, as the frozen dataclass stores them, without its ``__setattr__`` per field."""
    task = _new_object(PlanTask)
    state = task.__dict__
    state["kind"], state["payload"], state["depends_on"], state["id"] = (
        kind, payload, depends_on, task_id)
    return task


def _registry(kinds: KindsLike) -> Registry:
    if isinstance(kinds, str | bytes):
        raise UsageError(
            "kinds must be a Registry, an iterable of kind names or a name -> payload model "
            f"mapping, not a string; did you mean [{kinds!r}]?"
        )
    return Registry.of(kinds)


def _check_bounds(min_tasks: int, max_tasks: int) -> None:
    for name, value in (("min_tasks", min_tasks), ("max_tasks", max_tasks)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise UsageError(f"{name} must be an int, got {value!r}")
    if min_tasks < 0:
        raise UsageError(f"min_tasks must be >= 0, got {min_tasks}")
    if max_tasks < max(min_tasks, 1):
        raise UsageError(f"max_tasks must be >= max(min_tasks, 1), got {max_tasks}")


def _raw_text(raw: object) -> list[str]:
    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, bytes | bytearray):
        return [bytes(raw).decode("utf-8", errors="replace")]
    return []


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def _describe(value: object) -> str:
    """``integer 3``, ``string '0'``, ``array``: a short name for a value in a message."""
    kind = _json_type(value)
    if isinstance(value, list | tuple | Mapping):
        return kind
    if isinstance(value, bool | type(None)):
        text = json.dumps(value)
    elif isinstance(value, int):
        text = _int_text(value)
    elif isinstance(value, str) and len(value) > 40:
        text = repr(value[:40])
    else:
        text = repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{kind} {text}"


def _quoted(names: Iterable[str]) -> str:
    return ", ".join(repr(n) for n in names)


def _range(n: int) -> str:
    return "only task 0" if n == 1 else f"0..{n - 1}"


def _looks_like_plan(value: object) -> bool:
    if isinstance(value, dict):
        return "tasks" in value
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, dict) and "kind" in t for t in value)
    )


def _pick(candidates: list[Any]) -> Any:
    for value in candidates:
        if _looks_like_plan(value):
            return value
    return candidates[0]


def _json_error(exc: ValueError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    return str(exc)


def _loads(text: str) -> tuple[bool, Any, str]:
    """``(True, value, "")`` for an object or list; else ``(False, _TOO_DEEP or None, why)``."""
    try:
        value = json.loads(text)
    except RecursionError:
        return False, _TOO_DEEP, "nested too deeply"
    except ValueError as exc:
        return False, None, _json_error(exc)
    if not isinstance(value, dict | list):
        return False, None, f"it is a JSON {_json_type(value)}, not an object or a list"
    return True, value, ""


def _region_end(text: str, start: int) -> tuple[int | None, bool]:
    """Where the bracketed region opening at ``start`` ends, and whether it nests too deeply.

    Brackets inside JSON strings do not count. The end is None when the region never
    closes (the rest of the text is inside it) or when it nests past the bound.
    """
    depth = 0
    for match in _JSON_TOKEN.finditer(text, start):
        char = match.group()[0]
        if char == '"':
            continue
        if char in "[{":
            depth += 1
            if depth > _MAX_DEPTH:
                return None, True
        else:
            depth -= 1
            if depth == 0:
                return match.end(), False
    return None, False


def _scan(text: str) -> tuple[list[Any], bool]:
    """The whole JSON objects and lists standing in ``text``'s prose, left to right.

    Only values at the top level of the prose count: a region that does not parse is
    skipped whole, never searched for a value nested inside it. Linear in the text.
    Returns the values and whether some region nests too deeply.
    """
    decoder = json.JSONDecoder()
    found: list[Any] = []
    pos = 0
    while len(found) < _MAX_CANDIDATES:
        match = _JSON_START.search(text, pos)
        if match is None:
            break
        start = match.start()
        try:
            value, end = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):
            region_end, too_deep = _region_end(text, start)
            if too_deep:
                return found, True
            if region_end is None:
                break  # never closed: what follows is inside it, not beside it
            pos = region_end
            continue
        found.append(value)
        pos = end
    return found, False


def _decode_text(text: str) -> tuple[Any, str]:
    """Find the plan JSON in model text: whole text, then code fences, then a scan.

    Returns ``(value, "")``, ``(_TOO_DEEP, "")`` or ``(None, why nothing was found)``.
    """
    stripped = text.strip()
    ok, value, why = _loads(stripped)
    if ok or value is _TOO_DEEP:
        return value, ""
    fenced = []
    for match in _FENCE.finditer(text):
        ok, found, _ = _loads(match.group(2).strip())
        if ok:
            fenced.append(found)
        elif found is _TOO_DEEP:
            return _TOO_DEEP, ""
    if fenced:
        return _pick(fenced), ""
    scanned, too_deep = _scan(text)
    if too_deep:
        return _TOO_DEEP, ""
    if scanned:
        return _pick(scanned), ""
    if stripped[:1] in ("{", "["):
        return None, f"the text is not valid JSON ({why})"
    return None, "no JSON object or list found in the text"


def _int_text(value: int) -> str:
    """``value`` as digits, or ``an integer of about N digits`` when it is huge."""
    if value.bit_length() <= _BIG_INT_BITS:
        return str(value)
    digits = int(value.bit_length() * 0.30103) + 1
    return f"{'-' if value < 0 else ''}an integer of about {digits} digits"


def _path_text(path: Sequence[object]) -> str:
    text = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")
    return text if len(text) <= 80 else text[:37] + "..." + text[-40:]


def _within_bounds(doc: object, limit: int = _MAX_DEPTH) -> bool:
    """True when ``doc`` nests no deeper than ``limit`` levels, is made of dicts, lists and
    tuples, and has string keys only; level by level, no recursion."""
    level, depth = [doc], 1
    while level:
        if depth > limit:
            return False
        below: list[object] = []
        keys: list[Iterable[object]] = []
        for value in level:
            kind = type(value)
            if kind is dict:
                assert isinstance(value, dict)
                keys.append(value)
                children: Iterable[object] = value.values()
            elif kind is list or kind is tuple:
                assert isinstance(value, list | tuple)
                children = value
            else:
                return False
            below += [c for c in children if type(c) in _CONTAINERS]
        if keys and not set(map(type, chain.from_iterable(keys))) <= _ONLY_STR:
            return False
        level, depth = below, depth + 1
    return True


_CONTAINERS: Final = (dict, list, tuple)
_ONLY_STR: Final = frozenset((str,))


def _strict_problems(doc: object) -> tuple[list[Problem], bool]:
    """Values strict JSON cannot carry, and nesting past the bound; iterative, linear.

    Returns the problems (at most ``_MAX_STRICT_PROBLEMS``) and whether one of them is
    nesting too deep (then nothing below the bound was looked at). The common case, a
    plan with nothing wrong, is two C-speed passes; only a plan with a problem is walked
    value by value to say where.
    """
    if _within_bounds(doc):
        try:
            json.dumps(doc, allow_nan=False, ensure_ascii=False).encode("utf-8")
        except (ValueError, TypeError, UnicodeEncodeError, RecursionError):
            pass
        else:
            return [], False
    problems: list[Problem] = []
    too_deep = False
    max_digits = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 0
    stack: list[tuple[object, int, tuple[object, ...]]] = [(doc, 1, ())]
    while stack and len(problems) < _MAX_STRICT_PROBLEMS:
        value, depth, path = stack.pop()
        why = _not_strict(value, max_digits)
        if why is None and isinstance(value, Mapping | list | tuple):
            if depth > _MAX_DEPTH:
                too_deep = True
                why = (f"nested more than {_MAX_DEPTH} levels deep; a plan needs far fewer "
                       "— flatten the payload")
            elif isinstance(value, Mapping):
                for key, item in value.items():
                    if not isinstance(key, str) or _not_strict(key, 0) is not None:
                        why = f"has a key {_describe(key)}; keys must be strings of UTF-8 text"
                        break
                    stack.append((item, depth + 1, (*path, key)))
            else:
                stack.extend((item, depth + 1, (*path, i)) for i, item in enumerate(value))
        if why is not None:
            problems.append(_strict_problem(doc, path, why))
    return problems, too_deep


def _not_strict(value: object, max_digits: int) -> str | None:
    """Why ``value`` itself cannot be written as strict JSON, or None."""
    if value is None or isinstance(value, bool | Mapping | list | tuple):
        return None
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "is a string with a lone surrogate, which UTF-8 (and so JSON) cannot carry"
        return None
    if isinstance(value, int):
        if max_digits and value.bit_length() * 0.30103 > max_digits - 1:
            return f"is {_int_text(value)}, more than JSON readers accept ({max_digits})"
        return None
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return f"is {value!r}, which strict JSON cannot carry; use a finite number or null"
        return None
    return f"is a Python {type(value).__name__}, which JSON cannot carry"


def _strict_problem(doc: object, path: tuple[object, ...], why: str) -> Problem:
    task: int | None = None
    rest = path
    if isinstance(doc, Mapping) and path[:1] == ("tasks",) and len(path) > 1:
        task, rest = path[1] if isinstance(path[1], int) else None, path[2:]
    elif isinstance(doc, list | tuple) and path and isinstance(path[0], int):
        task, rest = path[0], path[1:]
    code = INVALID_PAYLOAD if task is not None and rest[:1] == ("payload",) else SCHEMA
    if task is not None and "nested more than" in why:
        code = SCHEMA
    where = _path_text(rest) if task is not None else _path_text(path)
    return Problem(code, task, f"{where or 'the plan'} {why}")


def _suggest(name: str, choices: Sequence[str], *, cutoff: float = 0.6) -> str | None:
    def norm(s: str) -> str:
        return re.sub(r"[\s_\-]+", "", s.lower())

    for choice in choices:
        if norm(choice) == norm(name):
            return choice
    lowered = {c.lower(): c for c in choices}
    match = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=cutoff)
    return lowered[match[0]] if match else None


def _known_kinds(registry: Registry) -> str:
    names = registry.names
    if not names:
        return "no kinds are registered, so no task can run"
    listed = _quoted(names[:_MAX_LISTED_KINDS])
    more = len(names) - _MAX_LISTED_KINDS
    return f"known kinds: {listed}" + (f" and {more} more" if more > 0 else "")


def _pydantic_messages(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err.get("loc", ())) or "(payload)"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)


def _payload_fields(model: type[BaseModel]) -> str:
    parts = [
        name if info.is_required() else f"{name} (optional)"
        for name, info in model.model_fields.items()
    ]
    return ", ".join(parts) if parts else "no fields"


def _check(
    raw: object, kinds: KindsLike, min_tasks: int, max_tasks: int, *,
    contracts: bool = True,
) -> tuple[list[Problem], Plan | None]:
    with _collector_paused(raw):
        problems, plan = _check_now(raw, kinds, min_tasks, max_tasks, contracts=contracts)
    if plan is not None and contracts:
        registry = _registry(kinds)
        if registry.has_contracts:
            broken = _contracts_of(registry, [(t.kind, t.payload, t.depends_on)
                                              for t in plan.tasks])
            if broken:
                return broken, None
    return problems, plan


def _contracts_of(registry: Registry,
                  tasks: Iterable[tuple[str, Any, Sequence[int]]]) -> list[Problem]:
    """What a plan's tasks (kind, payload, dependencies by index) break of the kinds'
    contracts."""
    nodes = [Node(kind, payload, tuple(deps), label=i)
             for i, (kind, payload, deps) in enumerate(tasks)]
    return contract_problems(nodes, registry)


_LARGE_INPUT: Final = 1_000_000
"""Input this large (characters, or tasks times 100) is read with the cyclic collector off."""


@contextlib.contextmanager
def _collector_paused(raw: object) -> Iterator[None]:
    """Pause the cyclic garbage collector while a large plan is read.

    Reading creates objects by the hundred thousand and no reference cycles, yet each
    collection walks the whole plan again: on a 100,000-task plan the collector alone
    doubles the time. Refcounting still frees everything; the collector resumes after.
    """
    size = len(raw) if isinstance(raw, str | bytes | bytearray) else 0
    if isinstance(raw, Mapping) and isinstance(raw.get("tasks"), list | tuple):
        size = 100 * len(raw["tasks"])
    elif isinstance(raw, list | tuple):
        size = 100 * len(raw)
    if size < _LARGE_INPUT or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _check_now(
    raw: object, kinds: KindsLike, min_tasks: int, max_tasks: int, *,
    contracts: bool = True,
) -> tuple[list[Problem], Plan | None]:
    """Validate ``raw``'s shape. A plan it returns is then held to the kinds' contracts by
    :func:`_check`; one with other problems is too, here, when its graph is sound, so that
    every problem is reported at once."""
    _check_bounds(min_tasks, max_tasks)
    registry = _registry(kinds)
    doc = _decoded(raw)
    if isinstance(doc, Problem):
        return [doc], None
    parsed_here = isinstance(raw, str | bytes | bytearray)  # nobody else holds its payloads

    strict, too_deep = _strict_problems(doc)
    if too_deep:
        return strict, None
    problems: list[Problem] = list(strict)
    goal, entries = _goal_and_entries(doc, problems)
    if entries is None:
        return problems, None
    problems.extend(_count_problems(len(entries), min_tasks, max_tasks))

    refused = {p.task for p in strict if p.code == INVALID_PAYLOAD}
    specs = {spec.name: spec for spec in registry}
    drafts = [
        _read_task(i, entry, registry, problems, check_payload=i not in refused,
                   copy_payload=not parsed_here, specs=specs)
        for i, entry in enumerate(entries)
    ]
    ids = _unique_ids(drafts, problems)
    resolved = [_resolve_deps(i, draft, len(entries), ids, problems) if draft.deps else []
                for i, draft in enumerate(drafts)]
    problems.extend(_cycle_problems(resolved, drafts))

    if problems:
        if contracts and registry.has_contracts and all(
                draft.kind in registry for draft in drafts) and not any(
                p.code in _GRAPH_CODES for p in problems):
            problems.extend(_contracts_of(registry, (
                (draft.kind or "", draft.payload, resolved[i]) for i, draft in enumerate(drafts))))
        # document-level problems first, then by task index (stable: field order kept)
        problems.sort(key=lambda p: -1 if p.task is None else p.task)
        return problems, None
    tasks = tuple([_plan_task(draft.kind or "", draft.payload, tuple(resolved[i]), draft.id)
                   for i, draft in enumerate(drafts)])
    return [], Plan(goal=goal, tasks=tasks)


def _decoded(raw: object) -> object:
    """``raw`` as a document: text (or UTF-8 bytes) parsed as JSON, anything else as it
    is; the :class:`Problem` that stops it (not UTF-8, not JSON, nested too deep)."""
    doc: object = raw
    if isinstance(raw, bytes | bytearray):
        try:
            doc = bytes(raw).decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            return Problem(NOT_JSON, None,
                           f"the input is not UTF-8 text ({exc.reason} at byte {exc.start}); "
                           f"send the plan as JSON: {_SHAPE_HINT}")
    if isinstance(doc, str):
        doc, why = _decode_text(doc)
        if doc is _TOO_DEEP:
            return Problem(SCHEMA, None,
                           f"the JSON is nested more than {_MAX_DEPTH} levels deep; a plan "
                           f"needs far fewer: {_SHAPE_HINT}")
        if doc is None:
            return Problem(NOT_JSON, None, f"{why}; reply with the plan as JSON: {_SHAPE_HINT}")
    return doc


def _goal_and_entries(doc: object,
                      problems: list[Problem]) -> tuple[str, Sequence[object] | None]:
    """The goal and the task entries of a plan document (or a bare list of tasks); the
    entries are None when the document has no list of them (its problems listed)."""
    if isinstance(doc, list | tuple):
        return "", doc
    if not isinstance(doc, Mapping):
        problems.append(Problem(SCHEMA, None, f"expected a plan object {_SHAPE_HINT} or a "
                                f"list of tasks, got {_describe(doc)}"))
        return "", None
    goal = ""
    entries: Sequence[object] | None = None
    if "tasks" not in doc:
        hint = (
            " (this looks like a single task; put it in a list: "
            '{"goal": "...", "tasks": [ <the task> ]})'
            if "kind" in doc
            else ""
        )
        problems.append(
            Problem(SCHEMA, None, f"the plan has no 'tasks' list{hint}; expected {_SHAPE_HINT}")
        )
    elif not isinstance(doc["tasks"], list | tuple):
        problems.append(Problem(SCHEMA, None, "'tasks' must be a list of task objects, got "
                                f"{_describe(doc['tasks'])}"))
    else:
        entries = doc["tasks"]
    if "goal" in doc:
        if isinstance(doc["goal"], str):
            goal = doc["goal"]
        else:
            problems.append(
                Problem(SCHEMA, None, f"'goal' must be a string, got {_describe(doc['goal'])}")
            )
    return goal, entries


def _count_problems(n: int, min_tasks: int, max_tasks: int) -> list[Problem]:
    """A plan of ``n`` tasks outside the bounds."""
    if n < min_tasks:
        return [Problem(TOO_FEW_TASKS, None,
                        f"the plan has {n} task{'s' if n != 1 else ''}; it needs at least "
                        f"{min_tasks} — add the steps that reach the goal")]
    if n > max_tasks:
        return [Problem(TOO_MANY_TASKS, None,
                        f"the plan has {n} tasks; at most {max_tasks} are allowed "
                        "— merge related steps into fewer tasks")]
    return []


def _unique_ids(drafts: list[_Draft], problems: list[Problem]) -> dict[str, int]:
    """Task id -> index, for the tasks that name themselves; a second use is a problem."""
    ids: dict[str, int] = {}
    for i, draft in enumerate(drafts):
        if draft.id is None:
            continue
        if draft.id in ids:
            problems.append(Problem(SCHEMA, i, f"id {draft.id!r} is already used by task "
                                    f"{ids[draft.id]}; ids must be unique — rename one"))
            draft.ok = False
        else:
            ids[draft.id] = i
    return ids


def _cycle_problems(resolved: list[list[int]], drafts: list[_Draft]) -> list[Problem]:
    """The dependency cycles (the first ones, then a count of the rest)."""
    cycles, groups = _find_cycles(resolved)
    found = [_cycle_problem(c, drafts) for c in cycles]
    if groups > len(cycles):
        found.append(Problem(CYCLE, None,
                             f"{groups - len(cycles)} more dependency cycles are not listed "
                             f"({groups} in all); fix the ones above and validate again"))
    return found

def _read_task(
    i: int,
    entry: object,
    registry: Registry,
    problems: list[Problem],
    *,
    check_payload: bool = True,
    copy_payload: bool = True,
    specs: Mapping[str, KindSpec] | None = None,
) -> _Draft:
    """Pass one over task ``i``: shape, kind, payload; dependencies are kept for pass two.
    A field that cannot be read as given makes the draft not ``ok``."""
    if type(entry) is not dict and not isinstance(entry, Mapping):
        problems.append(Problem(SCHEMA, i, "a task must be an object "
                                '{"kind": "...", "payload": {...}, "depends_on": [...]}, '
                                f"got {_describe(entry)}"))
        draft = _Draft({})
        draft.ok = False
        return draft
    payload = entry.get("payload", _NO_PAYLOAD)
    draft = _Draft(_copy_payload(payload) if copy_payload and payload else
                   dict(payload) if type(payload) is dict or isinstance(payload, Mapping)
                   else {})
    before = len(problems)
    if not entry.keys() <= _TASK_FIELD_SET:
        _read_fields(i, entry, problems)
    spec = _read_kind(i, entry, registry, draft, problems,
                      specs if specs is not None else {s.name: s for s in registry})
    bad = len(problems) > before  # a field, the kind: the task cannot be read as given
    if payload is not _NO_PAYLOAD and type(payload) is not dict \
            and not isinstance(payload, Mapping):
        problems.append(Problem(SCHEMA, i, "'payload' must be an object (use {} for "
                                f"none), got {_describe(payload)}"))
        bad, spec = True, None
    if check_payload and spec is not None and spec.payload_model is not None:
        _check_payload(i, spec, spec.payload_model, draft.payload, problems)
    if "depends_on" in entry:
        deps = entry["depends_on"]
        if isinstance(deps, list | tuple):
            if deps:
                draft.deps = _read_deps(i, deps, problems)  # a bad entry is listed there
        else:
            _bad_depends_on(i, deps, problems)
            bad = True
    if "id" in entry:
        task_id = entry["id"]
        if isinstance(task_id, str) and task_id:
            draft.id = task_id
        else:
            problems.append(
                Problem(SCHEMA, i, f"'id' must be a non-empty string, got {_describe(task_id)}"))
            bad = True
    draft.ok = not bad
    return draft


_NO_PAYLOAD: Final[Any] = object()
"""A task entry without ``payload`` (its payload is then ``{}``)."""

_SCALARS: Final = frozenset((str, int, float, bool, type(None)))


def _copy_payload(payload: object) -> dict[str, Any]:
    """A payload as a dict of its own: a deep copy, so that the caller changing its document
    later changes nothing in the plan. JSON data (what a valid plan holds) is copied by
    :func:`_json_copy`; anything else by :func:`copy.deepcopy`. Not a mapping: ``{}``
    (the caller lists the problem)."""
    if type(payload) is dict:
        return _json_copy(payload)  # type: ignore[no-any-return]
    if isinstance(payload, Mapping):
        return _json_copy(dict(payload))  # type: ignore[no-any-return]
    return {}


def _json_copy(value: Any) -> Any:
    """A deep copy of ``value``: dicts, lists and tuples copied level by level, strings,
    numbers, booleans and None shared (immutable, as ``copy.deepcopy`` shares them), any
    other value through ``copy.deepcopy``. Equal to ``copy.deepcopy`` on JSON data, with
    no memo: a plan's payloads are trees (read from JSON, or checked as strict JSON)."""
    kind = type(value)
    if kind is dict:
        return {k: v if type(v) in _SCALARS else _json_copy(v) for k, v in value.items()}
    if kind is list:
        return [v if type(v) in _SCALARS else _json_copy(v) for v in value]
    if kind is tuple:
        return tuple([v if type(v) in _SCALARS else _json_copy(v) for v in value])
    if kind in _SCALARS:
        return value
    return copy.deepcopy(value)


def _read_fields(i: int, entry: Mapping[Any, Any], problems: list[Problem]) -> None:
    """A task's fields it should not have, with the field each was perhaps meant to be."""
    unknown = [k for k in entry if k not in _TASK_FIELD_SET]
    if not unknown:
        return
    hints = []
    for key in unknown:
        guess = _suggest(key, _TASK_FIELDS, cutoff=0.5) if isinstance(key, str) else None
        hints.append(f"{key!r} (did you mean {guess!r}?)" if guess else repr(key))
    problems.append(Problem(SCHEMA, i, f"unknown field(s) {', '.join(hints)}; a task has only "
                            "'kind', 'payload', 'depends_on' and an optional 'id'"))


def _read_kind(i: int, entry: Mapping[Any, Any], registry: Registry, draft: _Draft,
               problems: list[Problem], specs: Mapping[str, KindSpec]) -> KindSpec | None:
    """The task's kind into ``draft``; its spec when the registry knows it."""
    if "kind" not in entry:
        problems.append(Problem(SCHEMA, i, "missing 'kind' (the worker kind to run); "
                                f"{_known_kinds(registry)}"))
        return None
    kind = entry["kind"]
    if not isinstance(kind, str):
        problems.append(Problem(SCHEMA, i, "'kind' must be a string naming a worker kind, got "
                                f"{_describe(kind)}"))
        return None
    draft.kind = kind
    spec = specs.get(kind)
    if spec is not None:
        return spec
    guess = _suggest(kind, registry.names)
    did_you_mean = f" did you mean {guess!r}?" if guess else ""
    problems.append(Problem(UNKNOWN_KIND, i, f"unknown kind {kind!r};{did_you_mean} "
                            f"{_known_kinds(registry)}"))
    return None


def _bad_depends_on(i: int, deps: object, problems: list[Problem]) -> None:
    """A task's ``depends_on`` that is not a list, with how to write it."""
    hint = ""
    if isinstance(deps, int) and not isinstance(deps, bool):
        hint = f"; write [{_int_text(deps)}]"
    elif isinstance(deps, str) and deps.strip().isdigit():
        hint = f"; write [{deps.strip()}]"
    problems.append(Problem(SCHEMA, i, "'depends_on' must be a list of indices of earlier "
                            f"tasks (use [] for none), got {_describe(deps)}{hint}"))


def _check_payload(
    i: int,
    spec: KindSpec,
    model: type[BaseModel],
    payload: dict[str, Any],
    problems: list[Problem],
) -> None:
    try:
        model.model_validate(payload)
    except ValidationError as exc:
        detail = _pydantic_messages(exc)
    except Exception as exc:  # a custom validator may raise anything; report, never crash
        detail = f"{type(exc).__name__}: {exc}"
    else:
        return
    problems.append(
        Problem(
            INVALID_PAYLOAD,
            i,
            f"payload for {spec.name!r} is invalid: {detail} "
            f"(payload fields: {_payload_fields(model)})",
        )
    )


def _read_deps(i: int, deps: Sequence[object], problems: list[Problem]) -> list[int | str]:
    if all(type(dep) is int or type(dep) is str for dep in deps):  # the usual case
        return list(dict.fromkeys(deps))  # type: ignore[arg-type]
    out: list[int | str] = []
    seen: set[int | str] = set()
    for j, dep in enumerate(deps):
        if isinstance(dep, bool) or not isinstance(dep, int | str):
            problems.append(
                Problem(
                    SCHEMA,
                    i,
                    f"depends_on[{j}] is {_describe(dep)}; an entry must be the index of an "
                    "earlier task (an integer) or a task id (a string)",
                )
            )
            continue
        if dep not in seen:
            seen.add(dep)
            out.append(dep)
    return out


def _resolve_deps(
    i: int, draft: _Draft, n: int, ids: Mapping[str, int], problems: list[Problem]
) -> list[int]:
    """Pass two: check each dependency of task ``i``; return the ones that can be edges."""
    edges: list[int] = []
    seen: set[int] = set()
    for dep in draft.deps:
        index = _by_id(i, dep, ids, problems) if isinstance(dep, str) else dep
        if index is None:
            continue
        problem = _dependency_problem(i, index, n, dep)
        if problem is not None:
            problems.append(problem)
        elif index not in seen:
            seen.add(index)
            edges.append(index)
    return edges


def _by_id(i: int, dep: str, ids: Mapping[str, int], problems: list[Problem]) -> int | None:
    """The index of the task a dependency names by id; None (a problem listed) for an id
    no task has."""
    if dep in ids:
        return ids[dep]
    hint = ""
    if dep.strip().lstrip("-").isdigit():
        hint = f"; to name task {dep.strip()} by index write {dep.strip()} unquoted"
    known = f"known ids: {_quoted(ids)}" if ids else "no task has an id"
    problems.append(Problem(UNKNOWN_DEPENDENCY, i, f"task {i} depends on id {dep!r}, which "
                            f"no task has ({known}){hint}"))
    return None


def _dependency_problem(i: int, dep: int, n: int, given: int | str) -> Problem | None:
    """What is wrong with task ``i`` depending on task ``dep`` of ``n`` (None: nothing).
    ``given`` is how the plan named it: by index, only an earlier task will do; by id, any
    other task (a cycle is found later)."""
    if dep == i:
        named = f" (id {given!r}); remove {given!r}" if isinstance(given, str) else \
            f"; remove {i}"
        return Problem(SELF_DEPENDENCY, i, f"task {i} depends on itself{named} from its "
                       "depends_on")
    if isinstance(given, str) or 0 <= dep < i:
        return None
    if i < dep < n:
        if i == 0:
            advice = "the first task can depend on no task; reorder the tasks"
        else:
            earlier = "0" if i == 1 else f"0..{i - 1}"
            advice = f"depend only on earlier tasks ({earlier})"
        return Problem(FORWARD_DEPENDENCY, i, f"task {i} depends on task {_int_text(dep)}, "
                       f"which comes later; {advice}")
    where = "indices start at 0" if dep < 0 else f"the plan has {n} tasks ({_range(n)})"
    return Problem(UNKNOWN_DEPENDENCY, i, f"task {i} depends on task {_int_text(dep)}, which "
                   f"does not exist; {where}")

def _strong_components(graph: Sequence[Sequence[int]]) -> list[list[int]]:
    """Tarjan's strongly connected components, iteratively (no recursion on user data)."""
    n = len(graph)
    index = [-1] * n
    low = [0] * n
    on_stack = [False] * n
    stack: list[int] = []
    components: list[list[int]] = []
    counter = 0
    for root in range(n):
        if index[root] != -1:
            continue
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack[root] = True
        work = [(root, 0)]
        while work:
            v, i = work[-1]
            edges = graph[v]
            if i < len(edges):
                work[-1] = (v, i + 1)
                w = edges[i]
                if index[w] == -1:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack[w] = True
                    work.append((w, 0))
                elif on_stack[w]:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
            if low[v] == index[v]:
                component: list[int] = []
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    component.append(w)
                    if w == v:
                        break
                components.append(component)
    return components


def _cycle_through(start: int, members: set[int], graph: Sequence[Sequence[int]]) -> list[int]:
    """A shortest cycle through ``start`` inside its component, as a chain in which each
    task depends on the next and the last depends on ``start`` (breadth-first, linear)."""
    parent: dict[int, int] = {start: start}
    queue = [start]
    for node in queue:
        for dep in graph[node]:
            if dep == start:
                chain = [node]
                while chain[-1] != start:
                    chain.append(parent[chain[-1]])
                return chain[::-1]
            if dep in members and dep not in parent:
                parent[dep] = node
                queue.append(dep)
    raise AssertionError("a strongly connected component always holds a cycle")


def _find_cycles(deps: Sequence[Sequence[int]]) -> tuple[list[list[int]], int]:
    """One cycle per group of tasks that depend on each other in a circle, smallest task
    first, at most ``_MAX_CYCLES`` of them; and how many such groups there are.

    Linear in tasks plus dependencies whatever the plan's shape.
    """
    if all(d < i for i, edges in enumerate(deps) for d in edges):
        return [], 0  # every edge points back: no cycle is possible
    cyclic = [c for c in _strong_components(deps) if len(c) > 1]
    cyclic.sort(key=min)
    cycles = [_cycle_through(min(c), set(c), deps) for c in cyclic[:_MAX_CYCLES]]
    return cycles, len(cyclic)


def _label(i: int, drafts: Sequence[_Draft]) -> str:
    draft = drafts[i]
    return f"task {i} ({draft.id!r})" if draft.id is not None else f"task {i}"


def _cycle_problem(chain: list[int], drafts: Sequence[_Draft]) -> Problem:
    """``chain[k]`` depends on ``chain[k + 1]``; the last depends on ``chain[0]``."""
    nodes = chain
    text = _label(chain[0], drafts)
    for node in chain[1:]:
        text += f" depends on {_label(node, drafts)}, which"
    text += f" depends on task {chain[0]}"
    return Problem(
        CYCLE,
        chain[0],
        f"dependency cycle: {text}; tasks in a cycle can never start — remove one of these "
        f"dependencies (tasks {sorted(nodes)})",
    )


# ----------------------------------------------------------------- schema $defs hoisting

_DEFS_PREFIX: Final = "#/$defs/"


def _rewrite_refs(node: Any, rename: Mapping[str, str]) -> Any:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str) and value.startswith(_DEFS_PREFIX):
                head, sep, rest = value[len(_DEFS_PREFIX) :].partition("/")
                name = head.replace("~1", "/").replace("~0", "~")
                new = rename.get(name, name).replace("~", "~0").replace("/", "~1")
                out[key] = f"{_DEFS_PREFIX}{new}{sep}{rest}"
            else:
                out[key] = _rewrite_refs(value, rename)
        return out
    if isinstance(node, list):
        return [_rewrite_refs(v, rename) for v in node]
    return node


def _hoist_defs(schema: dict[str, Any], kind: str, defs: dict[str, Any]) -> dict[str, Any]:
    """Move ``schema``'s ``$defs`` into ``defs``; rename them all if any name clashes."""
    local = schema.pop("$defs", None)
    if not isinstance(local, dict) or not local:
        return schema
    if all(name not in defs or defs[name] == body for name, body in local.items()):
        defs.update(local)
        return schema
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", kind)
    rename: dict[str, str] = {}
    for name in local:
        new, k = f"{safe}__{name}", 1
        while new in defs or new in rename.values():
            new, k = f"{safe}__{name}_{k}", k + 1
        rename[name] = new
    for name, body in local.items():
        defs[rename[name]] = _rewrite_refs(body, rename)
    rewritten: dict[str, Any] = _rewrite_refs(schema, rename)
    return rewritten
