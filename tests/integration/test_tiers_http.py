"""Tiers over real HTTP: the real openai SDK against the stand-in (tools/standin.py) on
loopback, serving flex (slower, room for a few at once, refusals) and priority.

Each call goes at the tier the scheduling core chose from its task's slack; a flex refusal
is no rate limit (the limiter is not slowed) and falls back to the default tier; a tier the
server rejects is dropped with one warning; a resumed run keeps its tiers."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import FAKE_KEY, REPO, StandIn

from planrun import Model, Plan, plan_and_run, resume_run
from planrun.core import EventName
from planrun.core.scheduling import TierPolicy
from planrun.dev.testing import FakeOpenAI
from planrun.examples.answers import answers
from planrun.examples.ticket_data import generate_tickets
from planrun.model import RateLimiter
from planrun.model._prompts import PromptLibrary

UNIT = REPO / "tests" / "unit"
sys.path.insert(0, str(UNIT))

from classify_app import app  # noqa: E402


def _plan(n: int) -> dict[str, Any]:
    return {"goal": "classify the tickets", "tasks": [
        {"kind": "classify_ticket", "payload": {"ticket": t.model_dump(mode="json")},
         "depends_on": []} for t in generate_tickets(n, 0)]}


def _server(**options: Any) -> StandIn:
    fake_options = {k: options.pop(k) for k in ("reject_tiers",) if k in options}
    return StandIn(FakeOpenAI(answers(), **fake_options), **options).start()


def _model(server: StandIn, **options: Any) -> Model:
    return Model("gpt-4o-mini", api_key=FAKE_KEY, base_url=server.base_url, **options)


def _asked(server: StandIn) -> Counter[str | None]:
    return Counter(r.body.get("service_tier") for r in server.fake.requests)


def test_a_loose_deadline_sends_every_call_at_flex_and_pays_half() -> None:
    server = _server(latency=0.02, flex_latency=0.2, flex_slots=32)
    try:
        report = plan_and_run(_plan(30), app, model=_model(server), tiers=("flex", "priority"),
                              deadline_s=600)
    finally:
        server.stop()
    assert report.ok, report.summary()
    assert _asked(server) == {"flex": 30}
    assert Counter(b.tier for b in server.billed) == {"flex": 30}
    records = report.usage.records
    assert {r.tier for r in records} == {"flex"}
    assert report.usage.total.cost_usd == pytest.approx(server.cost_usd)
    full = sum(r.cost_usd for r in records) * 2
    assert report.usage.total.cost_usd == pytest.approx(full / 2)
    version = PromptLibrary().get("classify_ticket").version
    assert {r.body.get("prompt_cache_key") for r in server.fake.requests} == {
        f"classify_ticket:{version}"}
    used = [e for e in report.events if e.event == EventName.USAGE]
    assert len(used) == 30 and {e.detail["tier"] for e in used} == {"flex"}
    assert all(0.2 <= e.detail["latency_s"] < 5 for e in used)  # each took flex's time
    by_tier = report.to_dict()["usage"]["by_tier"]
    assert list(by_tier) == ["flex"] and by_tier["flex"]["requests"] == 30
    assert by_tier["flex"]["cost_usd"] == pytest.approx(server.cost_usd, abs=1e-6)
    assert "by tier: flex 30 requests" in report.summary()


def test_without_tiers_no_tier_and_no_cache_key_is_sent() -> None:
    server = _server()
    try:
        report = plan_and_run(_plan(5), app, model=_model(server), deadline_s=600)
    finally:
        server.stop()
    assert report.ok
    assert all("service_tier" not in r.body and "prompt_cache_key" not in r.body
               for r in server.fake.requests)
    assert {r.tier for r in report.usage.records} == {"default"}


class CountingLimiter(RateLimiter):
    """A rate limiter that counts the 429s it was told of."""

    penalties = 0

    def penalize(self, retry_after: float) -> None:
        self.penalties += 1
        super().penalize(retry_after)


def test_flex_refusals_are_no_rate_limit_and_fall_back_to_the_default_tier() -> None:
    """Room for two flex answers at once: the others are refused (429
    resource_unavailable), tried on flex again while the slack allows, then sent at the
    default tier; every task completes and the limiter never pauses."""
    server = _server(latency=0.02, flex_latency=0.3, flex_slots=2)
    limiter = CountingLimiter(requests_per_minute=60_000)
    policy = TierPolicy(("flex", "priority"), latency_s={"default": 0.05, "flex": 0.5,
                                                         "priority": 0.03})
    try:
        report = plan_and_run(_plan(40), app, model=_model(server, limiter=limiter),
                              tiers=policy, deadline_s=4)
    finally:
        server.stop()
    assert report.ok  # every task completed: none was lost to a refusal or the deadline
    assert server.flex_refused > 0 and server.most_flex_busy <= 2
    served = Counter(b.tier for b in server.billed)
    assert served["flex"] >= 2 and served["default"] > 0 and sum(served.values()) == 40
    refused = [r for r in report.usage.records if r.error == "FlexRefused"]
    assert len(refused) == server.flex_refused and all(r.cost_usd == 0 for r in refused)
    assert limiter.penalties == 0  # a refusal is not a rate limit
    assert report.usage.total.cost_usd == pytest.approx(server.cost_usd)
    assert policy.latencies.answers("flex") == served["flex"]  # learned from its answers


def test_a_tier_the_server_rejects_is_dropped_with_one_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    server = _server(reject_tiers=("flex",))
    try:
        with caplog.at_level(logging.WARNING, logger="planrun.model"):
            report = plan_and_run(_plan(12), app, model=_model(server), tiers=("flex",),
                                  deadline_s=600)
    finally:
        server.stop()
    assert report.ok, report.summary()
    warnings = [r.getMessage() for r in caplog.records if "service_tier" in r.getMessage()]
    assert len(warnings) == 1
    assert "'flex'" in warnings[0] and "'gpt-4o-mini'" in warnings[0]
    assert Counter(b.tier for b in server.billed) == {"default": 12}
    asked = _asked(server)
    assert asked["default"] == 12 and 1 <= asked["flex"] <= 12  # the calls already in flight


def _cli(*argv: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "planrun.cli", *argv],
                            env={**os.environ, "PYTHONPATH": f"{UNIT}{os.pathsep}"
                                 f"{os.environ.get('PYTHONPATH', '')}", **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _completed(path: Path) -> tuple[str | None, int]:
    if not path.exists():
        return None, 0
    with sqlite3.connect(path, timeout=30) as conn:
        try:
            run = conn.execute("SELECT id FROM planrun_runs").fetchone()
            done = conn.execute("SELECT COUNT(*) FROM planrun_tasks WHERE status = "
                                "'completed'").fetchone()
        except sqlite3.OperationalError:
            return None, 0
    return (str(run[0]) if run else None), int(done[0]) if done else 0


def test_a_run_killed_mid_way_resumes_with_its_tiers(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``planrun run --tiers flex`` is killed once a few tasks are done; the resumed run
    (told nothing about tiers) sends the rest at flex too, and learns again from the
    answers its ledger holds."""
    server = _server(latency=0.02, flex_latency=0.25, flex_slots=16)
    db_path = tmp_path / "runs.db"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(_plan(40)))
    env = {"OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": FAKE_KEY}
    try:
        proc = _cli("run", str(plan), "--app", "classify_app:app", "--db",
                    f"sqlite:///{db_path}", "--tiers", "flex", "--deadline", "600",
                    "--quiet", "--concurrency", "4", env=env)
        run_id, done = None, 0
        limit = time.monotonic() + 60
        while done < 8 and time.monotonic() < limit and proc.poll() is None:
            time.sleep(0.05)
            run_id, done = _completed(db_path)
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        assert run_id is not None and 8 <= done < 40
        before = len(server.fake.requests)
        report = resume_run(run_id, app, f"sqlite:///{db_path}", model=_model(server),
                            wait=False)
    finally:
        server.stop()
    assert report.ok, report.summary()
    later = server.fake.requests[before:]
    assert later and {r.body.get("service_tier") for r in later} == {"flex"}
    assert Counter(b.tier for b in server.billed) == {"flex": len(server.fake.requests)}
    used = [e for e in report.events if e.event == EventName.USAGE]
    assert {e.detail["tier"] for e in used} == {"flex"}
    assert asyncio.run(_meta(f"sqlite:///{db_path}", run_id))["tiers"] == ["flex"]
    from planrun.cli import main

    capsys.readouterr()
    assert main(["status", run_id, "--db", f"sqlite:///{db_path}", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert list(status["by_tier"]) == ["flex"]  # what the killed process spent too
    assert status["by_tier"]["flex"]["requests"] == len(used)
    assert main(["status", run_id, "--db", f"sqlite:///{db_path}"]) == 0
    assert "by tier:                flex" in capsys.readouterr().out


async def _meta(url: str, run_id: str) -> Any:
    from planrun.stores import open_store

    store = open_store(url)
    await store.open()
    try:
        return (await store.load_tasks(run_id)).run.meta
    finally:
        await store.close()


def test_bad_tiers_are_refused_before_anything_is_spent() -> None:
    from planrun import UsageError

    server = _server()
    try:
        for options, message in [
            ({"tiers": ("flex", "fast")}, "unknown tier 'fast'"),
            ({"tiers": ("priority",), "model": Model("gpt-5-nano", api_key=FAKE_KEY,
                                                     base_url=server.base_url)},
             "'gpt-5-nano' has no priority price"),
            ({"tiers": ("flex",), "deadline_s": 0}, "deadline_s must be > 0"),
        ]:
            options.setdefault("model", _model(server))
            with pytest.raises(UsageError, match=message):
                plan_and_run(Plan.parse(_plan(3), app.registry), app, **options)
    finally:
        server.stop()
    assert server.requests == 0


def test_the_tier_travels_with_attempts_to_worker_processes_on_dbos(tmp_path: Path) -> None:
    """``planrun run --workers external --tiers flex``: the coordinator's core chooses the
    tier, each attempt carries it to a ``planrun worker`` process, whose model sends it; the
    usage the workers report keeps the served tier (and its latency) in the run's ledger."""
    here = REPO / "tests" / "integration"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(_plan(16)))
    db = f"sqlite:///{tmp_path / 'dbos.db'}"
    server = _server(latency=0.02, flex_latency=0.2, flex_slots=16)
    env = {"OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": FAKE_KEY,
           "PYTHONPATH": f"{here}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    workers = [_cli("worker", "--db", db, "--app", "limits_app:app", "--name", f"w{i}",
                    "--concurrency", "4", "--idle-exit", "60", env=env) for i in range(2)]
    try:
        for p in workers:
            assert p.stderr is not None
            assert p.stderr.readline().startswith("worker ")
        coordinator = _cli("run", str(plan), "--app", "limits_app:app", "--db", db,
                           "--workers", "external", "--tiers", "flex", "--deadline", "600",
                           "--json", env=env)
        out, err = coordinator.communicate(timeout=120)
    finally:
        for p in workers:
            p.send_signal(signal.SIGTERM)
        for p in workers:
            p.communicate(timeout=60)
        server.stop()
    assert coordinator.returncode == 0, err[-2000:]
    report = json.loads(out.strip().splitlines()[-1])
    assert report["counts"]["completed"] == 16
    assert _asked(server) == {"flex": 16}
    assert Counter(b.tier for b in server.billed) == {"flex": 16}
    events = asyncio.run(_usage_events(db, report["run_id"]))
    assert len(events) == 16 and {e.detail["tier"] for e in events} == {"flex"}
    assert all(e.detail["latency_s"] >= 0.2 for e in events)


