"""``planrun demo``: the worked examples end to end, offline from their fixtures.

``planrun demo`` replays the competitive-brief cassette through the real decomposer,
supervisor and model client: the goal, the validated plan as a tree, live progress while
the tasks run, and the final report. ``planrun demo tickets`` does the same for the
200-ticket triage, ``planrun demo triage`` for the triage grown at run time (one task
fetches the tickets and spawns the rest), ``planrun demo batch`` for a triage sent as Batch
API jobs (half price), ``planrun demo release`` for the release.
``--live`` runs the same against the configured endpoint (``OPENAI_API_KEY``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console

from planrun._facade import App, RunReport
from planrun.core import Plan, UsageError
from planrun.obs import Progress, plan_tree, report_table

__all__ = ["DEMOS", "cassette_path", "run_demo"]

DEMOS = ("brief", "tickets", "release", "triage", "batch")


def cassette_path(name: str) -> Path:
    """The shipped cassette of a demo (see :func:`planrun.dev.fixtures.shipped_cassette`)."""
    from planrun.dev.fixtures import shipped_cassette

    return shipped_cassette(name)


def _example(name: str) -> tuple[App, Any, dict[str, Any], Any]:
    """The app, the goal or plan, extra run options, and the outbox (tickets) of a demo."""
    from planrun.dev.scenarios import TICKETS, TRIAGE_TICKETS, batch_options
    from planrun.examples import brief, release, tickets
    from planrun.examples.ticket_data import generate_tickets

    if name == "brief":
        return brief.make_app(), brief.GOAL, {}, None
    if name == "release":
        return release.make_app(), release.RELEASE_PLAN, {"on_dead": "abort_run"}, None
    # No person at a demo: replies to security incidents wait for approval, and are
    # approved by default one second into the wait (planrun approve decides a real run).
    app, outbox, desk = tickets.make_app(approve_security="auto")
    if name == "triage":  # one task fetches the tickets; the rest of the plan grows from it
        return app, tickets.triage_plan(TRIAGE_TICKETS, app.registry, seed=0), {}, (outbox, desk)
    if name == "batch":  # the same triage as Batch API jobs, at half price
        plan = tickets.ticket_plan(generate_tickets(TRIAGE_TICKETS, seed=0), app.registry)
        return app, plan, batch_options(), (outbox, desk)
    plan = tickets.ticket_plan(generate_tickets(TICKETS, seed=0), app.registry)
    return app, plan, {}, (outbox, desk)


def run_demo(name: str = "brief", *, live: bool = False, console: Console | None = None,
             model_name: str | None = None, timeout: float | None = None) -> RunReport:
    """Run one demo and print it; returns the report."""
    from planrun._facade import plan_and_run
    from planrun.model import Model, Usage, decompose

    if name not in DEMOS:
        raise UsageError(f"unknown demo {name!r}; choose one of {', '.join(DEMOS)}")
    out = console or Console()
    app, source, options, sinks = _example(name)
    with _model_for(name, live, model_name, timeout) as model:
        assert isinstance(model, Model)
        where = f"live, {model.base_url}" if live else f"replayed from {cassette_path(name).name}"
        out.rule(f"[bold]planrun demo {name}[/] [dim]({where})[/]")
        usage = Usage()
        if isinstance(source, str):
            out.print(f"[bold]goal:[/] {source}")
            plan = decompose(source, app.registry, model, meter=usage)
            calls = usage["decompose"].requests
            repairs = f", {calls - 1} repair(s) of an invalid plan" if calls > 1 else ""
            fixed = sum(r.by == "code" for r in plan.repairs)
            repairs += f", {fixed} code repair(s)" if fixed else ""
            out.print(f"[bold]plan:[/] validated after {calls} model call(s){repairs}")
        else:
            plan = source if isinstance(source, Plan) else Plan.parse(source, app.registry)
            out.print(f"[bold]goal:[/] {plan.goal}")
        out.print(plan_tree(plan, limit=12))
        progress = Progress(len(plan.tasks), out)
        with progress:
            report = plan_and_run(plan, app, model=model, usage=usage, progress=progress,
                                  **options)
    out.print(report_table(report, limit=12))
    out.print(report.summary())
    batched = [e for e in report.events if e.event == "batched" and "line" in e.detail]
    if batched:
        jobs = len({e.detail["batch"] for e in batched})
        out.print(f"batch mode: {len(batched)} model calls went out in {jobs} Batch API "
                  "job(s), counted at half the list price")
    if sinks is not None:
        outbox, desk = sinks
        approved = sum(1 for e in report.events if e.event == "approved")
        out.print(f"replies sent: {len(outbox.sent)} (each once), "
                  f"flagged for a human: {len(desk.flagged)}, "
                  f"security replies sent after approval: {approved}")
    return report


@contextlib.contextmanager
def _model_for(name: str, live: bool, model_name: str | None,
               timeout: float | None = None) -> Iterator[Any]:
    from planrun.model import Model

    if live:
        yield Model(model_name) if timeout is None else Model(model_name, timeout=timeout)
        return
    from planrun.dev.fixtures import replay

    with replay(cassette_path(name)) as cassette:
        yield cassette.model(model_name)
