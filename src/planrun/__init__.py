"""planrun: turn a prose goal into a validated task plan and run it exactly once.

A decomposer asks a model for a plan over the kinds of work that exist; the plan is
validated (every problem reported, nothing dispatched until it passes); a code-enforced
supervisor assigns each task to exactly one worker, retries what is transient, gives up on
what is permanent, reclaims what goes silent, and applies side effects once.

    from planrun import Model, plan_and_run
    from planrun.examples import brief

    report = plan_and_run(brief.GOAL, brief.app, model=Model())
    print(report.summary())

Everything public is importable from here. The subpackages are laid out by role:
:mod:`planrun.core` decides (plans, records, the scheduling core), :mod:`planrun.runtime`
carries out, :mod:`planrun.stores` keeps, :mod:`planrun.model` talks to models,
:mod:`planrun.obs` observes, :mod:`planrun.dev` holds development tools and :mod:`planrun.cli._main`
the command line.
"""

from importlib import metadata as _metadata

from planrun._facade import (
    App,
    RunReport,
    TaskReport,
    aplan_and_run,
    aresume_run,
    plan_and_run,
    resume_run,
)
from planrun.core import (
    CONTRACT_CODES,
    PROBLEM_CODES,
    Audit,
    BudgetExceeded,
    ConfigError,
    DispatchError,
    Event,
    IllegalTransition,
    InvalidPlan,
    KindSpec,
    Ledger,
    ModelRefused,
    PermanentError,
    Plan,
    PlanError,
    PlanrunError,
    PlanTask,
    Problem,
    RateLimited,
    Registry,
    RunAborted,
    RunInUse,
    RunResult,
    SpawnRequest,
    StallError,
    Status,
    StoreError,
    Task,
    TaskContext,
    TransientError,
    UnknownRun,
    UnstorableValue,
    UsageError,
    WorkerError,
    WorkerSpec,
    analyze,
    plan_schema,
    read_jsonl,
    redact,
    validate_plan,
)
from planrun.core.scheduling import Approval, Backoff, SpawnLimits
from planrun.dev.eval import EvalReport, aevaluate, evaluate
from planrun.dev.fixtures import FixtureMiss, record, replay
from planrun.dev.sim import Scenario, SimResult, simulate
from planrun.model import (
    Batching,
    Budget,
    Completion,
    Limiter,
    Model,
    ModelWorker,
    OutputTruncated,
    Price,
    PriceTable,
    PromptLibrary,
    ProviderLimits,
    RateLimiter,
    RenderedPrompt,
    RetryPolicy,
    RunLimits,
    SharedBudget,
    SharedRateLimiter,
    Usage,
    adecompose,
    decompose,
    limit_key,
)
from planrun.runtime import (
    Clock,
    RealClock,
    Supervisor,
    VirtualClock,
    approve_task,
    hold_run,
    reject_task,
)
from planrun.stores import open_store

try:
    __version__ = _metadata.version("planrun")
except _metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "CONTRACT_CODES",
    "PROBLEM_CODES",
    "App",
    "Approval",
    "Audit",
    "Backoff",
    "Batching",
    "Budget",
    "BudgetExceeded",
    "Clock",
    "Completion",
    "ConfigError",
    "DispatchError",
    "EvalReport",
    "Event",
    "FixtureMiss",
    "IllegalTransition",
    "InvalidPlan",
    "KindSpec",
    "Ledger",
    "Limiter",
    "Model",
    "ModelRefused",
    "ModelWorker",
    "OutputTruncated",
    "PermanentError",
    "Plan",
    "PlanError",
    "PlanTask",
    "PlanrunError",
    "Price",
    "PriceTable",
    "Problem",
    "PromptLibrary",
    "ProviderLimits",
    "RateLimited",
    "RateLimiter",
    "RealClock",
    "Registry",
    "RenderedPrompt",
    "RetryPolicy",
    "RunAborted",
    "RunInUse",
    "RunLimits",
    "RunReport",
    "RunResult",
    "Scenario",
    "SharedBudget",
    "SharedRateLimiter",
    "SimResult",
    "SpawnLimits",
    "SpawnRequest",
    "StallError",
    "Status",
    "StoreError",
    "Supervisor",
    "Task",
    "TaskContext",
    "TaskReport",
    "TransientError",
    "UnknownRun",
    "UnstorableValue",
    "Usage",
    "UsageError",
    "VirtualClock",
    "WorkerError",
    "WorkerSpec",
    "__version__",
    "adecompose",
    "aevaluate",
    "analyze",
    "aplan_and_run",
    "approve_task",
    "aresume_run",
    "decompose",
    "evaluate",
    "hold_run",
    "limit_key",
    "open_store",
    "plan_and_run",
    "plan_schema",
    "read_jsonl",
    "record",
    "redact",
    "reject_task",
    "replay",
    "resume_run",
    "simulate",
    "validate_plan",
]
