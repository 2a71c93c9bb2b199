"""Batch mode's pieces without a server: the settings, batch prices, line ids (the deadline
rule is the tiers' rule: test_tiers.py)."""

from __future__ import annotations

import json

import pytest

from planrun import Batching, UsageError
from planrun.model import BATCH_PRICE, Usage
from planrun.model._batch import custom_id


@pytest.mark.parametrize("options, message", [
    ({"size": 0}, "size must be a whole number from 1 to 50000"),
    ({"size": 60_000}, "size must be a whole number from 1 to 50000"),
    ({"wait_s": -1}, "wait_s must be a number of seconds >= 0"),
    ({"poll_s": 0}, "poll_s must be > 0"),
    ({"price": 1.5}, "price must be a fraction from 0 to 1"),
])
def test_bad_settings_are_one_line_errors(options: dict[str, float], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        Batching(**options)  # type: ignore[arg-type]


def test_batch_takes_true_false_or_settings() -> None:
    assert Batching.of(True) == Batching()
    assert Batching.of(False) is None and Batching.of(None) is None
    mine = Batching(size=10)
    assert Batching.of(mine) is mine
    with pytest.raises(UsageError, match="batch takes True, False or a Batching"):
        Batching.of("yes")  # type: ignore[arg-type]


def test_batch_prices_halve_what_is_counted_and_reserved() -> None:
    meter = Usage()
    live = meter.record("gpt-4o-mini", prompt_tokens=1_000_000, completion_tokens=1_000_000)
    batched = meter.record("gpt-4o-mini", prompt_tokens=1_000_000, completion_tokens=1_000_000,
                           price=BATCH_PRICE)
    assert live.cost_usd == pytest.approx(0.75)
    assert batched.cost_usd == pytest.approx(0.375)
    assert meter.estimate_cost("gpt-4o-mini", 1_000_000, 0, BATCH_PRICE) == pytest.approx(0.075)


def test_a_budget_affords_twice_as_many_batched_calls() -> None:
    from planrun import Budget, BudgetExceeded

    meter = Usage(budget=Budget(max_cost=0.76))
    meter.reserve("gpt-4o-mini", 1_000_000, 1_000_000, price=BATCH_PRICE)
    meter.reserve("gpt-4o-mini", 1_000_000, 1_000_000, price=BATCH_PRICE)  # 0.75 in all
    with pytest.raises(BudgetExceeded):
        meter.reserve("gpt-4o-mini", 1_000_000, 1_000_000)


def test_a_line_id_is_stable_for_the_same_call_and_changes_with_the_request() -> None:
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    same = {"messages": [{"role": "user", "content": "hi"}], "model": "gpt-4o-mini"}
    assert custom_id("planrun-abc", body) == custom_id("planrun-abc", same)
    assert custom_id("planrun-abc", body) != custom_id("planrun-abd", body)
    assert custom_id("planrun-abc", body) != custom_id(
        "planrun-abc", {**body, "messages": [{"role": "user", "content": "ho"}]})
    assert len(custom_id("planrun-" + "f" * 32 + ":reask-1", body)) <= 64


def test_a_line_that_is_not_a_completion_is_a_permanent_error() -> None:
    from planrun import PermanentError
    from planrun.model._batch import parsed_line

    with pytest.raises(PermanentError, match="not a chat completion"):
        parsed_line({"object": "list", "data": []}, "/v1/chat/completions")
    with pytest.raises(PermanentError, match="not a response"):
        parsed_line({"choices": []}, "/v1/responses")
    reply = parsed_line({"choices": [], "model": "m", "future_field": 1}, "/v1/chat/completions")
    assert reply.model == "m"  # what the API adds is no error, as for a live reply


def test_a_batch_that_takes_hours_is_no_stall_and_keeps_its_tasks_leases() -> None:
    """Three virtual hours in a batch, polled every minute: past the default stall time
    (15 min) and lease (90 s), yet nothing is reclaimed and the run completes."""
    import pytest_httpx2  # noqa: F401  (registers respx's "httpcore2" mocker)
    import respx
    from conftest import via_respx

    from planrun import Model, plan_and_run
    from planrun.core import EventName
    from planrun.dev.testing import FakeBatchAPI, FakeOpenAI
    from planrun.examples.answers import answers
    from planrun.examples.ticket_data import generate_tickets
    from planrun.examples.tickets import make_app, ticket_plan
    from planrun.runtime import VirtualClock

    clock = VirtualClock()
    fake = FakeOpenAI(answers())
    api = FakeBatchAPI(fake, complete_after=3 * 3600, clock=clock.now)
    app, _, _ = make_app(workers=1, capacity=2)
    plan = ticket_plan(generate_tickets(3, 0), app.registry)
    with respx.mock(using="httpcore2", assert_all_mocked=True,
                    assert_all_called=False) as router:
        router.route(url__regex=r"^https://api\.test/v1/(files|batches)").mock(
            side_effect=via_respx(api))
        router.post("https://api.test/v1/chat/completions").mock(side_effect=via_respx(fake))
        model = Model("gpt-4o-mini", api_key="sk-test-batch-hours-0000",
                      base_url="https://api.test/v1")
        report = plan_and_run(plan, app, model=model, clock=clock,
                              batch=Batching(wait_s=1.0, poll_s=60.0))
    assert report.ok, report.summary()
    assert report.duration_s >= 2 * 3 * 3600  # two waves of three hours, virtual
    assert not [e for e in report.events if e.event == EventName.RECLAIMED]
    assert api.submitted == 2
    assert len(fake.requests) == 6  # every call answered by a batch line, none live


def test_batch_settings_round_trip_through_a_run_s_meta() -> None:
    settings = Batching(size=7, wait_s=0.5, poll_s=2.0, live_s=3.0, cancel_s=4.0, price=0.4)
    kept = json.loads(json.dumps(settings.to_meta()))  # as a store keeps it
    assert Batching.from_meta(kept) == settings
    # settings the meta does not name keep their defaults; names it should not hold are left
    assert Batching.from_meta({"poll_s": 0.1, "other": 1}) == Batching(poll_s=0.1)
