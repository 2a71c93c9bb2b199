"""The tiers' one rule (which tier a call goes at, the batch take-back as its case), the
learned latencies, and what each tier costs."""

from __future__ import annotations

import pytest

from planrun import UsageError
from planrun.core import Event, EventName, KindSpec, Registry, Task, TaskContext, WorkerSpec
from planrun.core._routing import get_router
from planrun.core.scheduling import (
    DEFAULT_LATENCY_S,
    Latencies,
    RetryPolicy,
    Scheduler,
    TierChoice,
    TierPolicy,
    batch_take_back,
    check_tiers,
    choose_tier,
    depth_below,
    live_rounds,
    slack_s,
)
from planrun.model import Price, PriceTable, Usage
from planrun.runtime._supervisor import Supervisor

LAT = {"batch": 3600.0, "flex": 3.0, "default": 0.3, "priority": 0.15}
CHEAP_FIRST = ("batch", "flex", "default", "priority")


def test_tiers_are_checked_and_ordered_cheapest_first_with_the_default_always_in() -> None:
    assert check_tiers(["priority", "flex"]) == ("flex", "default", "priority")
    assert check_tiers("priority,batch") == ("batch", "default", "priority")
    assert check_tiers(()) == ("default",)
    with pytest.raises(UsageError, match="unknown tier 'fast'"):
        check_tiers(["flex", "fast"])


def test_with_room_to_spare_the_cheapest_tier_whose_extra_time_fits() -> None:
    assert choose_tier(allowed=CHEAP_FIRST, slack=4000.0, latency=LAT).tier == "batch"
    flex = choose_tier(allowed=CHEAP_FIRST, slack=100.0, latency=LAT)
    assert flex.tier == "flex"
    assert flex.flex_retry_s == pytest.approx(100.0 - 2.7)  # the slack flex leaves
    shared = choose_tier(allowed=CHEAP_FIRST, slack=100.0, latency=LAT, rounds=10)
    assert shared.flex_retry_s == pytest.approx((100.0 - 2.7) / 10)  # a round's share
    assert choose_tier(allowed=("flex", "default"), slack=2.7, latency=LAT).tier == "flex"
    assert choose_tier(allowed=("flex", "default"), slack=2.69, latency=LAT).tier == "default"


def test_once_the_slack_is_spent_the_fastest_allowed_tier() -> None:
    assert choose_tier(allowed=CHEAP_FIRST, slack=-0.1, latency=LAT).tier == "priority"
    assert choose_tier(allowed=CHEAP_FIRST, slack=-50.0, latency=LAT).tier == "priority"
    assert choose_tier(allowed=("flex", "default"), slack=-1.0, latency=LAT).tier == "default"
    assert choose_tier(allowed=CHEAP_FIRST, slack=0.0, latency=LAT).tier == "default"


def test_without_a_deadline_the_cheapest_allowed_tier() -> None:
    assert choose_tier(allowed=("flex", "default"), slack=None, latency=LAT) == \
        TierChoice("flex")
    assert choose_tier(allowed=("default", "priority"), slack=None, latency=LAT).tier == \
        "default"


def test_slack_counts_the_run_over_its_slots_and_the_task_s_own_chain() -> None:
    base = dict(now=10.0, deadline=100.0, slots=10, default_s=2.0)
    assert slack_s(**base, unfinished=100, depth=1) == pytest.approx(70.0)  # 10 rounds
    assert slack_s(**base, unfinished=10, depth=30) == pytest.approx(30.0)  # its chain
    assert slack_s(**base, unfinished=100, depth=1, margin_s=5) == pytest.approx(65.0)
    assert slack_s(**base, unfinished=1000, depth=1) < 0


def test_depth_below_counts_only_unfinished_dependents() -> None:
    after = {"a": ["b"], "b": ["c"], "x": ["c"]}
    assert depth_below("a", {"a", "b", "c", "x"}, after) == 3
    assert depth_below("x", {"a", "b", "c", "x"}, after) == 2
    assert depth_below("a", {"a", "x"}, after) == 1
    assert depth_below("a", {"x"}, after) == 0


def test_without_a_deadline_or_waiting_calls_nothing_goes_live() -> None:
    assert not batch_take_back(now=0, deadline=None, waiting=100, rounds=9, live_s=60,
                               margin_s=60)
    assert not batch_take_back(now=99, deadline=100, waiting=0, rounds=9, live_s=60,
                               margin_s=60)


