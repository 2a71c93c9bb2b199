"""Eight worker processes on DBOS, 2,000 tickets, one PostgreSQL database, and real faults.

While the run goes on, two worker processes are killed with SIGKILL and a third is frozen
with SIGSTOP for more than twice its lease, then let go with SIGCONT. The run must still
end with exactly 2,000 completions and 2,000 replies; the attempts the killed and frozen
processes held were reclaimed after their lease and done by others; what the frozen process
finished after it woke carried a stale fencing token and was refused; and a frozen process
must not hold the others up: the five left keep at least half the rate they had before.

The figures (rates, refusals, duration) are printed with ``-s``.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from dbos_support import holders, run_on_dbos, spawn_worker
from dist_app import registry
from pgtest import fresh_schema

from planrun.core._task import Status, Task
from planrun.runtime._dbos_wire import dbos_schema, dbos_url

TASKS = 2000
LEASE = 3.0          # every worker's lease, and the run's stale_after
FROZEN_FOR = 2 * LEASE + 1.0
WORK_S = "0.2"       # pretend work per ticket: the run lasts long enough to measure


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from fresh_schema("planrun_wfault")


def holding(url: str, names: list[str]) -> dict[tuple[str, int], str]:
    """The attempts ``names`` hold now: (task, token) -> the process."""
    from dbos import DBOSClient

    client = DBOSClient(system_database_url=dbos_url(url), dbos_system_schema=dbos_schema(url))
    try:
        held = {}
        for s in client.list_workflows(status="PENDING", executor_id=names,
                                       load_input=False, load_output=False):
            _, task, token = s.workflow_id.rsplit(":", 2)
            held[task, int(token)] = str(s.executor_id)
        return held
    finally:
        client.destroy()


def test_two_workers_killed_one_frozen_past_its_lease_2000_exactly(pg_url: str) -> None:
    sent: Counter[str] = Counter()
    names = [f"w{i}" for i in range(8)]
    killed, frozen = ["w0", "w1"], "w2"
    marks: dict[str, float] = {}
    done_at: list[float] = []
    in_hand: dict[tuple[str, int], str] = {}
    workers = {n: spawn_worker(pg_url, n, lease=LEASE, env={"DIST_APP_WORK_S": WORK_S})
               for n in names}

    def effect(task: Task, key: str) -> None:
        sent.update([key])
        done_at.append(time.time())

    async def faults(run: asyncio.Future[Any]) -> None:
        async def until(count: int, hold: list[str]) -> None:
            """Until ``count`` completions, and each of ``hold`` holds an attempt."""
            while len(done_at) < count or len(set((
                    await asyncio.to_thread(holding, pg_url, hold)).values())) < len(hold):
                if run.done():
                    raise AssertionError(f"the run ended before {count} completions")
                await asyncio.sleep(0.05)

        async def stopped_holding(hold: list[str]) -> dict[tuple[str, int], str]:
            """Stop ``hold`` (SIGSTOP) at a moment each of them holds an attempt; what they
            hold, read while they are stopped (an attempt seen held a moment before the
            fault could finish meanwhile)."""
            while True:
                for n in hold:
                    workers[n].send_signal(signal.SIGSTOP)
                held = await asyncio.to_thread(holding, pg_url, hold)
                if len(set(held.values())) == len(hold):
                    return held
                for n in hold:
                    workers[n].send_signal(signal.SIGCONT)
                if run.done():
                    raise AssertionError("the run ended before the faults")
                await asyncio.sleep(0.05)

        await until(TASKS * 15 // 100, killed)
        # What the killed processes hold when they die (stopped first: nothing of it changes).
        in_hand.update(await stopped_holding(killed))
        marks["killed"] = time.time()
        for n in killed:
            workers[n].send_signal(signal.SIGKILL)
        await asyncio.sleep(LEASE + 1.0)  # the kills' leases ran out; theirs went elsewhere
        marks["steady"] = time.time()
        await asyncio.sleep(2.0)  # the pace of the six left, measured before the freeze
        await until(TASKS * 30 // 100, [frozen])
        in_hand.update(await stopped_holding([frozen]))  # stopped: frozen from here on
        marks["frozen"] = time.time()
        await asyncio.sleep(FROZEN_FOR)
        marks["thawed"] = time.time()
        workers[frozen].send_signal(signal.SIGCONT)

    async def go() -> Any:
        run = asyncio.ensure_future(run_on_dbos(
            registry, (Task(id=f"T-{i:04d}", kind="triage", payload={"ticket": f"T-{i:04d}"})
                       for i in range(TASKS)),
            pg_url, lease=LEASE, effects={"triage": effect}, stall_after=120))
        injector = asyncio.ensure_future(faults(run))
        result = await asyncio.wait_for(run, 400)
        await injector
        return result

    started = time.time()
    try:
        result = asyncio.run(go())
    finally:
        for w in workers.values():
            if w.poll() is None:
                w.send_signal(signal.SIGCONT)
                w.send_signal(signal.SIGTERM)
        outputs = {n: w.communicate(timeout=60) for n, w in workers.items()}
    took = time.time() - started

    # Exactly 2,000: every ticket completed once, every reply sent once, nothing lost.
    assert result.ok and result.audit.clean, result.audit
    assert {t.status for t in result.tasks.values()} == {Status.COMPLETED}
    completed = [e for e in result.events if e.event == "completed"]
    assert len(completed) == TASKS and len({e.task for e in completed}) == TASKS
    assert len(sent) == TASKS and set(sent.values()) == {1}
    assert not any(e.event in ("dead", "cancelled") for e in result.events)

    for n in set(names) - set(killed):  # faults are logged in a line, never as a traceback
        err = outputs[n][1]
        assert "Task exception was never retrieved" not in err and "Traceback" not in err, err
    assert all(workers[n].returncode == -signal.SIGKILL for n in killed)

    # The attempts the killed and the frozen processes held were reclaimed after their lease.
    held = holders(pg_url, result.run_id, taken=True)
    reclaimed = [e for e in result.events if e.event == "reclaimed"]
    assert all(e.detail.get("reason") == "lease expired" for e in reclaimed)
    taken_back = {(e.task, e.attempt - 1) for e in reclaimed}  # logged under the new token
    by_holder = Counter(held.get(attempt) for attempt in taken_back)
    assert set(in_hand.values()) == {*killed, frozen}, in_hand
    assert set(in_hand) <= taken_back, (in_hand, by_holder)  # every one of them
    # ... and done by others under a newer token: no completion is a reclaimed attempt's.
    assert not any((e.task, e.attempt) in taken_back for e in completed)

    # What the frozen process finished after it woke was refused by its stale token.
    refused = [e for e in result.events if e.event == "rejected"]
    assert any(held.get((e.task, e.attempt)) == frozen for e in refused), refused[:5]
    assert workers[frozen].returncode == 0, outputs[frozen][1][-2000:]
    summary = re.search(rf"worker {frozen}: (\d+) completed", outputs[frozen][1])
    assert summary, outputs[frozen][1][-2000:]

    # The five others keep at least half their pace while one process is frozen.
    def rate(start: float, end: float) -> float:
        return sum(1 for t in done_at if start <= t < end) / (end - start)

    before = rate(marks["steady"], marks["frozen"])
    during = rate(marks["frozen"], marks["thawed"])
    print(f"\n{TASKS} tasks in {took:.1f} s; rate before the freeze {before:.1f}/s, during "
          f"{during:.1f}/s; {len(refused)} late results refused; reclaimed per holder "
          f"{dict(by_holder)}")
    assert before > 0
    assert during >= 0.5 * before, (before, during)
