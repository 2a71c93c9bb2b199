"""``plan_and_run``: the one call a user needs.

A goal (decomposed by the model) or a ready plan (validated) runs under the supervisor on
the app's workers, and comes back as a :class:`RunReport`: every task's status, result,
attempts and error; counts; tokens and cost per task, per worker and for the run; timings;
and the audit computed from the ledger.

    report = plan_and_run("produce a competitive brief on the European payments market",
                          brief.app, model=Model())
    print(report.counts, report.usage.total.cost_usd, report.audit.clean)
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from planrun.core import (
    Audit,
    Event,
    Plan,
    Registry,
    RunExists,
    RunResult,
    SharedLimits,
    Status,
    Task,
    UnknownRun,
    UsageError,
    WorkerSpec,
    fast_init,
    redact,
)
from planrun.core.scheduling import (
    DEFAULT_LATENCY_S,
    Approval,
    TierPolicy,
    as_approval,
    check_policies,
    check_tiers,
)
from planrun.model import ModelWorker, PromptLibrary, check_repair
from planrun.obs import tracing
from planrun.runtime import (
    STALE_AFTER_S,
    Clock,
    EffectFn,
    RealClock,
    Supervisor,
    WaitHook,
    frozen_heap,
    run_blocking,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from planrun.core.scheduling import RetryPolicy, SpawnLimits
    from planrun.model import (
        Batcher,
        Batching,
        Budget,
        Estimate,
        Model,
        PriceTable,
        RepairMode,
        SharedBudget,
        Tally,
        Usage,
    )
    from planrun.runtime import Replanner
    from planrun.stores.base import RunInfo, Store

TierOption = Sequence[str] | str | TierPolicy
"""The tiers a run's calls may go at beside the default one: names (``("flex",
"priority")`` or ``"flex,priority"``), or a :class:`~planrun.core.scheduling.TierPolicy`
with its own starting latencies."""

READY_PLAN_MAX_TASKS = 1_000_000
"""A ready plan is bounded only by this; ``min_tasks``/``max_tasks`` bound decomposition."""
BATCH_STALL_S = 25 * 3600.0
"""A batched run's ``stall_after`` unless given: longer than a batch's 24 h window."""

__all__ = [
    "App",
    "ResumeOptions",
    "RunOptions",
    "RunReport",
    "SupervisorOptions",
    "TaskReport",
    "aplan_and_run",
    "aresume_run",
    "estimate",
    "load_app",
    "plan_and_run",
    "resume_run",
]


class SupervisorOptions(TypedDict, total=False):
    """The :class:`~planrun.runtime.Supervisor` keywords a run passes on (see its arguments)."""

    max_attempts: int | None
    retry: RetryPolicy | None
    retry_budget: int | None
    timeout: float | None
    stale_after: float
    max_reclaims: int
    on_dead: Literal["cancel_dependents", "abort_run", "replan"]
    stall_after: float
    deadline_s: float | None
    seed: int | None
    store_patience: float
    effect_retry: RetryPolicy | None
    spawn_limits: SpawnLimits | None
    replanner: Replanner | None
    max_replans: int
    task_approvals: Mapping[str, Approval | str] | None
    approval_poll: float


class RunOptions(SupervisorOptions, total=False):
    """Every keyword of :func:`plan_and_run` (those of :func:`aplan_and_run`)."""

    model: Model | None
    strategy: str
    budget: Budget | None
    prices: PriceTable | None
    usage: Usage | None
    min_tasks: int
    max_tasks: int
    repair_attempts: int
    prompts: PromptLibrary | None
    repair: RepairMode
    progress: Callable[[Event, Task], None] | None
    run_id: str | None
    clock: Clock | None
    store: Store | str | None
    meta: Mapping[str, Any] | None
    batch: Batching | bool | None
    tiers: TierOption


class ResumeOptions(SupervisorOptions, total=False):
    """Every keyword of :func:`resume_run` (those of :func:`aresume_run`)."""

    model: Model | None
    strategy: str
    budget: Budget | None
    prices: PriceTable | None
    progress: Callable[[Event, Task], None] | None
    clock: Clock | None
    batch: Batching | bool | None
    tiers: TierOption | None
    wait: bool
    on_wait: WaitHook | None


def _check_run(function: str, given: Mapping[str, Any], tiers: TierOption,
               model: Model | None, prices: PriceTable | None) -> TierOption:
    """The keywords (:func:`_check_keywords`) and the tiers of a new run, checked before
    anything is spent: known names, ``priority`` only for a model with a priority price, a
    deadline > 0. Returns the tiers beside the default one (a policy as it is)."""
    import os

    from planrun.model import DEFAULT_MODEL
    from planrun.model import PriceTable as Prices

    _check_keywords(function, given, SupervisorOptions)
    allowed = tiers.allowed if isinstance(tiers, TierPolicy) else check_tiers(tiers)
    name = model.model if model is not None else os.environ.get("PLANRUN_MODEL", DEFAULT_MODEL)
    for tier in allowed:
        Prices.of(prices).check_tier(name, tier)
    check_policies(deadline_s=given.get("deadline_s"))  # before anything is spent
    return tiers if isinstance(tiers, TierPolicy) else tuple(t for t in allowed
                                                              if t != "default")


def _check_keywords(function: str, given: Mapping[str, Any], allowed: type) -> None:
    """A misspelt keyword is a TypeError naming the function the user called (not the
    Supervisor underneath), with the nearest right spelling."""
    known = set(allowed.__annotations__)  # a TypedDict's, its bases' included
    for key in given:
        if key not in known:
            near = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise TypeError(f"{function}() got an unexpected keyword argument {key!r}{hint}")


@dataclass
class App:
    """What a run needs besides the plan: kinds, workers and effects.

    ``workers`` default to one worker doing every kind, ``concurrency`` tasks at a time.
    ``effects`` map a kind to a function applied once per completed task of that kind, by
    the supervisor, keyed by the task id. ``approvals`` map a kind to the
    :class:`~planrun.Approval` its tasks need (decided by ``planrun approve`` / ``reject``).
    """

    registry: Registry
    workers: Sequence[WorkerSpec] | None = None
    effects: Mapping[str, EffectFn] = field(default_factory=dict)
    concurrency: int = 8
    description: str = ""
    approvals: Mapping[str, Approval | str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Refuse a setting a run could not honour now, not when a run starts."""
        if not isinstance(self.registry, Registry):
            raise UsageError(f"App.registry must be a planrun.Registry, got "
                             f"{type(self.registry).__name__}")
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int) \
                or self.concurrency < 1:
            raise UsageError(f"App.concurrency must be a whole number >= 1, got "
                             f"{self.concurrency!r}")
        if self.workers is not None:
            bad = [w for w in self.workers if not isinstance(w, WorkerSpec)]
            if isinstance(self.workers, str | bytes) or bad:
                raise UsageError("App.workers must be a list of planrun.core.WorkerSpec, got "
                                 f"{type(bad[0] if bad else self.workers).__name__}")
        for name, table in (("effects", self.effects), ("approvals", self.approvals)):
            if not isinstance(table, Mapping):
                raise UsageError(f"App.{name} must map kind names to "
                                 f"{'functions' if name == 'effects' else 'approvals'}")
            unknown = sorted(str(k) for k in table if k not in self.registry)
            if unknown:
                raise UsageError(f"App.{name} names kind(s) {unknown} that the registry does "
                                 f"not know (known: {sorted(self.registry.names)})")
        for kind, effect in self.effects.items():
            if not callable(effect):
                raise UsageError(f"App.effects[{kind!r}] must be a function (task, key), got "
                                 f"{type(effect).__name__}")
        for rule in self.approvals.values():
            as_approval(rule)  # a UsageError naming what is wrong

    def worker_specs(self) -> list[WorkerSpec]:
        """The workers, or the default pool."""
        if self.workers:
            return list(self.workers)
        return [WorkerSpec("worker", None, self.concurrency)]

    def needs_model(self) -> bool:
        """True when some kind is done by a :class:`ModelWorker`."""
        return any(isinstance(spec.handler, ModelWorker) for spec in self.registry)