def test_calls_go_live_once_the_time_left_only_covers_the_rest_live() -> None:
    # 2 rounds of 2 s live, plus a 1 s margin for the cancel
    rule = dict(deadline=100.0, waiting=10, rounds=2, live_s=2.0, margin_s=1.0)
    assert not batch_take_back(now=94.9, **rule)
    assert batch_take_back(now=95.0, **rule)
    assert batch_take_back(now=99.0, **rule)
    assert batch_take_back(now=90.0, **{**rule, "rounds": 5})  # more to do: sooner


def test_live_rounds_count_slots_and_the_longest_chain() -> None:
    after = {"a": ["b"], "b": ["c"]}
    assert live_rounds(set(), after, 4) == 0
    assert live_rounds({"a", "b", "c", "x", "y"}, after, 10) == 3  # the chain a-b-c
    assert live_rounds({"b", "c", "x", "y"}, after, 10) == 2  # a is done
    assert live_rounds({f"t{i}" for i in range(10)}, {}, 4) == 3  # 10 calls, 4 at once


def _core(deadline: float | None, tasks: list[Task], policy: TierPolicy | None) -> Scheduler:
    core = Scheduler(router=get_router("balanced"), sink=lambda *a: None, retry=RetryPolicy(),
                     kinds=Registry([KindSpec("k"), KindSpec("s")]), deadline=deadline)
    core.add_worker(WorkerSpec("a", None, 3))
    core.use_tiers(policy)
    core.add(tasks, 0.0)
    return core


def test_the_scheduler_weighs_the_rest_of_the_run_and_hurries_past_the_deadline() -> None:
    # ten classify-then-draft pairs: 20 calls on 5 slots, 4 rounds of 10 s, plus 5 s
    tasks = [Task(f"c{i}", "k") for i in range(10)]
    tasks += [Task(f"d{i}", "k", depends_on=(f"c{i}",)) for i in range(10)]
    core = _core(100.0, tasks, TierPolicy(latency_s={"default": 10.0}))
    assert not core.batch_due(54.0, 10, 5, 5.0)
    assert not core.batch_due(55.0, 0, 5, 5.0)  # nothing waits in a batch
    assert not core.batch_due(74.0, 10, 10, 5.0)  # 10 slots: 2 rounds
    assert core.batch_due(75.0, 10, 10, 5.0)
    assert core.batch_due(54.0, 10, 5, 5.0)  # once taken back, live for good
    core.tick(100.0)  # the deadline passes: what is still in flight goes live at once
    assert core.facts.deadline_reached
    assert core.batch_due(100.0, 10, 5, 5.0)


def test_the_batch_rule_uses_the_learned_default_tier_figure() -> None:
    tasks = [Task(f"c{i}", "k") for i in range(10)]
    tasks += [Task(f"d{i}", "k", depends_on=(f"c{i}",)) for i in range(10)]
    core = _core(100.0, tasks, TierPolicy(latency_s={"default": 10.0}))
    assert core.batch_due(75.0, 10, 10, 5.0) is True  # 2 rounds of 10 s, 5 s margin
    learned = _core(100.0, tasks, TierPolicy(latency_s={"default": 10.0}))
    for _ in range(30):
        learned.timing.answered("k", "default", 1.0)  # calls answer in 1 s: 2 rounds are 2 s
    assert not learned.batch_due(75.0, 10, 10, 5.0)
    assert learned.batch_due(93.5, 10, 10, 5.0)


def _taught(policy: TierPolicy, seconds: dict[str, float]) -> TierPolicy:
    """``policy`` after steady answers of kind ``k`` that took ``seconds`` at each tier."""
    for _ in range(80):
        for tier, took in seconds.items():
            policy.latencies.observe("k", tier, took)
    return policy


def test_before_any_answer_a_spent_slack_means_the_default_tier_not_priority() -> None:
    policy = TierPolicy(("flex", "priority"), slots=3)  # conservative starting figures only
    core = _core(30.0, _classify_and_summarise(60), policy)
    assert core.tier_for("c0", 0.0).tier == "default"  # 21 rounds of 30 s: "spent", unproven
    policy.latencies.observe("k", "priority", 0.2)  # one answer (0.3 s with its margin):
    # default is taken as 0.6 s and flex 6 s, so 21 rounds need 12.6 s and flex's 5.4 s fits
    assert core.tier_for("c0", 0.0).tier == "flex"
    assert core.tier_for("c0", 20.0).tier == "priority"  # now the slack is known to be spent


def _classify_and_summarise(n: int) -> list[Task]:
    tasks = [Task(f"c{i}", "k") for i in range(n)]
    return [*tasks, Task("sum", "s", depends_on=tuple(t.id for t in tasks))]


