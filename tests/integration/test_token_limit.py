"""A token limit configured at twice the provider's: the provider's headers correct it
within a few calls, and nothing is lost (the real SDK against the stand-in over HTTP)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from planrun import Model, RetryPolicy
from planrun.model import OutputTruncated, RateLimiter, Usage, output_bound

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


def test_the_bound_goes_on_the_wire_and_a_reply_cut_at_it_is_counted() -> None:
    cut = {"id": "chatcmpl-cut", "object": "chat.completion", "created": 1741569952,
           "model": "gpt-4o-mini-2024-07-18",
           "choices": [{"index": 0, "finish_reason": "length", "logprobs": None,
                        "message": {"role": "assistant", "content": '{"wo', "refusal": None}}],
           "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}}
    fake = FakeOpenAI({"Word": lambda req: {"word": "ok"}})
    raw = [(200, {"content-type": "application/json"}, json.dumps(cut).encode())]
    meter = Usage()
    with StandIn(fake, raw=raw) as server:
        model = Model("gpt-4o-mini", api_key="sk-standin-token-limit-000000",
                      base_url=server.base_url, meter=meter)

        async def main() -> Word:
            try:
                with pytest.raises(OutputTruncated, match="output bound of 3 tokens"):
                    await model.complete("a word", result_model=Word, max_tokens=3)
                reply = await model.complete("a word", result_model=Word)
                assert isinstance(reply.parsed, Word)
                return reply.parsed
            finally:
                await model.aclose()

        assert asyncio.run(main()) == Word(word="ok")
    (sent,) = fake.requests  # the cut reply came first, from the raw answers
    assert sent.body["max_completion_tokens"] == output_bound(Word.model_json_schema())
    assert [r.error for r in meter.records] == ["OutputTruncated", None]
    assert meter.records[0].completion_tokens == 3