def load_app(ref: str) -> App:
    """Import ``module:attribute`` and return it as an :class:`App` (a Registry is wrapped).

    The attribute may be an App, a Registry, or a function taking no arguments that returns
    one (or a tuple whose first item is one, as ``examples.tickets:make_app`` does).

    Raises:
        UsageError: what is wrong with the reference, in one line: a module that cannot be
            imported (missing, a syntax error, raising at import), a missing attribute, a
            function that needs arguments or raises, or something that is not an App.
    """
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise UsageError(f"--app must look like module:attribute, got {ref!r}")
    module = _import_app_module(module_name)
    if not hasattr(module, attr):
        apps = sorted(n for n, v in vars(module).items()
                      if not n.startswith("_") and isinstance(v, App | Registry))
        have = f"; it has {', '.join(apps)}" if apps else ""
        raise UsageError(f"module {module_name!r} has no attribute {attr!r}{have}")
    target = getattr(module, attr)
    if callable(target) and not isinstance(target, App | Registry):
        target = _call_app_factory(ref, target)
    if isinstance(target, tuple | list) and target and isinstance(target[0], App | Registry):
        target = target[0]
    if isinstance(target, Registry):
        return App(target)
    if isinstance(target, App):
        return target
    raise UsageError(
        f"{ref} is a {type(target).__name__}, not a planrun App or Registry "
        "(or a function returning one)"
    )


def _import_app_module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except SyntaxError as exc:
        where = f"{exc.filename}, line {exc.lineno}" if exc.filename else "its source"
        raise UsageError(f"cannot import {name!r}: syntax error in {where}: {exc.msg}") from exc
    except ImportError as exc:
        raise UsageError(f"cannot import {name!r}: {exc}") from exc
    except Exception as exc:  # the module's own code raised while it was imported
        raise UsageError(
            f"importing {name!r} raised {type(exc).__name__}: {exc}".splitlines()[0]
        ) from exc


