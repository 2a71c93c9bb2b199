"""planrun.usage: prices, the usage meter and budgets."""

from __future__ import annotations

import logging
import threading

import pytest

from planrun.core._errors import BudgetExceeded, PermanentError, UsageError
from planrun.model._usage import (
    DEFAULT_PRICES,
    Budget,
    Price,
    PriceTable,
    Tally,
    Usage,
    estimate_tokens,
)


def test_price_cost_bills_cached_tokens_at_the_cached_rate() -> None:
    price = Price(input=2.0, cached_input=0.5, output=8.0)
    assert price.cost(1_000_000, 0, 0) == 2.0
    assert price.cost(1_000_000, 1_000_000, 0) == 0.5
    assert price.cost(0, 0, 1_000_000) == 8.0
    assert price.cost(3000, 1000, 500) == pytest.approx((2000 * 2.0 + 1000 * 0.5 + 500 * 8.0) / 1e6)


def test_price_table_matches_dated_snapshots_to_their_family() -> None:
    table = PriceTable()
    assert table.lookup("gpt-4o-mini-2024-07-18") == DEFAULT_PRICES["gpt-4o-mini"]
    assert table.lookup("gpt-4o-2024-08-06") == DEFAULT_PRICES["gpt-4o"]
    assert table.lookup("gpt-4.1-nano") == DEFAULT_PRICES["gpt-4.1-nano"]
    assert table.lookup("gpt-5-mini-2025-08-07") == DEFAULT_PRICES["gpt-5-mini"]
    assert table.lookup("gpt-4o-minimal") is None  # a prefix, but not a dated snapshot
    assert table.lookup("gpt-4o-audio-preview") is None  # billed at another rate
    assert table.lookup("my-local-llama") is None
    assert "gpt-4o" in table and "llama" not in table


def test_price_table_overrides_and_additions() -> None:
    table = PriceTable({"gpt-4o-mini": (1, 1, 1), "gpt-4": Price(30, 30, 60)})
    assert table.lookup("gpt-4o-mini") == Price(1, 1, 1)
    assert table.lookup("gpt-4-0613") == Price(30, 30, 60)
    assert table.lookup("gpt-4o") == DEFAULT_PRICES["gpt-4o"]
    only = PriceTable({"x": (1, 1, 1)}, defaults=False)
    assert only.lookup("gpt-4o") is None
    assert PriceTable.of(only) is only


def test_meter_sums_exactly_per_key_and_for_the_run() -> None:
    usage = Usage(prices={"m": (1.0, 0.25, 4.0)})
    usage.scoped("decompose").record("m", prompt_tokens=1000, completion_tokens=100)
    task = usage.scoped("t1", "w1")
    task.record("m", prompt_tokens=500, cached_tokens=200, completion_tokens=50, prompt_hash="h")
    task.record("m", error="RateLimited")
    usage.scoped("t2", "w1").record("m", prompt_tokens=10, completion_tokens=1)

    total = usage.total
    assert (total.requests, total.prompt_tokens, total.cached_tokens) == (4, 1510, 200)
    assert total.completion_tokens == 151
    assert total.cost_usd == pytest.approx(
        (1000 + 100 * 4 + 300 + 200 * 0.25 + 50 * 4 + 10 + 4) / 1e6, rel=1e-12
    )
    assert usage["decompose"].total_tokens == 1100
    assert usage["t1"].requests == 2
    assert usage["t1"].total_tokens == 550
    assert usage["w1"].total_tokens == 561
    assert usage["w1"].cost_usd == pytest.approx((300 + 50 + 200 + 10 + 4) / 1e6)
    assert usage["nobody"] == Tally()
    assert set(usage.by_key()) == {"decompose", "t1", "w1", "t2"}
    assert [r.keys for r in usage.records] == [
        ("decompose",),
        ("t1", "w1"),
        ("t1", "w1"),
        ("t2", "w1"),
    ]
    assert usage.records[1].prompt_hash == "h"
    assert usage.records[2].error == "RateLimited"


