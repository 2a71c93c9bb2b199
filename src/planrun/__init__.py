"""planrun: turn a prose goal into a validated task plan and run it exactly once.

A decomposer asks a model for a plan over the kinds of work that exist; the plan is
validated (every problem reported, nothing dispatched until it passes); a code-enforced
supervisor assigns each task to exactly one worker, retries what is transient, gives up on
what is permanent, reclaims what goes silent, and applies side effects once.

    from planrun import Model, plan_and_run
    from planrun.examples import brief

    report = plan_and_run(brief.GOAL, brief.app, model=Model())
    print(report.summary())

The top level holds what a user calls or catches: running a goal or a plan, what a plan
will cost (:func:`estimate`), the app and its registry, the model, budgets and limits,
approvals, the report and the errors. The
rest is imported from its subpackage, laid out by role: :mod:`planrun.core` decides (the
task record, the ledger, kinds and workers, the other errors), :mod:`planrun.runtime`
carries out (the :class:`~planrun.runtime.Supervisor`, clocks, run ownership),
:mod:`planrun.stores` keeps (:func:`~planrun.stores.open_store`), :mod:`planrun.model`
talks to models (usage, prices, rate limiters, prompts), :mod:`planrun.obs` observes,
:mod:`planrun.testing` replays and records model traffic and holds the test doubles, and
:mod:`planrun.dev` holds the development tools (:mod:`planrun.dev.eval`,
:mod:`planrun.dev.sim`, ...).
"""

from importlib import metadata as _metadata

from planrun._facade import (
    App,
    RunReport,
    TaskReport,
    aplan_and_run,
    aresume_run,
    estimate,
    plan_and_run,
    resume_run,
)
from planrun.core import (
    BudgetExceeded,
    InvalidPlan,
    PermanentError,
    Plan,
    PlanrunError,
    Problem,
    Registry,
    RunAborted,
    RunInUse,
    SpawnRequest,
    Status,
    StoreError,
    TaskContext,
    TransientError,
    UnknownRun,
    UsageError,
    validate_plan,
)
from planrun.core.scheduling import Approval, SpawnLimits
from planrun.model import (
    Batching,
    Budget,
    Model,
    ModelWorker,
    PriceTable,
    RetryPolicy,
    RunLimits,
    adecompose,
    decompose,
)
from planrun.runtime import approve_task, reject_task

try:
    __version__ = _metadata.version("planrun")
except _metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "App",
    "Approval",
    "Batching",
    "Budget",
    "BudgetExceeded",
    "InvalidPlan",
    "Model",
    "ModelWorker",
    "PermanentError",
    "Plan",
    "PlanrunError",
    "PriceTable",
    "Problem",
    "Registry",
    "RetryPolicy",
    "RunAborted",
    "RunInUse",
    "RunLimits",
    "RunReport",
    "SpawnLimits",
    "SpawnRequest",
    "Status",
    "StoreError",
    "TaskContext",
    "TaskReport",
    "TransientError",
    "UnknownRun",
    "UsageError",
    "__version__",
    "adecompose",
    "aplan_and_run",
    "approve_task",
    "aresume_run",
    "decompose",
    "estimate",
    "plan_and_run",
    "reject_task",
    "resume_run",
    "validate_plan",
]