def _call_app_factory(ref: str, factory: Callable[..., Any]) -> Any:
    import inspect

    try:
        inspect.signature(factory).bind()
    except TypeError:
        raise UsageError(
            f"{ref} needs arguments; --app names an App, a Registry, or a function that "
            "takes none and returns one"
        ) from None
    except ValueError:  # no signature to inspect (some builtins): try the call
        pass
    try:
        return factory()
    except Exception as exc:
        raise UsageError(
            f"calling {ref}() raised {type(exc).__name__}: {exc}".splitlines()[0]
        ) from exc


@fast_init
@dataclass(frozen=True)
class TaskReport:
    """One task's outcome."""

    id: str
    kind: str
    status: str
    attempts: int
    result: Any
    error: str | None
    cause: str | None
    tokens: int
    cost_usd: float
    started_at: float | None
    finished_at: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return dict(self.__dict__)


@dataclass(frozen=True, repr=False)
class RunReport:
    """Everything a run produced, for a person (``summary()``) or a program (``to_dict()``).

    Its ``repr`` is a one-line summary (a large run's fields come to megabytes of text).
    """

    run_id: str
    goal: str
    plan: Plan
    tasks: list[TaskReport]
    counts: Mapping[str, int]
    audit: Audit
    usage: Usage | None
    started_at: float
    finished_at: float
    budget_exhausted: bool
    aborted_by: str | None
    events: Sequence[Event]
    result: RunResult

    if not TYPE_CHECKING:  # (an attribute mypy does not know stays an error)

        def __getattr__(self, name: str) -> Any:
            # A report made by plan_and_run builds its task reports when ``tasks`` is
            # first read, from the run's records and what was fixed when it ended.
            if name == "tasks":
                ended = self.__dict__.get("_ended")
                if ended is not None:
                    return self.__dict__.setdefault("tasks", _task_reports(self.result, *ended))
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __repr__(self) -> str:
        # A summary, as RunResult's: on Python 3.11 ``asyncio.run`` (so plan_and_run) takes
        # the repr of the result of what it ran, which with every field was megabytes.
        counts = {k: v for k, v in self.counts.items() if v}
        tasks = self.__dict__.get("tasks", self.result.tasks)
        return (f"RunReport(run_id={self.run_id!r}, goal={self.goal!r}, counts={counts}, "
                f"ok={self.ok}, duration_s={self.duration_s:.3f}, tasks={len(tasks)})")

    @property
    def ok(self) -> bool:
        """Every task completed and the audit is clean."""
        return self.result.ok and self.audit.clean

    @property
    def deadline_reached(self) -> bool:
        """The run's deadline passed before every task finished."""
        return self.result.deadline_reached

    @property
    def effects_failed(self) -> Mapping[str, str]:
        """Task id -> last error of an effect given up on."""
        return self.result.effects_failed

    @property
    def duration_s(self) -> float:
        """Seconds from the start of the run to the last task's end."""
        return self.finished_at - self.started_at

    def results(self) -> dict[str, Any]:
        """Task id -> result of every completed task."""
        return {t.id: t.result for t in self.tasks if t.status == "completed"}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the CLI's ``--json``)."""
        usage: dict[str, Any] | None = None
        if self.usage is not None:
            total = self.usage.total
            usage = {
                "requests": total.requests,
                "prompt_tokens": total.prompt_tokens,
                "cached_tokens": total.cached_tokens,
                "completion_tokens": total.completion_tokens,
                "total_tokens": total.total_tokens,
                "cost_usd": round(total.cost_usd, 6),
                "by_key": {
                    k: {"tokens": v.total_tokens, "cost_usd": round(v.cost_usd, 6)}
                    for k, v in sorted(self.usage.by_key().items())
                },
                "by_tier": {
                    k: {"requests": v.requests, "tokens": v.total_tokens,
                        "cached_tokens": v.cached_tokens, "cost_usd": round(v.cost_usd, 6)}
                    for k, v in self.usage.by_tier().items()
                },
            }
        return {
            "run_id": self.run_id,
            "ok": self.ok,
            "goal": self.goal,
            "plan": self.plan.to_document(),
            "counts": dict(self.counts),
            "tasks": [t.to_dict() for t in self.tasks],
            "audit": self.audit.to_dict(),
            "usage": usage,
            "duration_s": round(self.duration_s, 6),
            "budget_exhausted": self.budget_exhausted,
            "aborted_by": self.aborted_by,
            "deadline_reached": self.deadline_reached,
            "effects_failed": dict(self.effects_failed),
        }

    def summary(self) -> str:
        """A few lines for a terminal."""
        counts = ", ".join(f"{k} {v}" for k, v in self.counts.items() if v)
        lines = [f"run {self.run_id}: {counts} in {self.duration_s:.1f} s"]
        if self.usage is not None and self.usage.total.requests:  # a model was called
            t = self.usage.total
            lines.append(
                f"usage: {t.requests} requests, {t.total_tokens} tokens "
                f"({t.prompt_tokens} prompt, {t.cached_tokens} cached, "
                f"{t.completion_tokens} completion), ${t.cost_usd:.4f}"
            )
            tiers = self.usage.by_tier()
            if set(tiers) != {"default"}:
                lines.append("by tier: " + ", ".join(
                    f"{k} {v.requests} requests ${v.cost_usd:.4f}" for k, v in tiers.items()))
        if self.budget_exhausted:
            lines.append("budget exhausted: remaining tasks were cancelled (cause: budget)")
        if self.aborted_by:
            lines.append(f"aborted: task {self.aborted_by} died")
        if self.deadline_reached:
            lines.append("deadline reached: tasks not started were cancelled (cause: deadline)")
        if self.effects_failed:
            lines.append("effects failed: " + ", ".join(
                f"{k} ({v})" for k, v in sorted(self.effects_failed.items())))
        statuses = {} if self.audit.clean else {t.id: t.status for t in self.tasks}
        lines.append(f"audit: {self.audit.describe(statuses)}")
        return "\n".join(lines)


