"""Worker kinds and the workers that do them.

A *kind* is a name for a piece of work (``classify_ticket``) with a description, an
optional payload model, an optional result model and a handler that does it. A *worker* is
a named slot pool that can do some kinds, each at a speed (``skill``), ``capacity`` tasks at
a time. The supervisor routes by kind and never looks inside a handler.

    registry = Registry()

    @registry.kind("classify_ticket", payload=Ticket, result=Label,
                   description="Label one support ticket")
    async def classify(payload: Ticket, ctx: TaskContext) -> Label: ...

Handlers may be ``async def`` or plain functions (run in a thread); they take the payload
(validated into the payload model when the kind has one) and a :class:`TaskContext`.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pydantic import BaseModel

from planrun.core._errors import UsageError

if TYPE_CHECKING:
    from planrun.core.scheduling import TierChoice

__all__ = [
    "Handler",
    "KindSpec",
    "Need",
    "Registry",
    "SpawnRequest",
    "TaskContext",
    "WorkerSpec",
    "idempotency_key",
]

Handler = Callable[[Any, "TaskContext"], Any | Awaitable[Any]]
"""``handler(payload, ctx)``: returns the result, or an awaitable of it."""

F = TypeVar("F", bound=Callable[..., Any])


class _Heartbeat(Protocol):
    def __call__(self) -> None: ...


def idempotency_key(run_id: str, task_id: str, payload: Mapping[str, Any]) -> str:
    """A key that stays the same across retries and resumes of one task of one run."""
    blob = json.dumps(
        {"run": run_id, "task": task_id, "payload": payload}, sort_keys=True, default=str
    )
    return "planrun-" + hashlib.sha256(blob.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class SpawnRequest:
    """One task a handler asked to add to its run (see :meth:`TaskContext.spawn`).

    ``depends_on`` names task ids: tasks of the run, or tasks spawned earlier by the same
    attempt (the ids :meth:`TaskContext.spawn` returned). ``joins`` names tasks whose spawned
    tasks (all of them, at any depth) the new task also waits for.
    """

    kind: str
    payload: Mapping[str, Any] = field(default_factory=dict)
    depends_on: tuple[str, ...] = ()
    joins: tuple[str, ...] = ()
    estimate_s: float = 1.0


def _needs(kind: str, needs: object) -> tuple[Need, ...]:
    """``needs`` as a tuple of kind names and tuples of alternatives, or a UsageError."""
    items = (needs,) if isinstance(needs, str) else needs
    if not isinstance(items, tuple | list):
        raise UsageError(f"kind {kind!r}: needs must be a list of kinds (or tuples of kinds "
                         f"any one of which will do), got {type(needs).__name__}")
    out: list[Need] = []
    for item in items:
        if isinstance(item, str) and item:
            out.append(item)
        elif isinstance(item, tuple | list) and item and all(
                isinstance(k, str) and k for k in item):
            out.append(tuple(item))
        else:
            raise UsageError(f"kind {kind!r}: each need is a kind name or a tuple of kind "
                             f"names, got {item!r}")
    return tuple(out)


def spawn_id(spawner: str, n: int) -> str:
    """The id of the ``n``-th task spawned by task ``spawner`` (stable across processes)."""
    return f"{spawner}/{n}"


@dataclass(frozen=True)
class TaskContext:
    """What a handler may know about the task it is doing, and its one way to talk back."""

    run_id: str
    task_id: str
    kind: str
    attempt: int
    """The fencing token of this assignment (1 for the first)."""
    worker: str
    skill: float
    payload: Mapping[str, Any] = field(default_factory=dict, repr=False)
    estimate_s: float = 1.0
    inputs: Mapping[str, Any] = field(default_factory=dict, repr=False)
    """Results of the tasks this one depends on, by task id."""
    heartbeat: _Heartbeat = field(default=lambda: None, repr=False, compare=False)
    """Renew this task's lease; long-running handlers call it now and then."""
    extras: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """Run-wide objects a runner hands to handlers (the model, the usage meter, ...)."""

    spawned: list[SpawnRequest] = field(default_factory=list, repr=False, compare=False)
    """What this attempt asked to add (:meth:`spawn`); recorded only if it completes."""
    tier: TierChoice | None = field(default=None, compare=False)
    """The tier this attempt's model calls go at, as the scheduling core chose it from the
    task's slack (None: the run uses no tiers; the model client sends none)."""

    def spawn(self, kind: str, payload: Mapping[str, Any] | BaseModel | None = None, *,
              depends_on: Iterable[str] = (), joins: Iterable[str] = (),
              estimate_s: float = 1.0) -> str:
        """Ask for a new task in this run; return its id.

        Nothing is added until this attempt completes: the addition is then validated like
        a plan (kinds, payload models, dependencies on tasks that exist or were spawned
        before by this attempt, the run's spawn limits) and recorded with the completion, in
        one write. If it is invalid, this task fails permanently with every problem listed;
        if the attempt fails, what it asked for is dropped.

        ``depends_on``: ids of tasks the new one waits for. ``joins``: ids of tasks whose
        spawned tasks, all of them at any depth, it also waits for (a reduce after a map).
        """
        if isinstance(payload, BaseModel):
            payload = payload.model_dump(mode="json")
        if isinstance(depends_on, str) or isinstance(joins, str):
            raise UsageError("depends_on and joins take a list of task ids, not one string")
        self.spawned.append(SpawnRequest(kind, dict(payload or {}), tuple(depends_on),
                                         tuple(joins), float(estimate_s)))
        return spawn_id(self.task_id, len(self.spawned) - 1)

    @functools.cached_property
    def idempotency_key(self) -> str:
        """Same across retries and resumes of this task; pass it on where an API takes one."""
        return idempotency_key(self.run_id, self.task_id, self.payload)


