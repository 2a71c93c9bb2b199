"""The package root is the way in: ``__all__`` is pinned, small, and every name resolves;
what left the top level is imported from its subpackage."""

from __future__ import annotations

import importlib
import inspect

import pytest

import planrun

PINNED = {
    "__version__", "plan_and_run", "aplan_and_run", "resume_run", "aresume_run", "App",
    "RunReport", "TaskReport", "Plan", "Problem", "validate_plan", "decompose", "adecompose",
    "Registry", "TaskContext", "SpawnRequest", "RetryPolicy", "Approval", "SpawnLimits",
    "Model", "ModelWorker", "Budget", "RunLimits", "PriceTable", "Batching", "Status",
    "approve_task", "reject_task", "PlanrunError", "InvalidPlan", "TransientError",
    "PermanentError", "UsageError", "StoreError", "BudgetExceeded", "RunAborted", "RunInUse",
    "UnknownRun", "estimate",
}

HOMES = {
    "planrun.core": [
        "CONTRACT_CODES", "PROBLEM_CODES", "Audit", "ConfigError", "DispatchError", "Event",
        "IllegalTransition", "KindSpec", "Ledger", "ModelRefused", "PlanError", "PlanTask",
        "RateLimited", "RunResult", "StallError", "Task", "UnstorableValue", "WorkerError",
        "WorkerSpec", "analyze", "plan_schema", "read_jsonl", "redact",
    ],
    "planrun.model": [
        "Completion", "Limiter", "OutputTruncated", "Price", "PromptLibrary", "ProviderLimits",
        "RateLimiter", "RenderedPrompt", "SharedBudget", "SharedRateLimiter", "Usage",
        "limit_key", "Estimate", "estimate_plan",
    ],
    "planrun.runtime": ["Clock", "RealClock", "Supervisor", "VirtualClock", "hold_run"],
    "planrun.stores": ["open_store"],
    "planrun.testing": ["Cassette", "FixtureMiss", "record", "replay"],
    "planrun.dev.eval": ["EvalReport", "aevaluate", "evaluate"],
    "planrun.dev.sim": ["Scenario", "SimResult", "simulate"],
}
"""Where each name that left the top level is imported from now."""


def test_all_is_pinned() -> None:
    assert set(planrun.__all__) == PINNED
    assert len(planrun.__all__) == len(set(planrun.__all__))
    assert len(planrun.__all__) <= 40


@pytest.mark.parametrize("module", sorted(HOMES))
def test_a_name_off_the_top_level_is_public_in_its_subpackage(module: str) -> None:
    package = importlib.import_module(module)
    for name in HOMES[module]:
        assert name in package.__all__ and hasattr(package, name), f"{module}.{name}"
        assert name not in planrun.__all__, name


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