def test_a_loose_deadline_sends_calls_at_flex_and_moves_up_as_the_slack_runs_out() -> None:
    # 60 classifications and a summary, 3 slots: 21 rounds of 0.3 s = 6.3 s at default
    policy = _taught(TierPolicy(("flex", "priority"), slots=3), LAT)
    core = _core(100.0, _classify_and_summarise(60), policy)
    assert core.tier_for("c0", 0.0).tier == "flex"  # 93.7 s of slack: 2.7 s more fits
    assert core.tier_for("c0", 90.9).tier == "flex"  # 2.8 s of slack still
    assert core.tier_for("c0", 91.5).tier == "default"  # 2.2 s: flex's 2.7 s does not fit
    assert core.tier_for("c0", 94.0).tier == "priority"  # the rest needs more than is left
    choice = core.tier_for("c0", 0.0)
    assert choice is not None and choice.slack_s == pytest.approx(93.7)
    assert choice.flex_retry_s == pytest.approx(91.0 / 21)  # 21 rounds share it


def test_a_task_on_the_critical_path_moves_up_first() -> None:
    # a chain a-b-c-d-e (5 calls one after the other) beside a lone task x, 10 slots
    chain = [Task("a", "k")]
    chain += [Task(n, "k", depends_on=(p,)) for p, n in zip("abcd", "bcde", strict=True)]
    policy = _taught(TierPolicy(("flex", "priority"), slots=10),
                     {"default": 1.0, "flex": 3.0, "priority": 0.5})
    core = _core(6.9, [*chain, Task("x", "k")], policy)
    x, a = core.tier_for("x", 0.0), core.tier_for("a", 0.0)
    assert x is not None and a is not None
    assert x.tier == "flex"  # 5.9 s of slack for its one call: flex's 2 s more fits
    assert a.tier == "default"  # 1.9 s of slack for the five calls of its chain
    assert core.tier_for("a", 0.5).tier == "default"
    assert core.tier_for("a", 2.1).tier == "priority"  # its chain no longer fits at default
    assert core.tier_for("x", 2.1).tier == "flex"


def test_without_tiers_nothing_is_chosen_and_without_a_deadline_the_cheapest() -> None:
    tasks = _classify_and_summarise(3)
    assert _core(100.0, tasks, None).tier_for("c0", 0.0) is None
    assert _core(100.0, tasks, TierPolicy(())).tier_for("c0", 0.0) is None
    free = _core(None, tasks, TierPolicy(("flex", "priority")))
    assert free.tier_for("c0", 0.0) == TierChoice("flex")


def test_after_a_take_back_no_call_goes_into_a_batch() -> None:
    policy = TierPolicy(("batch", "flex"), latency_s={**LAT, "batch": 50.0}, slots=3)
    core = _core(1000.0, _classify_and_summarise(6), policy)
    assert core.tier_for("c0", 0.0).tier == "batch"
    assert core.batch_due(999.0, 6, 3, 5.0)
    assert core.tier_for("c0", 0.0).tier == "flex"


def test_latencies_start_conservative_and_learn_from_answers() -> None:
    lat = Latencies({"default": 10.0})
    assert lat.of("default") == 10.0 and lat.of("flex") == DEFAULT_LATENCY_S["flex"]
    lat.observe("k", "flex", 3.0)
    assert lat.of("flex", "k") == pytest.approx(4.5)  # one answer: 3 s and a margin
    assert lat.of("flex") == pytest.approx(4.5)  # the tier over every kind learns too
    assert lat.of("flex", "other") == pytest.approx(4.5)  # a kind not seen: the tier's
    for _ in range(40):
        lat.observe("k", "flex", 3.0)
    assert lat.of("flex", "k") == pytest.approx(3.0, abs=0.01)  # steady answers: no margin
    lat.observe("s", "flex", 30.0)
    assert lat.of("flex", "s") > 30.0 and lat.of("flex", "k") < 3.1
    lat.observe("k", "flex", 30.0)  # one slow answer weighs a fifth, and widens the margin
    assert 8.0 < lat.of("flex", "k") < 30.0
    assert lat.answers("flex", "k") == 42
    with pytest.raises(UsageError, match="latency of tier 'flex' must be seconds > 0"):
        Latencies({"flex": -1})


def test_a_live_tier_not_tried_is_scaled_from_one_that_was() -> None:
    lat = Latencies({"default": 30.0, "flex": 300.0, "priority": 15.0})
    for _ in range(40):
        lat.observe("k", "priority", 0.15)
    assert lat.of("priority", "k") == pytest.approx(0.15, abs=0.01)
    assert lat.of("default", "k") == pytest.approx(0.3, abs=0.02)  # 2x, as the start says
    assert lat.of("flex", "k") == pytest.approx(3.0, abs=0.2)  # 20x
    assert lat.of("batch", "k") == DEFAULT_LATENCY_S["batch"]  # a batch is not scaled
    for _ in range(40):
        lat.observe("k", "default", 0.5)
    assert lat.of("default", "k") == pytest.approx(0.5, abs=0.02)  # learned beats scaled
    assert lat.of("flex", "k") == pytest.approx(5.0, abs=0.3)  # default comes first


