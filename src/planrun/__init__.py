"""planrun: turn a prose goal into a validated task plan and run it exactly once.

A decomposer asks a model for a plan over the kinds of work that exist; the plan is
validated (every problem reported, nothing dispatched until it passes); a code-enforced
supervisor assigns each task to exactly one worker, retries what is transient, gives up on
what is permanent, reclaims what goes silent, and applies side effects once.

    from planrun import Model, plan_and_run
    from planrun.examples import brief

    report = plan_and_run(brief.GOAL, brief.app, model=Model())
    print(report.summary())

Everything public is importable from here; submodules are implementation.
"""

from importlib import metadata as _metadata

from planrun.approval import approve_task, reject_task
from planrun.clock import Clock, RealClock, VirtualClock
from planrun.decompose import adecompose, decompose
from planrun.distributed import Coordinator, WorkerProcess
from planrun.errors import (
    BudgetExceeded,
    ConfigError,
    DispatchError,
    IllegalTransition,
    InvalidPlan,
    ModelRefused,
    PermanentError,
    PlanError,
    PlanrunError,
    RateLimited,
    RunAborted,
    RunInUse,
    StallError,
    StoreError,
    TransientError,
    UnknownRun,
    UnstorableValue,
    UsageError,
    WorkerError,
)
from planrun.eval import EvalReport, aevaluate, evaluate
from planrun.fixtures import FixtureMiss, record, replay
from planrun.ledger import Audit, Event, Ledger, analyze, read_jsonl
from planrun.limiter import RateLimiter
from planrun.limits import Limiter, RunLimits, SharedBudget, SharedRateLimiter, limit_key
from planrun.model import Completion, Model, RetryPolicy
from planrun.ownership import hold_run
from planrun.plan import PROBLEM_CODES, Plan, PlanTask, Problem, plan_schema, validate_plan
from planrun.prompts import PromptLibrary, RenderedPrompt
from planrun.redact import redact
from planrun.registry import KindSpec, Registry, SpawnRequest, TaskContext, WorkerSpec
from planrun.runner import (
    App,
    RunReport,
    TaskReport,
    aplan_and_run,
    aresume_run,
    plan_and_run,
    resume_run,
)
from planrun.scheduling import Approval, SpawnLimits
from planrun.sim import Scenario, SimResult, simulate
from planrun.stores import open_store
from planrun.supervisor import Backoff, RunResult, Supervisor
from planrun.task import Status, Task
from planrun.usage import Budget, Price, PriceTable, Usage
from planrun.workers import ModelWorker

try:
    __version__ = _metadata.version("planrun")
except _metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "PROBLEM_CODES",
    "App",
    "Approval",
    "Audit",
    "Backoff",
    "Budget",
    "BudgetExceeded",
    "Clock",
    "Completion",
    "ConfigError",
    "Coordinator",
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
    "PermanentError",
    "Plan",
    "PlanError",
    "PlanTask",
    "PlanrunError",
    "Price",
    "PriceTable",
    "Problem",
    "PromptLibrary",
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
    "WorkerProcess",
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