Need = str | tuple[str, ...]
"""A kind a task's dependencies must include, or a tuple of kinds any one of which will do."""


@dataclass(frozen=True)
class KindSpec:
    """A kind of work that a plan may name.

    ``timeout_s`` bounds one attempt of this kind (a timeout is a transient failure, so it
    retries); ``None`` leaves it to the supervisor's or worker process's ``timeout``.

    The kind's *contract* (checked whenever a plan, a spawn or a replanned fragment is
    validated; see :mod:`planrun.core._contracts`): ``needs`` (kinds its dependencies must
    include), ``inputs`` (result models its dependencies must produce), ``delivers`` (its
    tasks deliver the run's result), ``max_count`` (at most this many per plan) and
    ``unique`` (no two of its tasks with the same payload).
    """

    name: str
    description: str = ""
    payload_model: type[BaseModel] | None = None
    result_model: type[BaseModel] | None = None
    handler: Handler | None = None
    timeout_s: float | None = None
    needs: tuple[Need, ...] = ()
    inputs: tuple[type[BaseModel], ...] = ()
    delivers: bool = False
    max_count: int | None = None
    unique: bool = False

    def __post_init__(self) -> None:
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise UsageError(f"kind {self.name!r}: timeout_s must be > 0, got {self.timeout_s}")
        object.__setattr__(self, "needs", _needs(self.name, self.needs))
        inputs = (self.inputs,) if isinstance(self.inputs, type) else tuple(self.inputs)
        if not all(isinstance(m, type) and issubclass(m, BaseModel) for m in inputs):
            raise UsageError(f"kind {self.name!r}: inputs must be pydantic models (the result "
                             "models its dependencies produce)")
        object.__setattr__(self, "inputs", inputs)
        if self.max_count is not None and (isinstance(self.max_count, bool) or not isinstance(
                self.max_count, int) or self.max_count < 1):
            raise UsageError(f"kind {self.name!r}: max_count must be a whole number >= 1, got "
                             f"{self.max_count!r}")

    @property
    def has_contract(self) -> bool:
        """Whether the kind declares any contract."""
        return bool(self.needs or self.inputs or self.delivers or self.max_count is not None
                    or self.unique)

    def payload_schema(self) -> dict[str, Any]:
        """JSON Schema of the payload (any object when the kind has no payload model)."""
        if self.payload_model is None:
            return {"type": "object"}
        return self.payload_model.model_json_schema()


@dataclass(frozen=True)
class WorkerSpec:
    """A worker: which kinds it does, how fast (``skills``), and how many at a time.

    ``skills`` maps kind -> speed factor (1.0 normal, 4.0 four times faster); ``None``
    means every kind of the registry at speed 1.0. ``handlers`` overrides the kind's own
    handler for this worker (a worker with its own behaviour, as in simulations).
    """

    name: str
    skills: Mapping[str, float] | None = None
    capacity: int = 1
    handlers: Mapping[str, Handler] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise UsageError(f"worker {self.name!r}: capacity must be >= 1, got {self.capacity}")
        for kind, speed in (self.skills or {}).items():
            if not speed > 0:
                raise UsageError(f"worker {self.name!r}: skill for {kind!r} must be > 0")

    def can_do(self, kind: str) -> bool:
        """True when this worker does ``kind``."""
        return self.skills is None or kind in self.skills

    def skill(self, kind: str) -> float:
        """Speed factor for ``kind`` (1.0 when unspecified)."""
        return 1.0 if self.skills is None else float(self.skills.get(kind, 0.0))


