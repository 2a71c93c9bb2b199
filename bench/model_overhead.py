"""planrun's per-call overhead over a bare AsyncOpenAI call, and the limiter's achieved rate.

    python bench/model_overhead.py --quick     # 300 calls per side
    python bench/model_overhead.py             # 2,000 calls per side, best of three

Both sides are served by the same in-process fake of ``/chat/completions`` (the same reply,
through httpx2's ``MockTransport``: :func:`planrun.testing.answered_by`), so the difference
is planrun's own work: structured-output schema, parsing and validation into the result
model, the usage meter and budget check, the retry wrapper, and the shared rate limiter
(configured high enough never to wait).

The limiter part runs 40 concurrent callers through one ``RateLimiter`` in virtual time
and reports the achieved request rate against the configured one.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import openai
from pydantic import BaseModel

from planrun.dev.testing import FakeOpenAI
from planrun.model import Model
from planrun.model._limiter import RateLimiter
from planrun.model._usage import Budget, Usage
from planrun.runtime._clock import VirtualClock
from planrun.testing import answered_by

sys.path.insert(0, str(Path(__file__).resolve().parent))

BASE = "https://bench.invalid/v1"
KEY = "sk-bench-not-a-real-key-000000000000"


class Label(BaseModel):
    category: str
    urgency: str
    needs_human: bool


def _fake() -> FakeOpenAI:
    return FakeOpenAI({"label": {"category": "billing", "urgency": "high", "needs_human": False},
                       "text": '{"category": "billing", "urgency": "high", '
                               '"needs_human": false}'})


async def bare(n: int) -> float:
    client = openai.AsyncOpenAI(api_key=KEY, base_url=BASE, max_retries=0)
    messages = [{"role": "user", "content": "Label: my card was charged twice"}]
    started = time.perf_counter()
    for _ in range(n):
        reply = await client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        assert reply.choices[0].message.content
    elapsed = time.perf_counter() - started
    await client.close()
    return elapsed


async def planrun_calls(n: int) -> float:
    limiter = RateLimiter(requests_per_minute=10_000_000, tokens_per_minute=10_000_000_000)
    meter = Usage(budget=Budget(max_tokens=10**12))
    model = Model("gpt-4o-mini", api_key=KEY, base_url=BASE, limiter=limiter, meter=meter)
    started = time.perf_counter()
    for _ in range(n):
        done = await model.complete("Label: my card was charged twice", result_model=Label,
                                    schema_name="label")
        assert done.parsed is not None
    elapsed = time.perf_counter() - started
    await model.aclose()
    assert meter.total.requests == n
    return elapsed


def timed(fn: object, n: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        with answered_by(_fake()):
            best = min(best, asyncio.run(fn(n)))  # type: ignore[operator]
    return best


async def limiter_rate(configured_rpm: float, callers: int, requests: int) -> float:
    limiter = RateLimiter(requests_per_minute=configured_rpm)
    loop = asyncio.get_running_loop()
    stamps: list[float] = []
    queue = list(range(requests))

    async def caller() -> None:
        while queue:
            queue.pop()
            await limiter.acquire()
            stamps.append(loop.time())
            await asyncio.sleep(0.5)  # the request itself

    await asyncio.gather(*(caller() for _ in range(callers)))
    span = max(stamps) - min(stamps)
    return (len(stamps) - 1) / span * 60 if span else float("inf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n, rounds = (300, 1) if args.quick else (2000, 3)
    base = timed(bare, n, rounds) / n * 1e6
    ours = timed(planrun_calls, n, rounds) / n * 1e6
    print(f"calls per side: {n}, best of {rounds}")
    print(f"bare AsyncOpenAI        {base:9.1f} us/call")
    print(f"planrun Model.complete  {ours:9.1f} us/call   ratio {ours / base:.2f}  "
          f"overhead {ours - base:.1f} us/call")
    configured = 600.0
    achieved = VirtualClock().run(limiter_rate(configured, callers=40, requests=400))
    print(f"limiter: 40 callers, configured {configured:.0f} rpm, achieved {achieved:.1f} rpm "
          f"({achieved / configured:.3f} of configured, virtual time)")


if __name__ == "__main__":
    main()
