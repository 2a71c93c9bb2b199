"""What each task spent, kept in the ledger: the meter's listeners, records from another
process, the ``usage`` events of a stored run and what observation reads from them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from planrun.core import Event
from planrun.model import Usage, UsageRecord
from planrun.obs import spend_timeline, spent_by_task
from planrun.stores import open_store


def test_a_listener_hears_every_record_of_every_view_until_stopped() -> None:
    meter = Usage()
    heard: list[UsageRecord] = []
    stop = meter.listen(heard.append)
    meter.scoped("task:a").record("gpt-4o-mini", prompt_tokens=10, completion_tokens=5)
    meter.record("gpt-4o-mini", prompt_tokens=1)
    stop()
    meter.scoped("task:b").record("gpt-4o-mini", prompt_tokens=7)
    stop()  # twice: harmless
    assert [(r.keys, r.total_tokens) for r in heard] == [(("task:a",), 15), ((), 1)]


def test_a_record_from_another_process_keeps_its_price_and_gains_the_views_keys() -> None:
    elsewhere = Usage(prices={"m": (1.0, 0.5, 2.0)}).scoped("task:a", "worker:w1")
    sent = elsewhere.record("m", prompt_tokens=1000, completion_tokens=500).to_dict()
    here = Usage()  # no price for "m" here: the cost is the one priced where it was made
    added = here.scoped("run").add(sent)
    assert added.cost_usd == pytest.approx(0.002) and here.total.cost_usd == pytest.approx(0.002)
    assert added.keys == ("task:a", "worker:w1", "run")
    assert here["task:a"].total_tokens == 1500 and here.unpriced_models == frozenset()


def _usage(seq: int, at: float, task: str, tokens: int, cost: float) -> Event:
    return Event(seq, at, task, "usage", detail={"model": "m", "prompt_tokens": tokens,
                                                 "completion_tokens": 0, "cost_usd": cost})


def test_spend_is_read_per_task_and_over_time_from_the_ledger() -> None:
    events = [Event(0, 0.0, "a", "created"), _usage(1, 10.0, "a", 100, 0.1),
              _usage(2, 20.0, "b", 50, 0.05), _usage(3, 90.0, "a", 10, 0.01),
              Event(4, 120.0, "a", "completed")]
    assert spent_by_task(events) == {
        "a": {"requests": 2, "tokens": 110, "cost_usd": pytest.approx(0.11)},
        "b": {"requests": 1, "tokens": 50, "cost_usd": 0.05}}
    samples = spend_timeline(events, points=5)  # at 0, 30, 60, 90, 120 s
    assert [s.at for s in samples] == [0.0, 30.0, 60.0, 90.0, 120.0]
    assert [s.tokens for s in samples] == [0, 150, 150, 160, 160]
    assert [s.requests_per_minute for s in samples] == [0, 2, 2, 1, 1]
    assert spend_timeline(events[:1]) == []


def test_a_stored_runs_ledger_holds_each_tasks_model_requests(tmp_path: Path) -> None:
    from planrun import plan_and_run
    from planrun.examples import brief
    from planrun.testing import replay

    url = f"sqlite:///{tmp_path / 'runs.db'}"
    with replay("brief") as cassette:
        report = plan_and_run(brief.GOAL, brief.make_app(), model=cassette.model(),
                              store=url, run_id="brief")

    async def load() -> list[Event]:
        store = open_store(url)
        await store.open()
        try:
            return (await store.load("brief")).events
        finally:
            await store.close()

    spent = spent_by_task(asyncio.run(load()))
    assert report.ok and len(spent) == len(report.tasks)
    for task in report.tasks:  # what the report's meter counted per task, and no more
        assert spent[task.id]["tokens"] == task.tokens
        assert spent[task.id]["cost_usd"] == pytest.approx(task.cost_usd)