async def aplan_and_run(
    goal_or_plan: str | Plan | Mapping[str, Any] | Sequence[Any],
    app: App | Registry,
    *,
    model: Model | None = None,
    strategy: str = "balanced",
    budget: Budget | None = None,
    prices: PriceTable | None = None,
    usage: Usage | None = None,
    min_tasks: int = 3,
    max_tasks: int = 8,
    repair_attempts: int = 2,
    prompts: PromptLibrary | None = None,
    repair: RepairMode = "code",
    progress: Callable[[Event, Task], None] | None = None,
    run_id: str | None = None,
    clock: Clock | None = None,
    store: Store | str | None = None,
    meta: Mapping[str, Any] | None = None,
    batch: Batching | bool | None = None,
    tiers: TierOption = (),
    **supervisor_options: Unpack[SupervisorOptions],
) -> RunReport:
    """Decompose (or validate) and run; see :func:`plan_and_run`."""
    tiers = _check_run("aplan_and_run", supervisor_options, tiers, model, prices)
    from planrun.model import Usage as UsageMeter

    decomposing = _Decomposing(min_tasks, max_tasks, repair_attempts, prompts, repair)
    app = app if isinstance(app, App) else App(app)
    plan = _ready_plan(goal_or_plan, app.registry)
    if model is None and (plan is None or app.needs_model()):
        model = _default_model()  # a missing key fails here, before any task starts
    clock, (named, run_id) = clock or RealClock(), (run_id, run_id or uuid.uuid4().hex[:12])
    goal = plan.goal if plan else str(goal_or_plan)
    with tracing.traced_run(run_id, clock=clock, goal=goal, progress=progress) as traced:
        async with _opened(store, new_run=named) as opened:
            meter = usage if usage is not None else UsageMeter(
                prices, budget, shared=await _shared_budget(opened, run_id, budget))
            if plan is None:
                assert model is not None and isinstance(goal_or_plan, str)
                plan = await decomposing.plan(goal_or_plan, app.registry, model, meter)
            _with_replanner(supervisor_options, plan.goal, app.registry, model, meter, decomposing)
            batcher, run_model = _batcher(batch, model, app, supervisor_options, tiers)
            sup = Supervisor(
                app.registry, _specs(app, batcher), strategy=strategy, clock=clock,
                run_id=run_id, effects=app.effects, approvals=app.approvals,
                on_event=traced.on_event if traced else progress,
                extras={"model": run_model, "usage": meter}, store=opened, goal=plan.goal,
                # The plan document and how to re-plan are for a resume, which reads them.
                meta={**({"plan": plan.to_document(), **decomposing.meta()}
                         if opened is not None else {}),
                      **(traced.meta if traced else {}), **(meta or {})},
                **supervisor_options)
            sup.add_tasks(plan.to_tasks(), repairs=plan.repairs)
            async with _running(opened, sup, batcher, tiers, new_run=True):
                result = await (traced.run(sup.arun()) if traced else sup.arun())
        if traced:
            traced.set_result(result)
    return _report(plan, result, meter)


async def _refuse_taken(store: Store | None, run_id: str | None) -> None:
    """A new run's id, when the caller chose it, must be free in ``store``: one in use is
    refused before anything is decomposed or run (the store refuses it too, when two
    processes take it at once)."""
    if store is None or run_id is None:
        return
    try:
        await store.run_owner(run_id)
    except UnknownRun:
        return
    raise RunExists(run_id, str(getattr(store, "url", type(store).__name__))) from None


