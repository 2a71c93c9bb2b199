"""planrun.limiter: shared request and token buckets, under virtual time."""

from __future__ import annotations

import asyncio

import pytest

from planrun.core._errors import UsageError
from planrun.model._limiter import RateLimiter
from planrun.runtime._clock import VirtualClock, run_virtual


async def _times(limiter: RateLimiter, tokens: list[int]) -> list[float]:
    """Acquire once per entry of ``tokens`` concurrently; return when each one got through."""
    loop = asyncio.get_running_loop()
    got: list[float] = [0.0] * len(tokens)

    async def one(i: int, n: int) -> None:
        await limiter.acquire(n)
        got[i] = loop.time()

    await asyncio.gather(*(one(i, n) for i, n in enumerate(tokens)))
    return got


def test_requests_are_evenly_spaced_at_the_rate() -> None:
    limiter = RateLimiter(requests_per_minute=600)
    times = run_virtual(_times(limiter, [0] * 10))
    assert times == pytest.approx([i / 10 for i in range(10)])
    assert limiter.acquired == 10


def test_request_burst_lets_a_few_go_at_once() -> None:
    limiter = RateLimiter(requests_per_minute=60, request_burst=3)
    times = run_virtual(_times(limiter, [0] * 5))
    assert times == pytest.approx([0, 0, 0, 1, 2])


def test_no_one_second_window_exceeds_the_rate() -> None:
    rate = 7
    times = run_virtual(_times(RateLimiter(requests_per_minute=rate * 60), [0] * 50))
    for start in times:
        assert sum(start <= t < start + 1 - 1e-9 for t in times) <= rate
    assert (len(times) - 1) / (times[-1] - times[0]) == pytest.approx(rate)


def test_token_bucket() -> None:
    # 6000 tokens/min = 100/s, bucket of 100 tokens
    limiter = RateLimiter(tokens_per_minute=6000)
    times = run_virtual(_times(limiter, [50, 50, 50, 50]))
    assert times == pytest.approx([0, 0, 0.5, 1.0])


def test_a_request_larger_than_the_bucket_goes_when_full_then_is_paid_back() -> None:
    limiter = RateLimiter(tokens_per_minute=6000)  # 100 tokens/s, bucket of 100
    times = run_virtual(_times(limiter, [500, 50]))
    assert times == pytest.approx([0, 4.5])  # 400 tokens of debt, then 50 more


def test_both_limits_apply() -> None:
    limiter = RateLimiter(requests_per_minute=600, tokens_per_minute=6000)
    times = run_virtual(_times(limiter, [100, 10, 10]))
    # the second request waits for its slot (0.1 s) and its tokens (0.1 s): 0.1
    assert times == pytest.approx([0, 0.1, 0.2])


def test_reconcile_refunds_unused_tokens() -> None:
    limiter = RateLimiter(tokens_per_minute=6000)

    async def main() -> tuple[float | None, float | None, float]:
        await limiter.acquire(100)
        before = limiter.available_tokens()
        limiter.reconcile(estimated=100, actual=30)
        after = limiter.available_tokens()
        start = asyncio.get_running_loop().time()
        await limiter.acquire(70)
        return before, after, asyncio.get_running_loop().time() - start

    before, after, waited = run_virtual(main())
    assert before == pytest.approx(0)
    assert after == pytest.approx(70)
    assert waited == 0


def test_reconcile_charges_underestimates() -> None:
    limiter = RateLimiter(tokens_per_minute=6000)

    async def main() -> float | None:
        await limiter.acquire(10)
        limiter.reconcile(estimated=10, actual=150)
        return limiter.available_tokens()

    assert run_virtual(main()) == pytest.approx(-50)


def test_penalize_pauses_every_caller() -> None:
    limiter = RateLimiter(requests_per_minute=6000)

    async def main() -> list[float]:
        await limiter.acquire()
        limiter.penalize(3.0)
        return await _times(limiter, [0, 0, 0])

    times = run_virtual(main())
    assert times == pytest.approx([3.0, 3.01, 3.02])


def test_penalize_without_a_rate_still_pauses() -> None:
    limiter = RateLimiter()

    async def main() -> list[float]:
        limiter.penalize(2.0)
        limiter.penalize(1.0)  # a shorter pause does not shorten the longer one
        limiter.penalize(0)
        return await _times(limiter, [0, 0])

    assert run_virtual(main()) == [2.0, 2.0]


def test_no_limits_means_no_waiting() -> None:
    limiter = RateLimiter()
    assert run_virtual(_times(limiter, [10**6] * 5)) == [0.0] * 5
    assert limiter.waited == 0


def test_callers_are_served_first_come_first_served() -> None:
    limiter = RateLimiter(requests_per_minute=600)
    order: list[int] = []

    async def one(i: int) -> None:
        await asyncio.sleep(i * 0.001)  # arrive in order
        await limiter.acquire(0)
        order.append(i)

    async def main() -> None:
        await asyncio.gather(*(one(i) for i in reversed(range(20))))

    run_virtual(main())
    assert order == list(range(20))


def test_waited_measures_throttling() -> None:
    limiter = RateLimiter(requests_per_minute=60)
    run_virtual(_times(limiter, [0, 0, 0]))
    assert limiter.waited == pytest.approx(0 + 1 + 2)


def test_a_limiter_survives_a_new_loop() -> None:
    limiter = RateLimiter(requests_per_minute=60)
    clock = VirtualClock()
    first = clock.run(_times(limiter, [0, 0]))
    second = clock.run(_times(limiter, [0, 0]))
    assert first == pytest.approx([0, 1])
    assert second == pytest.approx([1, 2])


def test_cancelled_waiter_does_not_block_the_queue() -> None:
    limiter = RateLimiter(requests_per_minute=60)

    async def main() -> float:
        await limiter.acquire()
        waiter = asyncio.ensure_future(limiter.acquire())
        await asyncio.sleep(0.5)
        waiter.cancel()
        await limiter.acquire()
        return asyncio.get_running_loop().time()

    assert run_virtual(main()) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"requests_per_minute": 0},
        {"tokens_per_minute": -5},
        {"requests_per_minute": 10, "request_burst": 0.5},
    ],
)
def test_bad_settings_are_usage_errors(kwargs: dict[str, float]) -> None:
    with pytest.raises(UsageError):
        RateLimiter(**kwargs)


def test_repr() -> None:
    assert repr(RateLimiter(600)) == "RateLimiter(requests_per_minute=600, tokens_per_minute=None)"
