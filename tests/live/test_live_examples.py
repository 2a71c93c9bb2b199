"""The three examples over real HTTP: sync, async, threads, a notebook's loop, the CLI."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from live_support import LIVE_KEY, REPO, live_model
from standin import StandIn

from planrun._facade import RunReport, aplan_and_run, plan_and_run
from planrun.examples import brief, release, tickets
from planrun.examples.ticket_data import generate_tickets
from planrun.model._decompose import adecompose, decompose


def _all_completed(report: RunReport, count: int) -> None:
    errors = [f"{t.id}: {t.error}" for t in report.tasks if t.error]
    assert report.counts["completed"] == count, errors
    assert report.audit.clean


def test_one_model_across_decompose_and_two_runs(live_server: StandIn) -> None:
    server = live_server
    model = live_model(server)
    app = brief.make_app()
    plan = decompose(brief.GOAL, app.registry, model)
    _all_completed(plan_and_run(plan, app, model=model), 6)
    _all_completed(plan_and_run(plan, app, model=model), 6)
    _all_completed(plan_and_run(release.RELEASE_PLAN, release.make_app(), model=model), 3)
    assert server.requests == 2 + 6 + 6 + 3
    assert server.connections < server.requests  # keep-alive: connections are reused


def test_async_api_then_sync_api_with_the_same_model(live_server: StandIn) -> None:
    server = live_server
    model = live_model(server)
    app, outbox, desk = tickets.make_app()
    plan = tickets.ticket_plan(generate_tickets(12, seed=3), app.registry)

    async def main() -> tuple[RunReport, RunReport]:
        brief_app = brief.make_app()
        brief_plan = await adecompose(brief.GOAL, brief_app.registry, model)
        first = await aplan_and_run(brief_plan, brief_app, model=model)
        second = await aplan_and_run(plan, app, model=model)
        return first, second

    first, second = asyncio.run(main())
    _all_completed(first, 6)
    _all_completed(second, 24)
    assert len(outbox.sent) + len(desk.flagged) == 12
    _all_completed(plan_and_run(release.RELEASE_PLAN, release.make_app(), model=model), 3)


def test_two_threads_share_one_model(live_server: StandIn) -> None:
    server = live_server
    model = live_model(server)
    reports: list[RunReport] = []
    failures: list[BaseException] = []

    def run() -> None:
        try:
            reports.append(plan_and_run(release.RELEASE_PLAN, release.make_app(), model=model))
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures
    assert len(reports) == 3
    for report in reports:
        _all_completed(report, 3)


def test_the_sync_api_inside_a_running_loop_as_in_a_notebook(live_server: StandIn) -> None:
    server = live_server
    model = live_model(server)

    async def cell() -> list[RunReport]:
        app = brief.make_app()
        plan = decompose(brief.GOAL, app.registry, model)  # a private thread and loop
        return [plan_and_run(plan, app, model=model), plan_and_run(plan, app, model=model)]

    for report in asyncio.run(cell()):
        _all_completed(report, 6)


def _live_env(server: StandIn) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "PLANRUN_"))}
    env.update(OPENAI_BASE_URL=server.base_url, OPENAI_API_KEY=LIVE_KEY, COLUMNS="200")
    return env


@pytest.mark.parametrize(
    ("demo", "completed"), [("brief", 6), ("release", 3), ("tickets", 400)]
)
def test_cli_demo_live(live_server: StandIn, demo: str, completed: int) -> None:
    server = live_server
    planrun = str(Path(sys.executable).parent / "planrun")
    args = [planrun, "demo", *([demo] if demo != "brief" else []), "--live"]
    done = subprocess.run(args, env=_live_env(server), capture_output=True, text=True,
                          timeout=180, cwd=REPO)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"completed {completed}" in done.stdout
    assert "dead" not in done.stdout.split("run ")[-1].split("\n")[0]
    assert LIVE_KEY not in done.stdout + done.stderr


def test_example_module_runs_live(live_server: StandIn) -> None:
    server = live_server
    done = subprocess.run([sys.executable, "-m", "planrun.examples.brief"],
                          env=_live_env(server), capture_output=True, text=True, timeout=120,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr


def test_decompose_notebook_runs_live(live_server: StandIn, tmp_path: Path) -> None:
    server = live_server
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient

    path = REPO / "notebooks" / "decompose_prompt.ipynb"
    notebook = nbformat.read(path, as_version=4)
    # What a user does to go live: flip the switch in the first code cell (a key alone
    # does not).
    [switch] = [c for c in notebook.cells if c.cell_type == "code" and "LIVE = False" in c.source]
    switch.source = switch.source.replace("LIVE = False", "LIVE = True", 1)
    env = _live_env(server)
    client = NotebookClient(notebook, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        client.execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    errors = [o for c in notebook.cells if c.cell_type == "code"
              for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    assert server.requests >= 2


def test_example_module_ends_an_invalid_plan_without_a_traceback() -> None:
    from planrun.dev.testing import FakeOpenAI
    from planrun.examples.answers import INVALID_BRIEF_PLAN, answers

    with StandIn(FakeOpenAI({**answers(), "plan": INVALID_BRIEF_PLAN})) as server:
        done = subprocess.run([sys.executable, "-m", "planrun.examples.brief"],
                              env=_live_env(server), capture_output=True, text=True,
                              timeout=120, cwd=REPO)
    assert done.returncode == 1
    assert "still invalid after 3 attempt(s)" in done.stderr
    assert "unknown_kind" in done.stderr or "verify_sources" in done.stderr
    assert "Traceback" not in done.stderr and "no running event loop" not in done.stderr


def test_five_percent_of_replies_cut_short_lose_no_task_of_the_triage(
    standin: Callable[..., StandIn],
) -> None:
    server = standin(malformed=0.05)
    app, outbox, desk = tickets.make_app()
    plan = tickets.ticket_plan(generate_tickets(200, seed=0), app.registry)
    report = plan_and_run(plan, app, model=live_model(server))
    assert server.malformed_sent >= 19  # every 20th of the 400-odd answers
    _all_completed(report, 400)
    assert len(outbox.sent) + len(desk.flagged) == 200  # every reply delivered, once per key