def _ready_plan(goal_or_plan: str | Plan | Mapping[str, Any] | Sequence[Any],
                registry: Registry) -> Plan | None:
    """The plan given (validated: nothing runs unless it is), or None for a goal.

    Reading a plan document makes a few objects per task: with the heap frozen, as the
    Supervisor keeps it while it adds tasks and runs (:func:`~planrun.runtime.frozen_heap`),
    so that a large plan read first thing in a process sets off no full pass of the garbage
    collector over every object its imports left."""
    if isinstance(goal_or_plan, Plan):
        return goal_or_plan
    if isinstance(goal_or_plan, str):
        return None
    with frozen_heap(Supervisor.freeze_heap):
        return Plan.parse(goal_or_plan, registry, min_tasks=1, max_tasks=READY_PLAN_MAX_TASKS)


async def _shared_budget(
    store: Store | None, run_id: str, budget: Budget | None, *, release: bool = False
) -> SharedBudget | None:
    """The run's budget in ``store`` (opened with ``budget``), or None without a store.

    With a store, the budget and what was spent live with the run there, so a resume
    continues from it."""
    if not isinstance(store, SharedLimits):  # no store, or one that keeps no limits
        return None
    from planrun.model import SharedBudget

    # A new run without a budget only adds what it spent; a resumed one obeys the stored
    # limits whether or not they are given again.
    shared = SharedBudget(store, run_id, enforce=budget is not None or release)
    await shared.open(budget, release=release)
    return shared


async def aresume_run(
    run_id: str,
    app: App | Registry,
    store: Store | str,
    *,
    model: Model | None = None,
    strategy: str = "balanced",
    budget: Budget | None = None,
    prices: PriceTable | None = None,
    progress: Callable[[Event, Task], None] | None = None,
    clock: Clock | None = None,
    wait: bool = True,
    on_wait: WaitHook | None = None,
    batch: Batching | bool | None = None,
    tiers: TierOption | None = None,
    **supervisor_options: Unpack[SupervisorOptions],
) -> RunReport:
    """Carry on a stored run after a crash; see :meth:`Supervisor.aresume`.

    The run is resumed under its owner lease (:func:`planrun.runtime.hold_run`). An owner
    that is a process of this host that no longer exists is taken over at once. Another owner
    is waited for until its lease runs out (``wait=True``; ``on_wait(owner, seconds_left)``
    is called about once a second meanwhile); a live owner keeps renewing it, and then (or at
    once with ``wait=False``) this raises :class:`~planrun.RunInUse` and changes nothing.
    In batch mode (``batch``; None: the settings the run was started with, kept in its meta),
    a batch the run submitted before it stopped is found again and its lines awaited, not
    submitted twice; ``tiers`` (None: those stored with the run) as in :func:`plan_and_run`.
    The budget draws on what the run already spent (stored with it); ``budget`` replaces the
    stored limits, if given; reservations of dead calls are dropped.
    """
    from planrun.model import Usage as UsageMeter

    _check_keywords("aresume_run", supervisor_options, SupervisorOptions)
    app = app if isinstance(app, App) else App(app)
    if model is None and app.needs_model():
        model = _default_model()
    clock = clock or RealClock()
    async with _opened(store) as opened:
        assert opened is not None
        shared = await _shared_budget(opened, run_id, budget, release=True)
        meter = UsageMeter(prices, budget, shared=shared)
        run = (await opened.load_tasks(run_id)).run  # what it was started with
        with tracing.traced_run(run_id, clock=clock, meta=run.meta, progress=progress) as traced:
            _stored_replanner(supervisor_options, run, app.registry, model, meter)
            batcher, run_model = _batcher(_stored_batching(run.meta, batch), model, app,
                                          supervisor_options, _stored_tiers(run.meta, tiers))
            sup = Supervisor(
                app.registry, _specs(app, batcher), strategy=strategy, clock=clock, run_id=run_id,
                effects=app.effects, approvals=app.approvals,
                on_event=traced.on_event if traced else progress,
                extras={"model": run_model, "usage": meter}, store=opened, **supervisor_options,
            )
            async with _running(opened, sup, batcher, tiers, wait=wait, on_wait=on_wait):
                result = await (traced.run(sup.aresume()) if traced else sup.aresume())
            if traced:
                traced.set_result(result)
        document = sup.meta.get("plan") or {"goal": sup.goal, "tasks": []}
    plan = Plan.parse(document, app.registry, min_tasks=0, max_tasks=READY_PLAN_MAX_TASKS,
                      contracts=False)  # the plan it ran: read back, not judged again
    return _report(plan, result, meter)


def resume_run(run_id: str, app: App | Registry, store: Store | str,
               **options: Unpack[ResumeOptions]) -> RunReport:
    """Synchronous :func:`aresume_run` (its keywords: :class:`ResumeOptions`)."""
    _check_keywords("resume_run", options, ResumeOptions)
    clock = options.get("clock") or RealClock()
    return run_blocking(clock, lambda: aresume_run(run_id, app, store, **options))


