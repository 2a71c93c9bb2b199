"""Release: migrate the database, deploy the app, smoke-test it, in that order.

The release is a ready plan (no decomposition): the order is a fact, not a guess. It runs
with ``on_dead="abort_run"``: if the migration dies, nothing deploys onto an unmigrated
database.

    python -m planrun.examples.release       # live: needs OPENAI_API_KEY
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from planrun._facade import App
from planrun.core import Registry, WorkerSpec
from planrun.model import ModelWorker

__all__ = ["RELEASE_PLAN", "DeployChecklist", "MigrationPlan", "SmokeChecks", "make_app"]


class MigrationRequest(BaseModel):
    database: str
    change: str


class MigrationPlan(BaseModel):
    statements: list[str]
    reversible: bool
    rollback: list[str]
    locks: list[str]
    risks: list[str]


class DeployRequest(BaseModel):
    service: str
    version: str


class DeployChecklist(BaseModel):
    preconditions: list[str]
    steps: list[str]
    health_checks: list[str]
    rollback: list[str]


class SmokeRequest(BaseModel):
    service: str
    feature: str


class Check(BaseModel):
    name: str
    request: str
    expected: str
    critical: bool


class SmokeChecks(BaseModel):
    checks: list[Check]


RELEASE_PLAN: dict[str, Any] = {
    "goal": "release billing-api 2.4.0 with invoice PDF export",
    "tasks": [
        {"kind": "migrate_db",
         "payload": {"database": "billing",
                     "change": "add nullable column invoices.pdf_url text; index it"},
         "depends_on": []},
        {"kind": "deploy_app", "payload": {"service": "billing-api", "version": "2.4.0"},
         "depends_on": [0]},
        {"kind": "smoke_test",
         "payload": {"service": "billing-api", "feature": "invoice PDF export"},
         "depends_on": [1]},
    ],
}
"""The release as a plan document (the shape `planrun validate` reads)."""


def make_app() -> App:
    """db-1 migrates, deploy-1/deploy-2 deploy, qa-1 tests: the comparison's workers."""
    registry = Registry()
    # The contracts: a release is done when it is smoke-tested, which needs the deployment.
    registry.register("migrate_db", ModelWorker("migrate", result=MigrationPlan),
                      payload=MigrationRequest, unique=True,
                      description="Plan a database migration.")
    registry.register("deploy_app", ModelWorker("deploy", result=DeployChecklist),
                      payload=DeployRequest, unique=True,
                      description="Prepare the deployment of a release.")
    registry.register("smoke_test", ModelWorker("smoke_test", result=SmokeChecks),
                      payload=SmokeRequest, needs=["deploy_app"], delivers=True, unique=True,
                      description="Design the post-deploy smoke tests.")
    workers = [
        WorkerSpec("db-1", {"migrate_db": 1.0}),
        WorkerSpec("deploy-1", {"deploy_app": 1.0}),
        WorkerSpec("deploy-2", {"deploy_app": 1.0}),
        WorkerSpec("qa-1", {"smoke_test": 1.0}),
    ]
    return App(registry, workers, description="Release")


app = make_app()
"""A ready app for ``--app planrun.examples.release:app``."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the release live against the configured endpoint."""
    from planrun._facade import plan_and_run

    argparse.ArgumentParser(description="Release (live)").parse_args(argv)
    report = plan_and_run(RELEASE_PLAN, make_app(), on_dead="abort_run")
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    from planrun.examples import run_main

    raise SystemExit(run_main(main))
