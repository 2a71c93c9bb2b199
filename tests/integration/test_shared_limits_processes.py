"""``planrun run --workers external`` and four ``planrun worker`` processes, on DBOS, against a
stand-in that answers 429 beyond N requests per minute (counted over every client): one rate
limit and one budget for all. The limits are the run's (recorded in its meta in the store);
every worker process limits its model by the run's shared limiter and meters the run's
shared budget, both kept in the store."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from limits_app import plan_document
from pgtest import fresh_schema

from planrun.core._task import Status
from planrun.dev.testing import FakeOpenAI
from planrun.examples.answers import answers
from planrun.model import DEFAULT_COMPLETION_ESTIMATE
from planrun.model._usage import estimate_tokens
from planrun.stores import open_store

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tools"))
from standin import StandIn  # noqa: E402

KEY = "sk-standin-limits-0000000000000000"


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'limits.db'}"
        return
    yield from fresh_schema("planrun_limits")


def _env(server: StandIn) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(HERE), "OPENAI_BASE_URL": server.base_url,
            "OPENAI_API_KEY": KEY}


def _cli(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "planrun.cli", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _run(url: str, server: StandIn, plan: Path, *flags: str, workers: int = 4,
         worker_flags: tuple[str, ...] = ()) -> tuple[dict[str, Any], list[str]]:
    env = _env(server)
    procs = [_cli("worker", "--db", url, "--app", "limits_app:app", "--name", f"w{i}",
                  "--concurrency", "4", "--idle-exit", "60", *worker_flags, env=env)
             for i in range(workers)]
    coordinator = None
    try:
        # Every worker has loaded its app and opened the store (it prints its banner)
        # before the run exists; each serves its DBOS queue a moment later.
        for p in procs:
            assert p.stderr is not None
            banner = p.stderr.readline()
            assert banner.startswith("worker "), banner
        coordinator = _cli("run", str(plan), "--app", "limits_app:app", "--db", url,
                           "--workers", "external", "--json", *flags, env=env)
        out, err = coordinator.communicate(timeout=120)
    finally:
        if coordinator is not None and coordinator.poll() is None:
            coordinator.kill()
        for p in procs:
            p.send_signal(signal.SIGTERM)
        logs = [p.communicate(timeout=60)[1] for p in procs]
    assert coordinator.returncode in (0, 1), err[-2000:]
    assert all(p.returncode == 0 for p in procs), [log[-1000:] for log in logs]
    return json.loads(out.strip().splitlines()[-1]), logs


def _served(logs: list[str]) -> list[tuple[int, int]]:
    """(completed, failed) attempts of each worker process, from its last line."""
    served = []
    for log in logs:
        found = re.search(r"worker w\d+: (\d+) completed, (\d+) failed\s*$", log)
        assert found, log[-1000:]
        served.append((int(found[1]), int(found[2])))
    print(f"attempts per worker process (completed, failed): {served}")
    return served


def test_four_worker_processes_share_one_rate_limit_and_get_no_429(
        db_url: str, tmp_path: Path) -> None:
    # 300 requests a minute, 100 requests: 20 s at the rate. The stand-in, like the API,
    # lets a few seconds' worth go back to back (arrivals at a loaded loopback server
    # jitter by a good part of a second); four processes each sending at the rate would
    # pass that within a second.
    rpm, n = 300, 100
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(plan_document(n)))
    with StandIn(FakeOpenAI(answers()), rpm_limit=rpm, rpm_burst=rpm / 20) as server:
        started = time.monotonic()
        summary, logs = _run(db_url, server, plan, "--rpm", str(rpm))
        admitted = list(server.admitted)
        rate_limited = server.rate_limited
    assert summary["counts"]["completed"] == n, summary
    # All four processes sent requests (none failed): the limit below held across them.
    served = _served(logs)
    assert sum(c for c, _ in served) == n and all(c > 0 for c, _ in served), served
    assert all(f == 0 for _, f in served), served
    assert rate_limited == 0
    assert len(admitted) == n
    # The rate over the run: from the first request to the last, n - 1 intervals.
    achieved = (n - 1) / (admitted[-1] - admitted[0]) * 60
    print(f"achieved {achieved:.1f} rpm of {rpm} in {time.monotonic() - started:.1f} s")
    assert achieved >= 0.95 * rpm
    # Not more either: four processes each at the rate would make it about four times N.
    assert achieved <= 1.1 * rpm
    status = _status(db_url, summary["run_id"])
    assert status["limiter"]["rpm"] == rpm and status["limiter"]["acquired"] >= n
    assert status["spend"]["requests"] == n and status["spend"]["tokens_left"] is None


def test_four_worker_processes_learn_a_token_limit_set_twice_too_high(
        db_url: str, tmp_path: Path) -> None:
    # The provider allows 120,000 tokens a minute (each classification counts its prompt
    # and its bound, about 750); the run says twice that. Whichever process reads the
    # provider's x-ratelimit-* headers corrects the one shared row for all of them.
    tpm, n = 120_000, 40
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(plan_document(n)))
    with StandIn(FakeOpenAI(answers()), tpm_limit=tpm) as server:
        summary, logs = _run(db_url, server, plan, "--tpm", str(2 * tpm))
        admitted, limited = list(server.admitted), list(server.limited_at)
    assert summary["counts"]["completed"] == n, summary  # nothing lost
    served = _served(logs)
    assert sum(c for c, _ in served) == n and sum(c > 0 for c, _ in served) >= 2, served
    assert len(admitted) == n
    # 429s only while the first answers are on their way: none after the tenth admitted.
    assert len(limited) <= 12, len(limited)
    assert all(t <= admitted[9] for t in limited), (limited, admitted[:10])
    status = _status(db_url, summary["run_id"])
    assert status["limiter"]["tpm"] == tpm  # the provider's limit, not the configured one
    assert status["limiter"]["learned"] is True  # which no process wrote back over


def _status(url: str, run_id: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "planrun.cli", "status", run_id, "--db", url,
                           "--json"], capture_output=True, text=True, timeout=60, check=True)
    status: dict[str, Any] = json.loads(done.stdout)
    return status


def _spend(url: str, run_id: str) -> Any:
    async def get() -> Any:
        store = open_store(url)
        await store.open()
        try:
            return await store.spend(run_id), await store.load(run_id)
        finally:
            await store.close()

    return asyncio.run(get())


def test_four_worker_processes_share_one_budget_and_a_resume_spends_no_more(
        db_url: str, tmp_path: Path) -> None:
    budget, n = 8000, 40
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(plan_document(n)))
    with StandIn(FakeOpenAI(answers())) as server:
        summary, logs = _run(db_url, server, plan, "--budget-tokens", str(budget))
        sent = server.requests
        spend, state = _spend(db_url, summary["run_id"])
        # What one request reserves: its prompt estimate plus the completion allowance.
        reservation = max(estimate_tokens(r.messages, extra_text=json.dumps(
            r.body.get("response_format"))) for r in server.fake.requests)
        reservation += DEFAULT_COMPLETION_ESTIMATE
        resumed = subprocess.run(
            [sys.executable, "-m", "planrun.cli", "resume", summary["run_id"], "--db", db_url],
            env=_env(server), capture_output=True, text=True, timeout=60)
        assert server.requests == sent, resumed.stderr  # the resume sent nothing
    assert resumed.returncode in (0, 1), resumed.stderr[-2000:]
    assert spend.max_tokens == budget and spend.requests == sent > 0
    assert spend.total_tokens <= budget + 4 * reservation
    assert spend.total_tokens <= budget  # every call reserved its tokens before it was sent
    # ...and the budget was used up: no call that still fitted was refused.
    assert spend.total_tokens > budget - reservation
    assert spend.reserved_tokens == 0  # every reservation was settled
    counts = summary["counts"]
    print(f"{spend.total_tokens} tokens spent of {budget} in {spend.requests} requests "
          f"(one reservation: {reservation}); {counts}")
    assert 0 < counts["completed"] < n
    # Several processes spent from the one budget: every completion is a worker's.
    served = _served(logs)
    assert sum(c for c, _ in served) == counts["completed"], (served, counts)
    assert sum(c > 0 for c, _ in served) >= 2, served
    again, _ = _spend(db_url, summary["run_id"])
    assert again == spend
    status = _status(db_url, summary["run_id"])
    assert status["spend"]["total_tokens"] == spend.total_tokens
    assert status["spend"]["tokens_left"] == budget - spend.total_tokens
    # The rest ends cancelled with cause budget (no task is left pending or dead).
    assert counts["completed"] + counts["cancelled"] == n, counts
    assert {t.cause for t in state.tasks if t.status is Status.CANCELLED} == {"budget"}