def test_scoped_views_share_one_ledger_and_nest() -> None:
    usage = Usage()
    inner = usage.scoped("t1").scoped("w1", "t1")
    assert inner.keys == ("t1", "w1")
    inner.record("gpt-4o", prompt_tokens=1)
    assert usage.total.requests == inner.total.requests == 1
    assert inner.record("gpt-4o", keys=["extra"]).keys == ("t1", "w1", "extra")


def test_unknown_model_costs_zero_and_is_flagged_once(caplog: pytest.LogCaptureFixture) -> None:
    usage = Usage()
    with caplog.at_level(logging.WARNING, logger="planrun.usage"):
        first = usage.record("mystery-model", prompt_tokens=1000, completion_tokens=1000)
        usage.record("mystery-model", prompt_tokens=1)
    assert first.cost_usd == 0.0 and not first.priced
    assert usage.unpriced_models == frozenset({"mystery-model"})
    assert len([r for r in caplog.records if "mystery-model" in r.getMessage()]) == 1
    assert usage.record("gpt-4o-mini", prompt_tokens=1).priced


def test_budget_refuses_a_call_that_could_pass_the_token_limit() -> None:
    usage = Usage(budget=Budget(max_tokens=1000))
    usage.record("gpt-4o-mini", prompt_tokens=700, completion_tokens=100)
    usage.reserve("gpt-4o-mini", 150, 50).release()  # exactly at the limit is allowed
    with pytest.raises(BudgetExceeded, match="800 used") as caught:
        usage.reserve("gpt-4o-mini", 150, 51)
    assert isinstance(caught.value, PermanentError)


def test_reservations_count_against_the_budget_until_released() -> None:
    usage = Usage(budget=Budget(max_tokens=100))
    held = usage.reserve("gpt-4o-mini", 40, 20)
    with pytest.raises(BudgetExceeded, match="60 reserved"):
        usage.reserve("gpt-4o-mini", 40, 20)
    held.release()
    held.release()  # idempotent
    usage.reserve("gpt-4o-mini", 40, 20)


def test_cost_budget_uses_the_uncached_price_of_the_estimate() -> None:
    usage = Usage(prices={"m": (10.0, 1.0, 20.0)}, budget=Budget(max_cost=0.001))
    usage.reserve("m", 50, 25).release()  # 0.0005 + 0.0005 = 0.001
    with pytest.raises(BudgetExceeded, match="cost budget"):
        usage.reserve("m", 51, 25)
    # an unpriced model costs nothing, so a money budget cannot stop it (it is flagged)
    usage.reserve("unpriced", 10**6, 10**6).release()


def test_no_budget_means_no_limit() -> None:
    Usage().reserve("gpt-4o", 10**9, 10**9).release()


@pytest.mark.parametrize("kwargs", [{"max_tokens": -1}, {"max_cost": -0.5}])
def test_negative_budgets_are_usage_errors(kwargs: dict[str, float]) -> None:
    with pytest.raises(UsageError):
        Budget(**kwargs)  # type: ignore[arg-type]


def test_estimate_is_conservative() -> None:
    text = "The quick brown fox jumps over the lazy dog. " * 40  # ~400 real tokens
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
    estimate = estimate_tokens(messages)
    assert estimate >= len(text) / 3
    assert estimate_tokens(messages, max_completion=500) == estimate + 500
    assert estimate_tokens(messages, extra_text="x" * 300) == estimate + 100
    parts = [{"role": "user", "content": [{"type": "text", "text": text}]}]
    assert estimate_tokens(parts) >= len(text) / 3


def test_meter_is_exact_under_threads() -> None:
    usage = Usage(prices={"m": (1.0, 1.0, 1.0)})

    def work(n: int) -> None:
        view = usage.scoped(f"t{n}", "all")
        for _ in range(1000):
            view.record("m", prompt_tokens=3, completion_tokens=2, cached_tokens=1)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert usage.total.requests == 8000
    assert usage.total.total_tokens == 40_000
    assert usage.total.cached_tokens == 8000
    assert usage["all"].requests == 8000
    assert all(usage[f"t{n}"].total_tokens == 5000 for n in range(8))


def test_repr_shows_totals() -> None:
    usage = Usage()
    usage.record("gpt-4o-mini", prompt_tokens=10, completion_tokens=5)
    assert "requests=1" in repr(usage) and "tokens=15" in repr(usage)
