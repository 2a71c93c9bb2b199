"""A token limit configured at twice the provider's: the provider's headers correct it
within a few calls, and nothing is lost (the real SDK against the stand-in over HTTP)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from pydantic import BaseModel

from planrun import Model, RateLimiter, RetryPolicy

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tools"))
from standin import StandIn  # noqa: E402

from planrun.dev.testing import FakeOpenAI  # noqa: E402


class Word(BaseModel):
    word: str


def test_a_limit_set_twice_too_high_is_corrected_by_the_headers() -> None:
    tpm, calls = 30_000, 40  # 500 tokens a second; each call about 70 (a bound of 50)
    fake = FakeOpenAI({"Word": lambda req: {"word": "ok"}})
    with StandIn(fake, tpm_limit=tpm) as server:
        limiter = RateLimiter(tokens_per_minute=2 * tpm)
        model = Model("gpt-4o-mini", api_key="sk-standin-token-limit-000000",
                      base_url=server.base_url, limiter=limiter, max_tokens=50,
                      retry=RetryPolicy(attempts=8, base=0.05, cap=1.0))

        async def main() -> list[Word]:
            gate = asyncio.Semaphore(8)

            async def one(i: int) -> Word:
                async with gate:
                    reply = await model.complete(f"say a word, {i}", result_model=Word)
                    assert isinstance(reply.parsed, Word)
                    return reply.parsed

            try:
                return await asyncio.gather(*(one(i) for i in range(calls)))
            finally:
                await model.aclose()

        words = asyncio.run(main())
        admitted, limited = list(server.admitted), list(server.limited_at)
    assert len(words) == calls and len(admitted) == calls  # nothing lost
    assert limiter.tokens_per_minute == tpm  # the provider's limit replaced the setting
    # The first second's burst at twice the rate meets 429s; once the first answers are
    # read, none: every 429 came before the tenth request the server let through.
    assert len(limited) <= 10, len(limited)
    assert all(t <= admitted[9] for t in limited), (limited, admitted[:10])