@contextlib.asynccontextmanager
async def _opened(store: Store | str | None,
                  new_run: str | None = None) -> AsyncIterator[Store | None]:
    """A store object as given, or one opened from a URL (and closed after); with
    ``new_run``, a run id the caller chose for a new run, refused if the store holds it."""
    if store is None or not isinstance(store, str):
        await _refuse_taken(store, new_run)
        yield store
        return
    from planrun.stores import open_store

    opened = open_store(store)
    await opened.open()
    try:
        await _refuse_taken(opened, new_run)
        yield opened
    finally:
        await opened.close()


@contextlib.asynccontextmanager
async def _owning(
    store: Store | None, run_id: str, clock: Clock, new_run: bool = False,
    wait: bool = True, on_wait: WaitHook | None = None,
) -> AsyncIterator[None]:
    """Hold the run's owner lease while a durable run on the wall clock goes on."""
    if store is None or not isinstance(clock, RealClock):
        yield  # nothing durable, or simulated time: a lease in wall time means nothing
        return
    from planrun.runtime import hold_run

    async with hold_run(store, run_id, new_run=new_run, wait=wait, on_wait=on_wait):
        yield


def _batcher(batch: Batching | bool | None, model: Model | None, app: App,
             options: SupervisorOptions, tiers: TierOption | None = (),
             ) -> tuple[Batcher | None, Model | None]:
    """The run's :class:`~planrun.model.Batcher` and the model its tasks call (sending
    through it), or None and ``model`` without batch mode (which ``batch`` among the
    ``tiers`` asks for too). Decomposition and replanning keep ``model``: they stay live.
    Live calls keep to the app's workers' capacity.

    A task waiting in a batch changes no record for as long as the batch takes, and renews
    its lease at each poll: unless given, ``stall_after`` is the batch's window (a day) and
    ``stale_after`` three polls."""
    from planrun.model import Batcher, Batching

    names = tiers.allowed if isinstance(tiers, TierPolicy) else tiers or ()
    settings = Batching.of(batch or "batch" in names)
    if settings is None or model is None:
        return None, model
    options.setdefault("stall_after", BATCH_STALL_S)
    options.setdefault("stale_after", max(STALE_AFTER_S, 3 * settings.poll_s))
    batcher = Batcher(settings, slots=sum(w.capacity for w in app.worker_specs()))
    return batcher, model.batched(batcher)


def _stored_batching(meta: Mapping[str, Any],
                     given: Batching | bool | None) -> Batching | bool | None:
    """A resumed run's batch settings: those given, else those it was started with (kept in
    its ``meta``; None: it ran live)."""
    from planrun.model import Batching

    stored = meta.get("batch")
    if given is not None or not isinstance(stored, Mapping):
        return given
    return Batching.from_meta(stored)


def _stored_tiers(meta: Mapping[str, Any], given: TierOption | None) -> TierOption | None:
    """A resumed run's tiers: those given, else those it was started with."""
    return given if given is not None else meta.get("tiers")


def _tier_policy(sup: Supervisor, batcher: Batcher | None, tiers: TierOption | None) -> TierPolicy:
    """The run's tiers (None: those stored with a resumed run) and their learned latencies,
    over the calls its workers make at once (in batch mode, its live calls): the default
    tier's starting figure is the batch settings' ``live_s`` in batch mode. Given tiers are
    kept in the run's meta, for a resume."""
    if batcher is not None:
        live_s, slots = batcher.options.live_s, batcher.slots or 1
    else:
        live_s = DEFAULT_LATENCY_S["default"]
        slots = sum(w.spec.capacity for w in sup.core.workers.values())
    if isinstance(tiers, TierPolicy):  # the caller's starting figures
        policy = tiers
        policy.slots = policy.slots or slots
    else:
        policy = TierPolicy(tiers, latency_s={"default": live_s}, slots=slots)
    if policy.active:
        sup.meta = {**sup.meta, "tiers": [t for t in policy.allowed if t != "default"]}
    return policy


def _specs(app: App, batcher: Batcher | None) -> list[WorkerSpec]:
    """The app's workers; in batch mode each also holds up to a batch's size of tasks whose
    calls wait in a batch (their live calls keep to the workers' capacity: see
    :meth:`~planrun.model.Batcher.live_gate`)."""
    specs = app.worker_specs()
    if batcher is None:
        return specs
    return [dataclasses.replace(w, capacity=w.capacity + batcher.options.size) for w in specs]


@contextlib.asynccontextmanager
async def _batching(batcher: Batcher | None, sup: Supervisor) -> AsyncIterator[None]:
    """Connect ``batcher`` to the run (its deadline rule, its ledger, its live capacity)
    while it runs."""
    if batcher is None:
        yield
        return
    sup.meta = {**sup.meta, "batch": batcher.options.to_meta()}  # for its resume
    margin_s = batcher.options.cancel_s
    slots = batcher.slots or 1
    batcher.bind(sup.run_id, journal=sup.batch_journal(),
                 due=None if sup.deadline_s is None else
                 lambda waiting: sup.batch_due(waiting, slots, margin_s))
    try:
        yield
    finally:
        await batcher.aclose()


