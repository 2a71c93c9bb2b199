"""One loop rides out a failing store for every driver: the core's waits, until patience ends."""

from __future__ import annotations

import pytest

from planrun.core import StoreError
from planrun.core.scheduling import STORE_PATIENCE, store_wait
from planrun.runtime import VirtualClock
from planrun.runtime._patience import patiently


def test_the_core_says_how_long_to_wait_and_when_to_give_up() -> None:
    assert store_wait(1, now=0.0, until=10.0) == STORE_PATIENCE.backoff(1) == 0.2
    assert store_wait(3, now=0.0, until=10.0) == 0.8
    assert store_wait(9, now=0.0, until=10.0) == 5.0  # capped
    assert store_wait(1, now=10.0, until=10.0) is None


def test_a_store_that_comes_back_is_waited_for_as_the_core_says() -> None:
    clock = VirtualClock()
    failures = iter([StoreError("down")] * 3)
    heard: list[tuple[int, float]] = []

    async def write() -> str:
        error = next(failures, None)
        if error is not None:
            raise error
        return "written"

    async def main() -> str:
        return await patiently(write, patience=30.0, now=clock.now,
                               failed=lambda tries, exc: heard.append((tries, clock.now())))

    start = clock.now()
    assert clock.run(main()) == "written"
    assert [t for t, _ in heard] == [1, 2, 3]
    assert clock.now() - start == pytest.approx(0.2 + 0.4 + 0.8)


def test_patience_runs_out_and_other_errors_are_raised_at_once() -> None:
    clock = VirtualClock()
    calls = 0

    async def down() -> None:
        nonlocal calls
        calls += 1
        raise StoreError("still down")

    async def main() -> None:
        await patiently(down, patience=12.0, now=clock.now,
                        retry_if=lambda exc: isinstance(exc, StoreError))

    with pytest.raises(StoreError, match="still down"):
        clock.run(main())
    assert calls == 8  # tried at 0, 0.2, 0.6, 1.4, 3.0, 6.2, 11.2 and 16.2 s: past 12 s

    async def broken() -> None:
        nonlocal calls
        calls += 1
        raise ValueError("not a store error")

    async def once() -> None:
        await patiently(broken, patience=12.0, now=clock.now,
                        retry_if=lambda exc: isinstance(exc, StoreError))

    calls = 0
    with pytest.raises(ValueError):
        clock.run(once())
    assert calls == 1  # not retried
