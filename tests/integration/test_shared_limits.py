"""The shared rate limiter and budget, against every backend (memory, SQLite, PostgreSQL).

Two stores opened on the same database stand for two processes (for ``memory://`` they
are one object). Timing assertions are lower bounds only: a slow machine can only make
waits longer, never shorter.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from pgtest import fresh_schema

from planrun.core._errors import BudgetExceeded, UsageError
from planrun.model._limiter import ProviderLimits
from planrun.model._limits import RunLimits, SharedBudget, SharedRateLimiter, limit_key
from planrun.model._usage import Tally
from planrun.stores import SCHEMA_VERSION, Store, open_store

BACKENDS = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]

Connect = Callable[[], Awaitable[Store]]


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "memory":
        yield "memory://"
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'limits.db'}"
    else:
        yield from fresh_schema("planrun_lim")


@pytest.fixture
async def connect(store_url: str) -> AsyncIterator[Connect]:
    opened: list[Store] = []

    async def make() -> Store:
        if store_url == "memory://" and opened:
            return opened[0]
        store = open_store(store_url)
        await store.open()
        opened.append(store)
        return store

    yield make
    for store in opened:
        await store.close()


async def test_two_processes_share_one_request_rate(connect: Connect) -> None:
    a, b = await connect(), await connect()
    rpm, n = 1200.0, 12  # one request every 50 ms
    limiters = [SharedRateLimiter(s, "gpt-test", requests_per_minute=rpm) for s in (a, b)]
    granted: list[float] = []

    async def one(limiter: SharedRateLimiter) -> None:
        await limiter.acquire()
        granted.append(time.monotonic())

    await asyncio.gather(*(one(limiters[i % 2]) for i in range(n)))
    granted.sort()
    # n requests need n - 1 intervals; the first grant may be noted a little late.
    assert granted[-1] - granted[0] >= (n - 2) * 60 / rpm
    assert sum(limiter.acquired for limiter in limiters) == n
    state = await a.limiter_state("gpt-test")
    assert state is not None and state.acquired == n and state.rpm == rpm
    assert state.recent_rpm >= n - 1  # this minute's requests


async def test_a_burst_goes_back_to_back_then_the_rate_holds(connect: Connect) -> None:
    store = await connect()
    limiter = SharedRateLimiter(store, "k", requests_per_minute=60, request_burst=3)
    start = time.monotonic()
    for _ in range(3):
        await limiter.acquire()
    assert limiter.store_calls == 3  # none of the three waited
    assert await store.limiter_take("k", 0) > 0.5  # the fourth must wait about a second
    assert time.monotonic() - start < 60  # sanity: nothing above slept


async def test_a_429_in_one_process_pauses_the_other(connect: Connect) -> None:
    a, b = await connect(), await connect()
    first = SharedRateLimiter(a, "k", requests_per_minute=60_000)
    other = SharedRateLimiter(b, "k", requests_per_minute=60_000)
    await first.acquire()
    await first.penalize(0.3)
    state = await b.limiter_state("k")
    assert state is not None and state.penalties == 1 and 0 < state.paused_for <= 0.3
    start = time.monotonic()
    await other.acquire()
    assert time.monotonic() - start >= 0.25


async def test_a_limit_the_provider_reported_is_kept_by_a_process_that_starts_later(
        connect: Connect) -> None:
    # The run says 240,000 tokens a minute; the provider's headers say 120,000. A process
    # whose first request comes after that (a worker that got its first task later) must
    # not write the configured rate back over the provider's.
    a, b = await connect(), await connect()
    first = SharedRateLimiter(a, "k", tokens_per_minute=240_000)
    await first.acquire(100)
    await first.observe(ProviderLimits(tokens_limit=120_000))
    state = await a.limiter_state("k")
    assert state is not None and state.tpm == 120_000 and state.learned
    later = SharedRateLimiter(b, "k", tokens_per_minute=240_000)
    await later.acquire(100)
    state = await b.limiter_state("k")
    assert state is not None and state.tpm == 120_000  # the provider's word stands
    assert later.tokens_per_minute == 120_000 and later.token_burst == 2000
    # A rate configured over a configured one still replaces it (a new run's --tpm).
    await a.limiter_configure("c", None, 60_000, 1.0, 1000.0)
    await b.limiter_configure("c", None, 90_000, 1.0, 1500.0)
    state = await a.limiter_state("c")
    assert state is not None and state.tpm == 90_000 and not state.learned
    # ...and the provider's word replaces a learned one (a raised limit).
    await later.observe(ProviderLimits(tokens_limit=300_000))
    state = await a.limiter_state("k")
    assert state is not None and state.tpm == 300_000


async def test_tokens_are_taken_by_estimate_and_given_back_by_usage(connect: Connect) -> None:
    store = await connect()
    limiter = SharedRateLimiter(store, "k", tokens_per_minute=60_000, token_burst=1000)
    await limiter.acquire(1000)
    state = await store.limiter_state("k")
    assert state is not None and state.tokens_available is not None
    assert state.tokens_available < 500  # the estimate was taken (1,000 a second refill)
    await limiter.reconcile(1000, 0)  # it used nothing: all of it comes back
    state = await store.limiter_state("k")
    assert state is not None and state.tokens_available == pytest.approx(1000, abs=1)
    assert await store.limiter_take("k", 1000) == 0  # so a full-size request goes at once


async def test_a_request_above_the_token_bucket_waits_for_a_full_bucket_and_borrows(
        connect: Connect) -> None:
    store = await connect()
    limiter = SharedRateLimiter(store, "k", tokens_per_minute=6000, token_burst=100)
    await limiter.acquire(500)  # bucket full: it goes, and owes 400 tokens (4 s)
    state = await store.limiter_state("k")
    assert state is not None and state.tokens_available is not None
    assert state.tokens_available < -350
    assert await store.limiter_take("k", 10) > 3


async def test_two_processes_share_one_budget(connect: Connect) -> None:
    a, b = await connect(), await connect()
    first, other = SharedBudget(a, "run-1"), SharedBudget(b, "run-1")
    await first.open(RunLimits(budget_tokens=1000).budget())
    await first.reserve(600, 0.0)
    other.patience = 0.1  # waits for the reservation at most this long
    with pytest.raises(BudgetExceeded, match="600 reserved of 1000"):
        await other.reserve(600, 0.0)
    await first.settle(600, 0.0, Tally(1, 80, 0, 20, 0.0))  # it used 100 tokens
    await other.reserve(600, 0.0)
    spend = await b.spend("run-1")
    assert spend is not None
    assert (spend.total_tokens, spend.reserved_tokens, spend.requests) == (100, 600, 1)
    assert spend.tokens_left == 900
    with pytest.raises(BudgetExceeded, match="token budget exceeded"):
        await first.reserve(901, 0.0)  # even with every reservation back, it cannot fit


async def test_a_call_that_fits_waits_for_the_reservations_in_flight(connect: Connect) -> None:
    a, b = await connect(), await connect()
    first, other = SharedBudget(a, "run-1"), SharedBudget(b, "run-1", poll=0.01)
    await first.open(RunLimits(budget_tokens=1000).budget())
    await first.reserve(900, 0.0)

    async def settle_soon() -> None:
        await asyncio.sleep(0.1)
        await first.settle(900, 0.0, Tally(1, 100, 0, 0, 0.0))

    settling = asyncio.ensure_future(settle_soon())
    await other.reserve(500, 0.0)  # waits, then fits beside the 100 really used
    await settling
    spend = await a.spend("run-1")
    assert spend is not None and (spend.total_tokens, spend.reserved_tokens) == (100, 500)


async def test_concurrent_reservations_never_overshoot(connect: Connect) -> None:
    stores = [await connect() for _ in range(3)]
    await stores[0].spend_open("run-1", 1000, None)
    results = await asyncio.gather(*(stores[i % 3].spend_reserve("run-1", 100, 0.0)
                                     for i in range(25)))
    assert sum(1 for r in results if r is None) == 10
    spend = await stores[1].spend("run-1")
    assert spend is not None and spend.reserved_tokens == 1000


async def test_a_money_budget_is_shared_too(connect: Connect) -> None:
    store = await connect()
    budget = SharedBudget(store, "run-1", patience=0.05)
    await budget.open(RunLimits(budget_usd=0.01).budget())
    await budget.reserve(10, 0.004)
    await budget.settle(10, 0.004, Tally(1, 5, 0, 5, 0.006))
    with pytest.raises(BudgetExceeded, match="cost budget exceeded"):
        await budget.reserve(10, 0.005)
    await budget.reserve(10, 0.004)


async def test_a_resumed_run_keeps_what_was_spent_and_drops_dead_reservations(
        connect: Connect) -> None:
    store = await connect()
    budget = SharedBudget(store, "run-1")
    await budget.open(RunLimits(budget_tokens=1000).budget())
    await budget.reserve(300, 0.0)
    await budget.settle(300, 0.0, Tally(1, 200, 0, 100, 0.0))
    await budget.reserve(500, 0.0)  # its process dies with the call in flight
    again = SharedBudget(await connect(), "run-1")
    await again.open(None, release=True)  # a resume: the limits stay, the spend too
    spend = await store.spend("run-1")
    assert spend is not None
    assert (spend.max_tokens, spend.total_tokens, spend.reserved_tokens) == (1000, 300, 0)


@pytest.mark.parametrize(
    "store_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
    indirect=True)
async def test_a_schema_2_store_is_migrated_to_the_shared_limits(store_url: str) -> None:
    assert SCHEMA_VERSION == 6
    store = open_store(store_url)
    await store.open()
    await store.close()
    from test_stores import as_version_2

    as_version_2(store_url)
    again = open_store(store_url)
    await again.open()
    try:
        await again.spend_open("r", 10, None)
        assert await again.spend_reserve("r", 11, 0.0) is not None
        await again.limiter_configure("k", 60.0, None, 1.0, 1.0)
        assert await again.limiter_take("k", 0) == 0
    finally:
        await again.close()


def test_a_limit_key_never_holds_the_api_key() -> None:
    secret = "sk-proj-T3stK3yN0tR3al9Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0Lz9Xc8Vb7Nm6Mq5Wn4Eb3Rv2"
    key = limit_key("gpt-4o-mini", secret)
    assert key.startswith("gpt-4o-mini@key:") and secret not in key and secret[:12] not in key
    assert key == limit_key("gpt-4o-mini", secret) != limit_key("gpt-4o-mini", secret + "x")
    assert limit_key("gpt-4o-mini", secret, "team-quota") == "team-quota"
    assert limit_key("gpt-4o-mini") == "gpt-4o-mini"


def test_limits_round_trip_through_run_meta_and_refuse_nonsense() -> None:
    limits = RunLimits(rpm=600, tpm=None, key="k", budget_tokens=5000, request_burst=2)
    assert RunLimits.from_meta({"limits": limits.to_meta()}) == limits
    assert RunLimits.from_meta({}) == RunLimits()
    with pytest.raises(UsageError):
        RunLimits(rpm=0)
    with pytest.raises(UsageError):
        SharedRateLimiter(open_store("memory://"), "k", requests_per_minute=-1)
