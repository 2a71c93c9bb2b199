"""What one attempt carries between the process that runs a plan and the process that does
the task, through DBOS: the call (task, token, payload, inputs) and the outcome (the result
and what the attempt spawned, or its failure as :func:`~planrun.core.scheduling.failure_of`
classified it where it ran). Plain JSON both ways; no decision is made on either side of it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

from planrun.core import SpawnRequest, TaskContext, UsageError
from planrun.core.scheduling import Failure, ReportedFailure, failure_of

__all__ = [
    "APP_VERSION",
    "ATTEMPT_WORKFLOW",
    "app_version",
    "attempt_id",
    "call_of",
    "dbos_settings",
    "dbos_url",
    "failed",
    "queue_name",
    "succeeded",
    "take_outcome",
]

ATTEMPT_WORKFLOW = "planrun.attempt"
"""The DBOS workflow every worker process registers: one attempt of one task."""

APP_VERSION = "planrun-1"
"""The application version planrun's workflows are enqueued and served under (qualified by
the application: :func:`app_version`), the same in every process whatever else the
application registers (DBOS serves a queued workflow only to processes of its version)."""


def application_name(name: str) -> str:
    """``name`` (an app's ``module:attr``, say) as a DBOS application name: lowercase
    letters, digits, dashes and underscores."""
    plain = re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-")
    return plain if len(plain) >= 3 else f"planrun-{plain}".rstrip("-")


def app_version(app_name: str) -> str:
    """The version an application's attempts are enqueued and served under: planrun's
    (:data:`APP_VERSION`) qualified by the application, since DBOS gives a version name to
    the first application that registers it in a database, and refuses it to any other."""
    return f"{APP_VERSION}-{application_name(app_name)}"


def queue_name(kind: str) -> str:
    """The DBOS queue of a kind's attempts: served by the processes that do the kind."""
    return f"planrun.{kind}"


def attempt_id(run_id: str, task_id: str, token: int) -> str:
    """The DBOS workflow id of an attempt: one per run, task and fencing token."""
    return f"{run_id}:{task_id}:{token}"


def dbos_url(url: str) -> str:
    """The DBOS system database for a store URL: the same PostgreSQL database (DBOS keeps
    its tables in the schema ``dbos``), or a file beside the SQLite store."""
    scheme = urlsplit(url).scheme.lower()
    if scheme in ("postgresql", "postgres"):
        return "postgresql://" + url.split("://", 1)[1]
    if scheme == "sqlite":
        path = url.split("://", 1)[1]
        if path in ("", "/", "/:memory:"):
            raise UsageError("DBOS workers need a database file or server; "
                             "sqlite:///:memory: lives in one process only")
        return f"sqlite://{path}.dbos"
    raise UsageError(f"DBOS workers need a postgresql:// or sqlite:/// URL, not {url!r}")


def dbos_schema(url: str) -> str:
    """The PostgreSQL schema of DBOS's tables for a store URL: ``dbos``, or
    ``<schema>_dbos`` when the URL puts the store in a schema of its own
    (``?options=-csearch_path=<schema>``), so runs kept apart stay apart on DBOS too."""
    for value in parse_qs(urlsplit(url).query).get("options", []):
        found = re.search(r"-c\s*search_path=([A-Za-z_][A-Za-z0-9_]*)", value)
        if found:
            return f"{found.group(1)}_dbos"
    return "dbos"


def dbos_settings(url: str, app_name: str = "planrun") -> dict[str, str]:
    """The entries of a DBOS configuration that make a process serve planrun's queues for
    the runs in ``url``: the application's name as DBOS spells it (``app_name`` is the
    name the process running the plan gives, ``module:attr`` from the CLI), the system
    database and its schema beside the store, and the application version planrun's
    attempts are enqueued under. An application that runs its own DBOS instance merges
    them into its ``DBOSConfig``.
    """
    return {"name": application_name(app_name), "system_database_url": dbos_url(url),
            "dbos_system_schema": dbos_schema(url),
            "application_version": app_version(app_name)}


def call_of(ctx: TaskContext) -> dict[str, Any]:
    """The call a worker process gets for the attempt ``ctx`` describes."""
    call = {"run_id": ctx.run_id, "task_id": ctx.task_id, "kind": ctx.kind,
            "token": ctx.attempt, "payload": dict(ctx.payload),
            "estimate_s": ctx.estimate_s, "inputs": dict(ctx.inputs)}
    if ctx.tier is not None:  # the tier the core chose travels with the attempt
        call["tier"] = ctx.tier.to_dict()
    return call


def succeeded(result: Any, spawned: Sequence[SpawnRequest]) -> dict[str, Any]:
    """The outcome of an attempt that returned ``result`` (checked by its kind, JSON)."""
    outcome: dict[str, Any] = {"result": result}
    if spawned:
        outcome["spawned"] = [
            {"kind": s.kind, "payload": dict(s.payload), "depends_on": list(s.depends_on),
             "joins": list(s.joins), "estimate_s": s.estimate_s} for s in spawned]
    return outcome


def failed(exc: BaseException) -> dict[str, Any]:
    """The outcome of an attempt that raised ``exc``, classified where it ran."""
    failure = failure_of(exc)
    return {"failure": {"error": failure.error, "error_class": failure.error_class,
                        "retry_after": failure.retry_after, "budget": failure.budget}}


def take_outcome(outcome: Mapping[str, Any], ctx: TaskContext) -> Any:
    """The attempt's result, its spawns added to ``ctx``; or its failure raised as the
    :class:`ReportedFailure` the core reads as it was classified. What the attempt's model
    requests used (``usage``, as the worker process priced them) is added to the run's
    meter (``ctx.extras["usage"]``), whose ledger then holds them as this process's own."""
    meter = ctx.extras.get("usage")
    if meter is not None and outcome.get("usage"):
        for record in outcome["usage"]:
            meter.add(record)
    failure = outcome.get("failure")
    if failure is not None:
        raise ReportedFailure(Failure(str(failure["error"]), str(failure["error_class"]),
                                      failure.get("retry_after"), bool(failure.get("budget"))))
    for spawn in outcome.get("spawned") or ():
        ctx.spawned.append(SpawnRequest(
            spawn["kind"], spawn.get("payload") or {}, tuple(spawn.get("depends_on") or ()),
            tuple(spawn.get("joins") or ()), float(spawn.get("estimate_s", 1.0))))
    return outcome.get("result")
