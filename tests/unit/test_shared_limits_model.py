"""The Model on shared limits, the CLI's limit flags, and a resume that keeps the spend."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import FAKE_BASE_URL, FAKE_KEY, fake_model

from planrun._facade import aresume_run
from planrun.cli import main
from planrun.core._errors import BudgetExceeded
from planrun.core._ledger import Event
from planrun.core._task import Status, Task
from planrun.dev.testing import FakeOpenAI, Scripted
from planrun.examples import answers
from planrun.examples.ticket_data import generate_tickets
from planrun.examples.tickets import make_app
from planrun.model import DEFAULT_COMPLETION_ESTIMATE, RetryPolicy
from planrun.model._limits import SharedBudget, SharedRateLimiter
from planrun.model._usage import Budget, Usage
from planrun.stores import InMemoryStore, RunInfo, SQLiteStore, open_store


async def test_a_model_meters_every_request_into_the_shared_budget(
        fake_openai: FakeOpenAI) -> None:
    store = InMemoryStore()
    await store.spend_open("r", None, None)
    model = fake_model(meter=Usage(shared=SharedBudget(store, "r")))
    first = await model.complete("hello")
    second = await model.complete("hello again")
    spend = await store.spend("r")
    assert spend is not None and spend.requests == 2 and spend.reserved_tokens == 0
    assert spend.total_tokens == first.usage.total_tokens + second.usage.total_tokens > 0


async def test_no_request_starts_once_the_shared_budget_is_spent(
        fake_openai: FakeOpenAI) -> None:
    store = InMemoryStore()
    await store.spend_open("r", 2000, None)
    await store.spend_settle("r", 0, 0.0, 1, 1900, 0, 0, 0.0)  # another process spent it
    model = fake_model(meter=Usage(shared=SharedBudget(store, "r", patience=0.05)))
    with pytest.raises(BudgetExceeded, match="token budget exceeded"):
        await model.complete("hello")
    assert fake_openai.requests == []  # nothing was sent
    spend = await store.spend("r")
    assert spend is not None and spend.reserved_tokens == 0 and spend.requests == 1


async def test_a_model_takes_its_turn_from_a_shared_limiter_and_reports_a_429(
        fake_openai: FakeOpenAI) -> None:
    fake_openai.script = [Scripted(429, "Rate limit reached", code="rate_limit_exceeded",
                                   headers={"retry-after-ms": "50"})]
    store = InMemoryStore()
    limiter = SharedRateLimiter(store, "gpt-4o-mini", requests_per_minute=6000,
                                tokens_per_minute=1_000_000)
    model = fake_model(limiter=limiter,
                       retry=RetryPolicy(attempts=3, base=0.01, cap=0.05, jitter=0.0))
    start = time.monotonic()
    completion = await model.complete("hello")
    assert completion.attempts == 2
    assert time.monotonic() - start >= 0.05  # the second attempt waited out the pause
    state = await store.limiter_state("gpt-4o-mini")
    assert state is not None and state.acquired == 2 and state.penalties == 1
    # The 429 gave its tokens back (the provider did not count it); the answered request
    # keeps what the provider counts: its prompt's estimate plus its output bound.
    takes = [args["tokens"] for args in store.calls_to("limiter_take")]
    gives = [args["tokens"] for args in store.calls_to("limiter_give")]
    assert len(takes) == 2 and takes[0] == takes[1]
    assert DEFAULT_COMPLETION_ESTIMATE < takes[0] <= DEFAULT_COMPLETION_ESTIMATE + 100
    assert gives == [takes[0]]  # the 429's tokens came back; the answer's are held


# ---- the CLI ---------------------------------------------------------------------------------


@pytest.fixture
def endpoint(fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> FakeOpenAI:
    monkeypatch.setenv("OPENAI_BASE_URL", FAKE_BASE_URL)
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    fake_openai.answers.update(answers.answers())
    return fake_openai


def _plan(tmp_path: Path, n: int = 3) -> Path:
    tasks = [{"kind": "classify_ticket", "payload": {"ticket": t.model_dump()}, "depends_on": []}
             for t in generate_tickets(n)]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"goal": "classify tickets", "tasks": tasks}))
    return path


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


async def _load(url: str, run_id: str) -> Any:
    store = open_store(url)
    await store.open()
    try:
        return (await store.load(run_id)).run.meta, await store.spend(run_id)
    finally:
        await store.close()


def test_run_records_its_limits_and_status_shows_the_spend(
        endpoint: FakeOpenAI, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    code, out, err = _cli(capsys, "run", str(_plan(tmp_path)), "--app",
                          "classify_app:app", "--db", db, "--rpm", "6000",
                          "--budget-tokens", "100000", "--json")
    assert code == 0, err
    report = json.loads(out)
    meta, spend = asyncio.run(_load(db, report["run_id"]))
    limits = meta["limits"]
    assert limits["rpm"] == 6000 and limits["budget_tokens"] == 100000
    assert limits["key"].startswith("gpt-4o-mini@key:") and FAKE_KEY not in json.dumps(meta)
    assert spend.requests == 3 == len(endpoint.requests)
    assert spend.total_tokens == report["usage"]["total_tokens"] > 0
    code, out, _ = _cli(capsys, "status", report["run_id"], "--db", db, "--json")
    status = json.loads(out)
    assert code == 0 and status["counts"]["completed"] == 3  # the old keys stay
    assert status["spend"]["total_tokens"] == spend.total_tokens
    assert status["spend"]["tokens_left"] == 100000 - spend.total_tokens
    assert status["limiter"]["rpm"] == 6000
    code, out, _ = _cli(capsys, "status", report["run_id"], "--db", db)
    assert "spent:" in out and f"{100000 - spend.total_tokens} of 100000 tokens" in out
    assert "6000 rpm" in out


@pytest.mark.parametrize("argv, message", [
    (["--stale-after", "5"], "--stale-after applies to --workers external"),
    (["--workers", "external", "--db", "sqlite:///x.db", "--strategy", "balanced"],
     "--strategy routes local workers"),
    (["--rpm", "0"], "must be > 0"),
    (["--rpm", "10", "--rpm-burst", "0.5"], "--rpm-burst must be >= 1"),
])
def test_a_flag_the_mode_cannot_honour_is_refused(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str],
        message: str) -> None:
    code, _, err = _cli(capsys, "run", str(_plan(tmp_path)), "--app",
                        "classify_app:app", *argv)
    last = err.strip().splitlines()[-1]  # argparse prints its usage above the error
    assert code == 2 and message in last and "error:" in last and "Traceback" not in err


def test_the_rate_flags_default_from_the_environment(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    monkeypatch.setenv("PLANRUN_RPM", "many")
    code, _, err = _cli(capsys, "worker", "--db", f"sqlite:///{tmp_path}/x.db", "--app",
                        "classify_app:app")
    assert code == 2 and "--rpm" in err and "many" in err


async def test_a_resumed_run_continues_from_what_it_spent(
        fake_openai: FakeOpenAI, tmp_path: Path) -> None:
    fake_openai.answers.update(answers.answers())
    app = make_app(workers=1)[0]

    async def stored_run(run_id: str, spent: int) -> SQLiteStore:
        store = SQLiteStore(str(tmp_path / f"{run_id}.db"))
        await store.open()
        await store.create_run(RunInfo(run_id, time.time(), "running", "classify"))
        tasks = [Task(id=f"t{i}", kind="classify_ticket", payload={"ticket": t.model_dump()})
                 for i, t in enumerate(generate_tickets(3))]
        await store.add_tasks(run_id, tasks, [Event(i, time.time(), t.id, "created", None, 0,
                                                    {}) for i, t in enumerate(tasks)])
        await store.spend_open(run_id, 5000, None)
        await store.spend_settle(run_id, 0, 0.0, 4, spent, 0, 0, 0.0)
        return store

    # 4,900 of 5,000 tokens were spent before the crash: nothing more may start.
    store = await stored_run("spent", 4900)
    report = await aresume_run("spent", app, store, model=fake_model(),
                               budget=Budget(max_tokens=5000))
    assert fake_openai.requests == [] and report.budget_exhausted
    assert {t.status for t in report.tasks} == {"cancelled"}
    assert {t.cause for t in report.tasks} == {"budget"}
    spend = await store.spend("spent")
    assert spend is not None and spend.total_tokens == 4900
    await store.close()
    # The same run with room left: its calls are added to what was spent.
    store = await stored_run("room", 100)
    report = await aresume_run("room", app, store, model=fake_model(),
                               budget=Budget(max_tokens=5000))
    assert [t.status for t in report.tasks] == ["completed"] * 3
    spend = await store.spend("room")
    assert report.usage is not None
    assert spend is not None and spend.total_tokens == 100 + report.usage.total.total_tokens
    assert spend.requests == 4 + 3
    await store.close()
    assert Status.CANCELLED.value == "cancelled"