async def _usage_events(url: str, run_id: str) -> list[Any]:
    from planrun.stores import open_store

    store = open_store(url)
    await store.open()
    try:
        return [e for e in (await store.load(run_id)).events if e.event == EventName.USAGE]
    finally:
        await store.close()


def test_a_flex_answer_slower_than_the_lease_keeps_its_task() -> None:
    """Flex answers take 4 s, the lease 3 s: while a flex request is out its task's lease is
    renewed, so no attempt is reclaimed and each call is sent once."""
    server = _server(latency=0.02, flex_latency=4.0, flex_slots=8)
    try:
        report = plan_and_run(_plan(4), app, model=_model(server), tiers=("flex",),
                              deadline_s=600, stale_after=3.0)
    finally:
        server.stop()
    assert report.ok, report.summary()
    assert not [e for e in report.events if e.event == EventName.RECLAIMED]
    assert _asked(server) == {"flex": 4}


def test_without_a_deadline_the_tiers_mean_the_cheapest() -> None:
    server = _server(latency=0.01, flex_latency=0.05, flex_slots=32)
    try:
        report = plan_and_run(_plan(6), app, model=_model(server), tiers=("flex", "priority"))
    finally:
        server.stop()
    assert report.ok and _asked(server) == {"flex": 6}


def test_once_the_slack_is_known_to_be_spent_calls_move_up_to_priority() -> None:
    """Answers take 0.5 s, 8 at once, 40 calls (2.5 s at the default tier) and a deadline
    of 2.5 s: the first round goes at the default tier (nothing is known yet); its answers
    (0.75 s with the margin of a first answer) say the rest no longer fits, and the calls
    that follow go at priority, billed at its price."""
    server = _server(latency=0.5, priority_latency=0.1)
    try:
        report = plan_and_run(_plan(40), app, model=_model(server), tiers=("flex", "priority"),
                              deadline_s=2.5)
    finally:
        server.stop()
    served = Counter(r.tier for r in report.usage.records if r.error is None)
    assert served["default"] >= 8 and served["priority"] > 0 and "flex" not in served
    first = next(r for r in report.usage.records if r.tier == "default")
    fast = next(r for r in report.usage.records if r.tier == "priority")
    per_token = [r.cost_usd / r.total_tokens for r in (first, fast)]
    assert per_token[1] > 1.5 * per_token[0]  # priority's price
