"""Batch mode end to end: the real openai SDK against the stand-in's Batch API over HTTP.

The ticket triage (two model calls per ticket, classify then draft) runs with ``batch=``:
its calls go out as batch files, come back as lines, and the run finishes every task once;
failed lines are retried, an expired batch and a near deadline send calls live, the budget
counts batch prices, and a run killed between submission and results is resumed without a
second submission.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from planrun import (
    Batching,
    Budget,
    BudgetExceeded,
    Model,
    RetryPolicy,
    aplan_and_run,
    plan_and_run,
    resume_run,
)
from planrun.core import EventName
from planrun.dev.testing import FakeBatchAPI, FakeOpenAI
from planrun.examples.answers import answers
from planrun.examples.ticket_data import generate_tickets
from planrun.examples.tickets import make_app, ticket_plan
from planrun.model import Batcher, Usage
from planrun.stores import open_store

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tools"))
from standin import StandIn  # noqa: E402

KEY = "sk-standin-batch-mode-0000000000"
FAST = Batching(wait_s=0.05, poll_s=0.05, live_s=0.2, cancel_s=0.5)


def _server(**batch: Any) -> StandIn:
    fake = FakeOpenAI(answers())
    return StandIn(fake, batch_api=FakeBatchAPI(fake, **batch))


def _model(server: StandIn) -> Model:
    return Model("gpt-4o-mini", api_key=KEY, base_url=server.base_url,
                 retry=RetryPolicy(attempts=4, base=0.05, cap=0.2))


def _triage(server: StandIn, tickets: int, **options: Any) -> Any:
    app, outbox, _ = make_app(workers=2, capacity=4)
    plan = ticket_plan(generate_tickets(tickets, 0), app.registry)
    return plan_and_run(plan, app, model=_model(server), **options), outbox


def _completed_once(report: Any) -> None:
    completions = Counter(e.task for e in report.result.events
                          if e.event == EventName.COMPLETED)
    assert report.ok, report.summary()
    assert set(completions) == set(report.result.tasks)
    assert set(completions.values()) == {1}


def test_a_batched_run_completes_every_task_once_at_half_the_live_cost() -> None:
    with _server(complete_after=0.1) as server:
        batched, outbox = _triage(server, 12, batch=FAST)
        api = server.batch_api
        assert api.submitted >= 2  # classifications, then drafts
        lines = sum(b["request_counts"]["total"] for b in api.batches.values())
        assert lines == 24
    _completed_once(batched)
    assert len(outbox.sent) == len([t for t in batched.result.tasks.values()
                                    if t.kind == "draft_reply" and not t.result["needs_human"]])
    with _server() as server:
        live, _ = _triage(server, 12)
        assert server.batch_api.submitted == 0
    _completed_once(live)
    # the same tokens, billed at half the price
    assert batched.usage.total.total_tokens == live.usage.total.total_tokens
    assert batched.usage.total.requests == live.usage.total.requests == 24
    assert batched.usage.total.cost_usd == pytest.approx(live.usage.total.cost_usd / 2)


def test_failed_lines_go_through_the_failure_policy_and_are_retried() -> None:
    failed: Counter[str] = Counter()

    def fail_first_three(custom_id: str, body: dict[str, Any]) -> Any:
        if custom_id in failed or len(failed) >= 3:
            return None
        failed[custom_id] += 1
        return 500, {"error": {"message": "The server had an error while processing your "
                               "request.", "type": "server_error", "param": None,
                               "code": None}}

    with _server(complete_after=0.05, fail_lines=fail_first_three) as server:
        report, _ = _triage(server, 6, batch=FAST)
        submitted = server.batch_api.submitted
    _completed_once(report)
    assert sum(failed.values()) == 3
    errors = [r.error for r in report.usage.records if r.error]
    assert errors == ["TransientError"] * 3  # counted like a live 500, then retried
    assert submitted >= 3  # the retried calls went out in a later batch
    failures = [e for e in report.result.events if e.event == EventName.FAILED]
    assert len(failures) == 0  # the model client's retries absorbed them (same as live)


def test_an_expired_batch_sends_the_calls_it_did_not_do_live() -> None:
    with _server(complete_after=60, expire_after=0.3) as server:
        report, _ = _triage(server, 4, batch=FAST)
        api = server.batch_api
        statuses = {b["status"] for b in api.batches.values()}
        live = len(server.fake.requests)
    _completed_once(report)
    assert "expired" in statuses
    assert live >= 8  # every call went live after its batch expired


def test_a_deadline_takes_calls_back_from_a_slow_batch_and_the_run_finishes_on_time() -> None:
    with _server(complete_after=120) as server:
        started = time.monotonic()
        report, _ = _triage(server, 4, batch=FAST, deadline_s=4.0)
        took = time.monotonic() - started
        api = server.batch_api
    _completed_once(report)
    assert not report.deadline_reached
    assert api.cancelled >= 1
    assert took < 4.0 + 2.0  # reported, not a speed claim: the run did not wait for the batch


class _Reserving(Usage):
    """A meter that notes what each call reserved."""

    reserved: list[float]

    async def areserve(self, *args: Any, **kwargs: Any) -> Any:
        reservation = await super().areserve(*args, **kwargs)
        self.reserved = [*getattr(self, "reserved", []), reservation.cost]
        return reservation


def test_the_budget_reserves_at_batch_prices() -> None:
    with _server(complete_after=0.05) as server:
        model = _model(server)
        probe = _Reserving()
        asyncio.run(model.complete("Say hello.", meter=probe))
        [live_reserve] = probe.reserved
        budget = Budget(max_cost=live_reserve * 0.75)  # not enough for the call live
        with pytest.raises(BudgetExceeded):
            asyncio.run(model.complete("Say hello.", meter=Usage(budget=budget)))
        batcher = Batcher(FAST)
        batcher.bind("budget-run")
        batched = model.batched(batcher)
        meter = _Reserving(budget=budget)
        reply = asyncio.run(batched.complete("Say hello.", meter=meter))
        assert server.batch_api.submitted == 1
    assert meter.reserved == [pytest.approx(live_reserve / 2)]
    [record] = meter.records
    assert record.cost_usd == pytest.approx(probe.records[0].cost_usd / 2)
    assert reply.text


@pytest.mark.slow
@pytest.mark.parametrize("resume", ["python", "python, as stored", "cli"])
def test_a_run_killed_after_submitting_is_resumed_without_a_second_submission(
        tmp_path: Path, resume: str) -> None:
    app, _, _ = make_app(workers=2, capacity=4)
    plan = ticket_plan(generate_tickets(6, 0), app.registry)
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan.to_document()))
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    with _server(complete_after=3.0) as server:
        env = {**os.environ, "OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": server.base_url,
               "PLANRUN_MODEL": "gpt-4o-mini"}
        child = subprocess.Popen(
            [sys.executable, "-m", "planrun", "run", str(plan_file), "--app",
             "planrun.examples.tickets:app", "--db", db, "--batch", "--batch-wait", "0.05",
             "--batch-poll", "0.1", "--quiet"], env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        api = server.batch_api
        for _ in range(300):
            if api.submitted:
                break
            time.sleep(0.05)
        assert api.submitted == 1
        time.sleep(0.3)  # the batch id is written with the next batch of changes
        child.send_signal(signal.SIGKILL)
        child.wait()
        [batch] = api.batches.values()
        assert batch["status"] in ("validating", "in_progress", "finalizing")
        async def run_id() -> str:
            store = open_store(db)
            await store.open()
            try:
                [run] = await store.list_runs()
                return run.id
            finally:
                await store.close()

        rid = asyncio.run(run_id())
        if resume.startswith("python"):  # as stored: the batch settings the run started with
            given = {"batch": FAST} if resume == "python" else {}
            report = resume_run(rid, make_app(workers=2, capacity=4)[0], db,
                                model=_model(server), **given)
            _completed_once_after_resume(report)
            requests = report.usage.total.requests
        else:  # planrun resume too
            done = subprocess.run([sys.executable, "-m", "planrun", "resume", rid, "--db", db,
                                   "--json", "--quiet"], env=env, capture_output=True,
                                  text=True, timeout=300)
            assert done.returncode == 0, done.stderr[-2000:]
            shown = json.loads(done.stdout)
            assert shown["counts"]["completed"] == 12
            requests = shown["usage"]["requests"]
        classify_lines = sum(b["request_counts"]["total"] for b in api.batches.values())
    # the first batch (6 classifications) was found again, not submitted twice; the drafts
    # went in a second one
    assert api.submitted == 2, api.batches
    assert classify_lines == 12
    assert requests == 12  # each line counted once


def _completed_once_after_resume(report: Any) -> None:
    completions = Counter(e.task for e in report.result.events
                          if e.event == EventName.COMPLETED)
    assert report.ok, report.summary()
    assert set(completions.values()) == {1}


def test_identical_calls_without_a_key_are_two_lines_of_one_batch() -> None:
    with _server() as server:
        batcher = Batcher(FAST)
        batcher.bind("twins")
        model = _model(server).batched(batcher)

        async def twice() -> list[str]:
            replies = await asyncio.gather(model.complete("Same."), model.complete("Same."))
            await batcher.aclose()
            return [r.text for r in replies]

        texts = asyncio.run(twice())
        [batch] = server.batch_api.batches.values()
    assert texts[0] == texts[1] and texts[0]
    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": 2, "completed": 2, "failed": 0}


def test_a_batched_run_on_the_responses_api() -> None:
    with _server(complete_after=0.05) as server:
        app, _, _ = make_app(workers=2, capacity=4)
        plan = ticket_plan(generate_tickets(4, 0), app.registry)
        model = Model("gpt-4o-mini", api_key=KEY, base_url=server.base_url, api="responses")
        report = plan_and_run(plan, app, model=model, batch=FAST)
        endpoints = {b["endpoint"] for b in server.batch_api.batches.values()}
    _completed_once(report)
    assert endpoints == {"/v1/responses"}
    assert report.usage.total.requests == 8


class _Notebook:
    """A journal that keeps what was recorded before submission, and loses the batch id
    (a crash between the API's answer and its record)."""

    def __init__(self) -> None:
        self.lines: dict[str, dict[str, str]] = {}
        self.at = 0.0

    async def submitting(self, key: str, lines: Any, at: float) -> None:
        self.lines[key], self.at = dict(lines), at

    async def submitted(self, key: str, batch_id: str, lines: Any) -> None:
        pass

    def recorded(self) -> tuple[list[Any], int]:
        return [(k, None, v, self.at) for k, v in self.lines.items()], len(self.lines)


def test_a_batch_whose_id_was_never_recorded_is_found_by_its_key() -> None:
    journal = _Notebook()
    with _server(complete_after=1.0) as server:
        api = server.batch_api

        async def first() -> None:
            batcher = Batcher(FAST)
            batcher.bind("lost-id", journal=journal)
            model = _model(server).batched(batcher)
            call = asyncio.ensure_future(model.complete("Hello.", idempotency_key="k1"))
            while not api.submitted:
                await asyncio.sleep(0.01)
            await batcher.aclose()  # the process dies: its call never hears back
            call.cancel()

        async def second() -> str:
            batcher = Batcher(FAST)
            batcher.bind("lost-id", journal=journal)
            model = _model(server).batched(batcher)
            reply = await model.complete("Hello.", idempotency_key="k1")
            await batcher.aclose()
            assert batcher.submitted == 0 and batcher.numbered_from == 1
            return reply.text

        async def others() -> None:  # newer batches of other runs: ours is on page two
            import openai

            async with openai.AsyncOpenAI(api_key=KEY, base_url=server.base_url) as client:
                upload = await client.files.create(
                    file=("other.jsonl", b'{"custom_id": "x", "method": "POST", "url": '
                          b'"/v1/chat/completions", "body": {"model": "m", "messages": []}}\n',
                          "application/jsonl"), purpose="batch")
                for i in range(120):
                    await client.batches.create(input_file_id=upload.id,
                                                endpoint="/v1/chat/completions",
                                                completion_window="24h",
                                                metadata={"planrun_batch": f"other-b{i}"})

        asyncio.run(first())
        asyncio.run(others())
        text = asyncio.run(second())
        assert api.submitted == 121  # found by metadata.planrun_batch, not submitted again
        ours = [b for b in api.batches.values() if b["metadata"]["planrun_batch"] == "lost-id-b1"]
    assert text and len(ours) == 1 and ours[0]["status"] == "completed"


class _Garbled(FakeBatchAPI):
    """An output file whose first line is garbage (the API never does this; a proxy might)."""

    def _new_file(self, name: str, lines: list[dict[str, Any]]) -> str | None:
        fid = super()._new_file(name, lines)
        if fid is not None and name.endswith("_output.jsonl"):
            filename, purpose, content, created = self.files[fid]
            rest = content.split(b"\n", 1)[1]
            self.files[fid] = (filename, purpose, b"{not json\n" + rest, created)
        return fid


def test_a_line_that_cannot_be_read_sends_its_call_live() -> None:
    fake = FakeOpenAI(answers())
    with StandIn(fake, batch_api=_Garbled(fake)) as server:
        batcher = Batcher(FAST)
        batcher.bind("garbled")
        model = _model(server).batched(batcher)

        async def three() -> list[str]:
            replies = await asyncio.gather(*(model.complete(f"Say {i}.", idempotency_key=f"k{i}")
                                             for i in range(3)))
            await batcher.aclose()
            return [r.text for r in replies]

        texts = asyncio.run(three())
        live = len(fake.requests) - 3  # three lines answered by the batch, one call live
    assert all(texts) and batcher.taken_back == 1 and live == 1


def _three(server: StandIn, batcher: Batcher, **model: Any) -> list[str]:
    batched = Model("gpt-4o-mini", api_key=KEY, base_url=server.base_url,
                    retry=RetryPolicy(attempts=4, base=0.05, cap=0.2), **model).batched(batcher)

    async def three() -> list[str]:
        replies = await asyncio.gather(*(batched.complete(f"Say {i}.", idempotency_key=f"k{i}")
                                         for i in range(3)))
        await batcher.aclose()
        return [r.text for r in replies]

    return asyncio.run(three())


def test_a_batch_whose_creation_answer_is_lost_is_found_by_its_key_not_paid_twice() -> None:
    # The API creates the batch but answers after the client's timeout: the calls must not
    # also go live (they would be billed twice); the batch is found by its key.
    fake = FakeOpenAI(answers())
    api = FakeBatchAPI(fake, answer_create_after=1.0)
    with StandIn(fake, batch_api=api) as server:
        batcher = Batcher(FAST)
        batcher.bind("lost")
        texts = _three(server, batcher, timeout=0.4)
        asked = len(fake.requests)
    assert all(texts) and api.submitted == 1
    assert batcher.taken_back == 0 and asked == 3  # each call answered once, by the batch


class _FailingCreate(FakeBatchAPI):
    """Answers every batch creation 500 without creating it; counts the listings."""

    listed = 0

    def _list(self, request: Any) -> Any:
        self.listed += 1
        return super()._list(request)

    def _create(self, request: Any) -> Any:
        return httpx.Response(500, json={"error": {"message": "The server had an error.",
                                                   "type": "server_error", "param": None,
                                                   "code": None}})


def test_a_batch_creation_that_failed_is_looked_for_then_its_calls_go_live() -> None:
    fake = FakeOpenAI(answers())
    api = _FailingCreate(fake)
    with StandIn(fake, batch_api=api) as server:
        batcher = Batcher(FAST)
        batcher.bind("failed")
        texts = _three(server, batcher)
        asked, listed = len(fake.requests), api.listed
    assert all(texts) and api.submitted == 0
    assert batcher.taken_back == 3 and asked == 3  # each call answered once, live
    assert listed == 2  # looked for by its key twice before going live


@pytest.mark.parametrize("lost", ["before", "after"])
async def test_a_store_error_while_a_batch_is_recorded_submits_it_once(
        tmp_path: Path, lost: str) -> None:
    # The write of a batch's `batched` events fails once: refused before anything is
    # written, or committed with its answer lost. The supervisor writes again; the batch
    # is then submitted, once, and no call goes live as well.
    from planrun.core import StoreError
    from planrun.stores import SQLiteStore

    class Failing(SQLiteStore):
        faults = 0

        async def write_batch(self, run_id: str, tasks: Any, events: Any) -> None:
            journal = any(e[3] == EventName.BATCHED for e in events)
            if journal and not self.faults and lost == "before":
                self.faults += 1
                raise StoreError("database is locked")
            await super().write_batch(run_id, tasks, events)
            if journal and not self.faults:
                self.faults += 1
                raise StoreError("disk I/O error")

    store = Failing(str(tmp_path / "runs.db"))
    await store.open()
    try:
        with _server(complete_after=0.1) as server:
            app, _, _ = make_app(workers=2, capacity=4)
            plan = ticket_plan(generate_tickets(6, 0), app.registry)
            report = await aplan_and_run(plan, app, model=_model(server), batch=FAST,
                                         store=store)
            api, asked = server.batch_api, len(server.fake.requests)
        state = await store.load(report.run_id)
    finally:
        await store.close()
    _completed_once(report)
    assert store.faults == 1
    lines = [e.detail["line"] for e in state.events
             if e.event == EventName.BATCHED and "line" in (e.detail or {})]
    keys = {e.detail["batch"] for e in state.events if e.event == EventName.BATCHED}
    assert len(lines) == len(set(lines)) == 12  # each call recorded once
    assert api.submitted == len(keys) >= 2  # each recorded batch submitted once
    assert asked == 12  # every call answered once, by a batch: none went live as well
