"""The three numbers: from a stored run, and over time from a ledger."""

from __future__ import annotations

from planrun.core._ledger import Ledger
from planrun.core._task import Status, Task, transition
from planrun.dev.sim import Scenario, simulate
from planrun.obs._status import run_status, timeline
from planrun.stores.base import RunInfo, RunState


def test_snapshot_counts_active_workers_and_oldest_age() -> None:
    a = Task(id="a", kind="k", created_at=10.0)
    b = transition(Task(id="b", kind="k", created_at=20.0), Status.ASSIGNED, assigned_to="w1")
    c = transition(transition(Task(id="c", kind="k", created_at=5.0), Status.ASSIGNED),
                   Status.RUNNING, assigned_to="w2")
    done = transition(transition(transition(Task(id="d", kind="k", created_at=1.0),
                                            Status.ASSIGNED), Status.RUNNING), Status.COMPLETED)
    snap = run_status(RunState(RunInfo("r", 0.0), [a, b, c, done], [], {}), now=35.0)
    assert snap.counts["pending"] == 1 and snap.counts["completed"] == 1
    assert snap.active_by_worker == {"w1": 1, "w2": 1}
    assert snap.oldest_unfinished == "c" and snap.oldest_unfinished_s == 30.0
    assert not snap.finished
    assert "oldest unfinished task: 30.0 s (c)" in snap.render()


def test_timeline_of_round_robin_shows_one_worker_pinned() -> None:
    run = simulate(Scenario.load("article"), "round_robin").run
    samples = timeline(run.events, points=31)
    assert samples[0].counts["running"] == 3
    at_20 = next(s for s in samples if s.at == 20.0)
    assert at_20.active_by_worker == {"w1": 1}  # w2 and w3 finished at 6 s
    assert at_20.oldest_unfinished_s == 20.0  # the last long task was created at 0
    assert samples[-1].counts["completed"] == 9 and samples[-1].oldest_unfinished_s is None


def test_timeline_of_an_empty_ledger() -> None:
    assert timeline(Ledger().events) == []


def test_a_task_waiting_for_approval_is_shown_apart_not_as_the_oldest() -> None:
    from planrun.core._ledger import Event

    old = transition(Task(id="pay", kind="k", created_at=0.0), Status.WAITING,
                     cause="approval:start", not_before=100.0)
    young = Task(id="b", kind="k", created_at=20.0)
    events = [Event(0, 0.0, "pay", "created"), Event(1, 5.0, "pay", "waiting",
                                                      detail={"for": "start"})]
    snap = run_status(RunState(RunInfo("r", 0.0), [old, young], events, {}), now=35.0)
    assert snap.counts["waiting"] == 1
    assert snap.oldest_unfinished == "b" and snap.oldest_unfinished_s == 15.0
    assert snap.waiting == [{"task": "pay", "for": "start", "waiting_s": 30.0,
                             "timeout_at": 100.0}]
    assert "waiting for approval:   pay (start) 30.0 s" in snap.render()
    assert not snap.finished
    samples = timeline(events, points=2)
    assert samples[-1].counts["waiting"] == 1 and samples[-1].oldest_unfinished_s is None