def _contract(needs: Iterable[Need] | Need, inputs: Iterable[type[BaseModel]] | type[BaseModel],
              ) -> tuple[tuple[Need, ...], tuple[type[BaseModel], ...]]:
    """``needs`` and ``inputs`` as :class:`KindSpec` holds them (one or many, checked there)."""
    wanted = (needs,) if isinstance(needs, str) else tuple(needs)
    models = (inputs,) if isinstance(inputs, type) else tuple(inputs)
    return wanted, models


class Registry:
    """The kinds that exist. Plans are validated against it; workers are routed by it."""

    def __init__(self, kinds: Iterable[KindSpec] = ()) -> None:
        self._kinds: dict[str, KindSpec] = {}
        for spec in kinds:
            self.add(spec)

    def add(self, spec: KindSpec) -> KindSpec:
        """Register a kind; a name can be registered once."""
        if not spec.name or not isinstance(spec.name, str):
            raise UsageError("a kind needs a non-empty name")
        if spec.name in self._kinds:
            raise UsageError(f"kind {spec.name!r} is already registered")
        self._kinds[spec.name] = spec
        return spec

    def register(
        self,
        name: str,
        handler: Handler,
        *,
        payload: type[BaseModel] | None = None,
        result: type[BaseModel] | None = None,
        description: str = "",
        timeout_s: float | None = None,
        needs: Iterable[Need] | Need = (),
        inputs: Iterable[type[BaseModel]] | type[BaseModel] | None = None,
        delivers: bool = False,
        max_count: int | None = None,
        unique: bool = False,
    ) -> KindSpec:
        """Register a kind done by ``handler``: a function (async or not) or a ModelWorker.

        ``result`` defaults to the handler's own ``result_model`` when it has one, and
        ``inputs`` to its ``input_models`` (a :class:`~planrun.ModelWorker`'s ``inputs=``);
        ``timeout_s`` bounds one attempt; ``needs``, ``inputs``, ``delivers``,
        ``max_count`` and ``unique`` are the kind's contract (see :class:`KindSpec`).
        """
        if result is None:
            result = getattr(handler, "result_model", None)
        if inputs is None:
            inputs = getattr(handler, "input_models", ())
        return self.add(KindSpec(name, description, payload, result, handler, timeout_s,
                                 *_contract(needs, inputs), delivers, max_count, unique))

    def kind(
        self,
        name: str,
        *,
        description: str = "",
        payload: type[BaseModel] | None = None,
        result: type[BaseModel] | None = None,
        timeout_s: float | None = None,
        needs: Iterable[Need] | Need = (),
        inputs: Iterable[type[BaseModel]] | type[BaseModel] = (),
        delivers: bool = False,
        max_count: int | None = None,
        unique: bool = False,
    ) -> Callable[[F], F]:
        """Decorator: register the function as the handler of a new kind (arguments as for
        :meth:`register`)."""

        def register(fn: F) -> F:
            doc = description or (fn.__doc__ or "").strip().split("\n")[0]
            self.add(KindSpec(name, doc, payload, result, fn, timeout_s,
                              *_contract(needs, inputs), delivers, max_count, unique))
            return fn

        return register

    @classmethod
    def of(cls, kinds: Registry | Iterable[str] | Mapping[str, type[BaseModel] | None]) -> Registry:
        """Normalise a registry, a list of kind names or a name -> payload model mapping."""
        if isinstance(kinds, Registry):
            return kinds
        if isinstance(kinds, Mapping):
            return cls(KindSpec(str(k), payload_model=m) for k, m in kinds.items())
        return cls(KindSpec(str(k)) for k in kinds)

    def __contains__(self, name: object) -> bool:
        return name in self._kinds

    def __getitem__(self, name: str) -> KindSpec:
        return self._kinds[name]

    def __iter__(self) -> Iterator[KindSpec]:
        return iter(self._kinds.values())

    def __len__(self) -> int:
        return len(self._kinds)

    @property
    def has_contracts(self) -> bool:
        """Whether any kind declares a contract (see :mod:`planrun.core._contracts`)."""
        return any(spec.has_contract for spec in self._kinds.values())

    @property
    def names(self) -> list[str]:
        """Kind names in registration order."""
        return list(self._kinds)
