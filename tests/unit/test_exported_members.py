"""The package root is the way in: ``__all__`` is pinned, sorted, and every name resolves."""

from __future__ import annotations

import inspect

import planrun

PINNED = {
    "App", "Audit", "Backoff", "Batching", "Budget", "BudgetExceeded", "Clock", "Completion",
    "ConfigError", "DispatchError", "Event", "IllegalTransition", "InvalidPlan", "KindSpec",
    "Ledger", "Model", "ModelRefused", "ModelWorker", "OutputTruncated", "PROBLEM_CODES",
    "PermanentError", "Plan",
    "PlanError", "PlanTask", "PlanrunError", "Price", "PriceTable", "Problem", "PromptLibrary",
    "ProviderLimits", "RateLimited", "RateLimiter", "RealClock", "Registry", "RenderedPrompt",
    "RetryPolicy",
    "RunAborted", "RunReport", "RunResult", "Scenario", "SimResult", "SpawnLimits",
    "SpawnRequest", "StallError", "Status",
    "StoreError", "Supervisor", "Task", "TaskContext", "TaskReport", "TransientError", "Usage",
    "UsageError", "VirtualClock", "WorkerError", "WorkerSpec", "__version__", "adecompose",
    "analyze", "aplan_and_run", "decompose", "plan_and_run", "plan_schema", "read_jsonl",
    "simulate", "validate_plan", "FixtureMiss", "record", "redact",
    "replay", "aresume_run", "resume_run", "open_store", "RunInUse", "UnknownRun",
    "UnstorableValue", "hold_run", "EvalReport", "evaluate",
    "aevaluate",
    "Approval", "approve_task", "reject_task",
    "Limiter", "RunLimits", "SharedBudget", "SharedRateLimiter", "limit_key",
    "CONTRACT_CODES",
}


def test_all_is_pinned() -> None:
    assert set(planrun.__all__) == PINNED
    assert len(planrun.__all__) == len(set(planrun.__all__))


def test_every_export_resolves_and_public_callables_have_docstrings() -> None:
    for name in planrun.__all__:
        obj = getattr(planrun, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), f"{name} has no docstring"


def test_errors_share_one_root() -> None:
    for name in planrun.__all__:
        obj = getattr(planrun, name)
        if inspect.isclass(obj) and issubclass(obj, Exception):
            assert issubclass(obj, planrun.PlanrunError), name


def test_sync_and_async_pairs_take_the_same_arguments() -> None:
    for sync, async_ in [(planrun.decompose, planrun.adecompose)]:  # evaluate passes **options
        assert inspect.signature(sync).parameters.keys() == \
            inspect.signature(async_).parameters.keys()
