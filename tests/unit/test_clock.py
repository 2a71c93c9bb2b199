"""Virtual time runs real asyncio code without waiting."""

from __future__ import annotations

import asyncio
import time

import pytest

from planrun.core._errors import UsageError
from planrun.runtime._clock import RealClock, VirtualClock, run_virtual


def test_virtual_sleep_is_instant_and_exact() -> None:
    clock = VirtualClock()

    async def main() -> list[float]:
        loop = asyncio.get_running_loop()

        async def nap(d: float) -> float:
            await asyncio.sleep(d)
            return loop.time()

        return await asyncio.gather(nap(3600), nap(5), nap(60))

    started = time.perf_counter()
    assert clock.run(main()) == [3600.0, 5.0, 60.0]
    assert time.perf_counter() - started < 5  # an hour of virtual time, no real hour
    assert clock.now() == 3600.0


def test_virtual_timeouts_fire_at_their_virtual_deadline() -> None:
    async def main() -> float:
        with pytest.raises((TimeoutError, asyncio.TimeoutError)):
            await asyncio.wait_for(asyncio.sleep(100), 7)
        return asyncio.get_running_loop().time()

    assert run_virtual(main(), start=10.0) == 17.0


def test_threads_take_no_virtual_time() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        timer = asyncio.ensure_future(asyncio.sleep(1000))
        await asyncio.to_thread(time.sleep, 0.05)
        timer.cancel()
        return loop.time()

    assert run_virtual(main()) == 0.0


def test_real_clock_is_wall_time() -> None:
    assert abs(RealClock().now() - time.time()) < 1
    RealClock().check_loop()


async def test_virtual_clock_refuses_a_foreign_loop() -> None:
    with pytest.raises(UsageError):
        VirtualClock().check_loop()


def test_run_blocking_errors_do_not_carry_the_loop_probe() -> None:
    from planrun.runtime._clock import RealClock, run_blocking

    async def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom") as caught:
        run_blocking(RealClock(), fail)
    assert caught.value.__context__ is None  # not "RuntimeError: no running event loop"