@contextlib.asynccontextmanager
async def _running(store: Store | None, sup: Supervisor, batcher: Batcher | None,
                   tiers: TierOption | None, **owning: Any) -> AsyncIterator[None]:
    """While the run goes on: its tiers set, its owner lease held, its batcher connected to
    it, what its tasks spend written to its ledger (and how long their answers took,
    learned by its tiers)."""
    sup.core.use_tiers(_tier_policy(sup, batcher, tiers))
    async with _owning(store, sup.run_id, sup.clock, **owning), _batching(batcher, sup):
        meter = sup.extras.get("usage")
        stop = meter.listen(sup.usage_journal().recorded) if meter is not None else None
        try:
            yield
        finally:
            if stop is not None:
                stop()


def plan_and_run(
    goal_or_plan: str | Plan | Mapping[str, Any] | Sequence[Any],
    app: App | Registry,
    **options: Unpack[RunOptions],
) -> RunReport:
    """Turn a goal (or a ready plan) into a validated plan and run it to the end.

    Args:
        goal_or_plan: a prose goal (decomposed by ``model``), a :class:`Plan`, or a plan
            document (validated; nothing runs if it is invalid).
        app: the kinds, workers and effects (:class:`App`), or a bare :class:`Registry`.
        options: ``model``, ``store`` (below), ``strategy``, ``budget``, ``prices``,
            ``usage``, ``min_tasks``, ``max_tasks``, ``repair_attempts``, ``prompts``,
            ``repair``, ``progress``, ``run_id``, ``clock``, ``meta`` as named
            (:class:`RunOptions`); ``batch`` (``True`` or a
            :class:`~planrun.Batching`) sends the tasks' model calls as Batch API jobs at
            half price, live again when the deadline needs it; ``tiers`` (``("flex",
            "priority")``, ``"flex,batch"`` or a
            :class:`~planrun.core.scheduling.TierPolicy`) sends each task's calls at the
            cheapest tier its slack before ``deadline_s`` allows (without a deadline, the
            cheapest), stored with the run for a resume; the keywords of
            :class:`SupervisorOptions` (``max_attempts``, ``retry``, ``on_dead``,
            ``deadline_s``, ...) go to the :class:`Supervisor`. Any other keyword is a
            ``TypeError``.

    Keyword Args:
        model (Model | None): the :class:`~planrun.Model`; default ``None``: one from the
            environment (``OPENAI_API_KEY``, ...) when a model is needed.
        store (Store | str | None): a store, or its URL (``sqlite:///runs.db``,
            ``postgresql://...``): the run is durable and :func:`resume_run` carries it on
            after a crash; default ``None``: the run lives in memory.
        repair (str): ``"code"`` (the default): a goal's plan goes through the code
            repairs before the model is asked to repair it; ``"model"``: every repair is
            asked of the model (:func:`~planrun.model.adecompose`), for the goal's plan and
            its replans (``on_dead="replan"``), a resumed run's included.

    Raises:
        InvalidPlan: the plan did not validate (after repairs, for a goal).
        ConfigError: a model is needed and none is configured (``OPENAI_API_KEY``).
    """
    _check_keywords("plan_and_run", options, RunOptions)
    clock = options.get("clock") or RealClock()
    return run_blocking(clock, lambda: aplan_and_run(goal_or_plan, app, **options))


def estimate(
    plan: Plan | Mapping[str, Any] | Sequence[Any],
    app: App | Registry,
    *,
    model: Model | str | None = None,
    tiers: Sequence[str] | str = (),
    prices: PriceTable | None = None,
    rpm: float | None = None,
    tpm: float | None = None,
) -> Estimate:
    """What ``plan``'s model calls will use and cost, before the run, with no model call.

    Calls, prompt tokens as the provider counts them (response schemas included), output
    tokens expected and at their bounds, and the cost at each allowed tier (``tiers``
    beside ``default``: ``flex``, ``priority``, ``batch``) as an expected figure
    (``cost_usd``) and a ceiling (``cost_usd_max``); with ``rpm``/``tpm``, the seconds the
    calls need at those limits. ``model``: a :class:`~planrun.Model` or a model name
    (default ``$PLANRUN_MODEL``, else ``gpt-4o-mini``; no API key is needed). The plan is
    validated first (an invalid one raises :class:`~planrun.InvalidPlan`); unknown tiers,
    ``priority`` for a model without a priority price and limits <= 0 raise
    :class:`~planrun.UsageError`. See :mod:`planrun.model._estimate`.
    """
    import os

    from planrun.model import DEFAULT_MODEL, estimate_plan
    from planrun.model import Model as ModelClass

    app = app if isinstance(app, App) else App(app)
    for name, limit in (("rpm", rpm), ("tpm", tpm)):
        if limit is not None and not limit > 0:
            raise UsageError(f"{name} must be > 0, got {limit!r}")
    if not isinstance(plan, Plan):
        plan = Plan.parse(plan, app.registry, min_tasks=1, max_tasks=READY_PLAN_MAX_TASKS)
    given = model.model if isinstance(model, ModelClass) else model
    name = given or os.environ.get("PLANRUN_MODEL") or DEFAULT_MODEL
    handlers = {kind: handler for spec in app.worker_specs()
                for kind, handler in spec.handlers.items()}
    return estimate_plan(plan, app.registry, model=name, prices=prices, tiers=tiers, rpm=rpm,
                         tpm=tpm, handlers=handlers)