def test_a_resumed_run_learns_the_latencies_of_its_earlier_answers() -> None:
    core = _core(100.0, _classify_and_summarise(3), TierPolicy(None, slots=3))
    used = [Event(0, 0.0, "c0", EventName.USAGE, detail={"tier": "flex", "latency_s": 3.0}),
            Event(1, 0.0, "c1", EventName.USAGE, detail={"tier": "default", "error": "x"}),
            Event(2, 0.0, "c1", EventName.COMPLETED)]
    core.timing.resumed_tiers(["flex"], used)
    tiers = core.timing.tiers
    assert tiers is not None and tiers.allowed == ("flex", "default")
    assert tiers.latencies.answers("flex", "k") == 1
    assert tiers.latencies.answers("default") == 0  # the failed request taught nothing
    assert tiers.latencies.of("flex") == pytest.approx(4.5)


def test_a_choice_travels_as_json() -> None:
    choice = TierChoice("flex", 12.5, 9.0)
    assert TierChoice.from_dict(choice.to_dict()) == choice
    assert TierChoice.from_dict(None) is None
    assert TierChoice.from_dict(TierChoice("priority").to_dict()) == TierChoice("priority")


def test_each_tier_is_priced_at_what_it_bills() -> None:
    meter = Usage()
    m = 1_000_000
    default = meter.record("gpt-4o-mini", prompt_tokens=m, completion_tokens=m)
    flex = meter.record("gpt-4o-mini", prompt_tokens=m, completion_tokens=m, tier="flex")
    batch = meter.record("gpt-4o-mini", prompt_tokens=m, completion_tokens=m, tier="batch")
    priority = meter.record("gpt-4o-mini", prompt_tokens=m, completion_tokens=m,
                            tier="priority")
    assert default.cost_usd == pytest.approx(0.75)
    assert flex.cost_usd == pytest.approx(0.375) and batch.cost_usd == pytest.approx(0.375)
    assert priority.cost_usd == pytest.approx(1.25)  # the table's priority figures
    assert (flex.tier, priority.tier) == ("flex", "priority")
    assert meter.estimate_cost("gpt-4o-mini", m, m, tier="priority") == pytest.approx(1.25)


def test_cached_tokens_are_priced_at_the_cached_figure_of_their_tier() -> None:
    meter = Usage()
    m = 1_000_000
    cached = meter.record("gpt-4o-mini", prompt_tokens=m, cached_tokens=m // 2, tier="flex")
    assert cached.cost_usd == pytest.approx((0.5 * 0.15 + 0.5 * 0.075) * 0.5)
    assert meter.total.cached_tokens == m // 2
    fast = meter.record("gpt-4o-mini", prompt_tokens=m, cached_tokens=m, tier="priority")
    assert fast.cost_usd == pytest.approx(0.125)


def test_priority_for_a_model_without_a_priority_price_is_bad_input() -> None:
    table = PriceTable({"mine": Price(1.0, 0.5, 2.0)})
    table.check_tier("gpt-4o-mini", "priority")
    table.check_tier("mine", "flex")
    table.check_tier("unknown-model", "priority")  # unpriced altogether: counted as 0
    with pytest.raises(UsageError, match="model 'mine' has no priority price"):
        table.check_tier("mine", "priority")
    with pytest.raises(UsageError, match="model 'gpt-5-nano' has no priority price"):
        table.check_tier("gpt-5-nano", "priority")
    with pytest.raises(UsageError, match="unknown tier 'fast'"):
        table.check_tier("mine", "fast")


@pytest.mark.parametrize(("policy", "chosen"), [
    (None, None), (TierPolicy(()), None), (TierPolicy(("flex",)), "flex")])
def test_each_attempt_is_told_its_tier_only_when_the_run_chooses_one(
        policy: TierPolicy | None, chosen: str | None) -> None:
    told: list[TierChoice | None] = []

    async def handler(payload: object, ctx: TaskContext) -> None:
        told.append(ctx.tier)

    sup = Supervisor(Registry([KindSpec("k", handler=handler)]), [WorkerSpec("w", None, 2)])
    sup.core.use_tiers(policy)
    sup.add_tasks([Task(f"t{i}", "k") for i in range(4)])
    assert sup.core.chooses_tiers is (chosen is not None)
    assert sup.run().ok
    assert [t.tier if t is not None else None for t in told] == [chosen] * 4