def _default_model() -> Model:
    from planrun.model import Model

    return Model()


def _with_replanner(options: SupervisorOptions, goal: str, registry: Registry,
                    model: Model | None, meter: Usage, decomposing: _Decomposing) -> None:
    """With ``on_dead="replan"`` and a model, re-plan through the decomposer (metered by
    the run's meter, so charged to its budget) unless a replanner was given."""
    if options.get("on_dead") != "replan" or "replanner" in options or model is None:
        return
    from planrun.model import replanner

    options["replanner"] = replanner(goal, registry, model, meter=meter,
                                     **decomposing.replanning())


def _stored_replanner(options: SupervisorOptions, run: RunInfo, registry: Registry,
                      model: Model | None, meter: Usage) -> None:
    """:func:`_with_replanner` for a resumed run: its goal, and the decomposer's options
    it stored (:meth:`_Decomposing.meta`)."""
    if options.get("on_dead") == "replan":
        _with_replanner(options, run.goal, registry, model, meter,
                        _Decomposing.from_meta(run.meta))


@dataclass(frozen=True)
class _Decomposing:
    """How a run's goal becomes its plan, and its dead tasks' parts new ones
    (``on_dead="replan"``): the decomposer's options of :func:`aplan_and_run`. A stored run
    keeps what a resume needs to re-plan as the run did (:meth:`meta`)."""

    min_tasks: int = 3
    max_tasks: int = 8
    repair_attempts: int = 2
    prompts: PromptLibrary | None = None
    repair: RepairMode = "code"

    def __post_init__(self) -> None:
        check_repair(self.repair)

    async def plan(self, goal: str, registry: Registry, model: Model, meter: Usage) -> Plan:
        """The run's plan: ``goal`` decomposed, its model calls charged to ``meter``."""
        from planrun.model import adecompose

        return await adecompose(
            goal, registry, model, min_tasks=self.min_tasks, max_tasks=self.max_tasks,
            repair_attempts=self.repair_attempts, prompts=self.prompts, meter=meter,
            repair=self.repair)

    def replanning(self) -> dict[str, Any]:
        """The keywords of :func:`planrun.model.replanner` (a fragment's own ``min_tasks``)."""
        return {"max_tasks": self.max_tasks, "repair_attempts": self.repair_attempts,
                "prompts": self.prompts, "repair": self.repair}

    def meta(self) -> dict[str, Any]:
        """What a stored run keeps: ``{"repair": "model"}`` when the code repairs are off
        (the other options a resume's replans take at their defaults)."""
        return {"repair": self.repair} if self.repair != "code" else {}

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> _Decomposing:
        """The options :meth:`meta` stored (the defaults for a run that stored none)."""
        return cls(repair=meta.get("repair", "code"))


_TEXT = {s: s.value for s in Status}
"""A status as plain text (its ``value``, without the enum's descriptor)."""


_ERROR = attrgetter("error")


def _report(plan: Plan, result: RunResult, meter: Usage) -> RunReport:
    """The run's report; its ``tasks`` are built when first read (most callers read the
    counts, the audit or a few results), from what is fixed here: the usage per key as it
    is now, and each error redacted with the secrets known now."""
    errors = {task.id: redact(task.error)
              for task in filter(_ERROR, result.tasks.values()) if task.error}
    report = object.__new__(RunReport)
    state = report.__dict__  # the dataclass's fields, in order, but ``tasks``
    state["run_id"] = result.run_id
    state["goal"] = plan.goal
    state["plan"] = plan
    state["counts"] = result.counts
    state["audit"] = result.audit
    state["usage"] = meter
    state["started_at"] = result.started_at
    state["finished_at"] = result.finished_at
    state["budget_exhausted"] = result.budget_exhausted
    state["aborted_by"] = result.aborted_by
    state["events"] = result.events
    state["result"] = result
    state["_ended"] = (meter.by_key(), errors)
    return report


def _task_reports(
    result: RunResult, by_key: Mapping[str, Tally], errors: Mapping[str, str]
) -> list[TaskReport]:
    """A report per task record of ``result``: usage from ``by_key``, errors as redacted."""
    reports = []
    for task in result.tasks.values():
        tally = by_key.get(f"task:{task.id}") if by_key else None
        reports.append(
            TaskReport(
                task.id,
                task.kind,
                _TEXT[task.status],
                task.attempts,
                task.result,
                errors[task.id] if task.error else task.error,
                task.cause,
                tally.total_tokens if tally else 0,
                tally.cost_usd if tally else 0.0,
                task.started_at,
                task.finished_at,
            )
        )
    return reports
