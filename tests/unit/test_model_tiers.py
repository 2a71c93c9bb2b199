"""The tier on the wire (planrun.model._tiers): a flex refusal told apart from a rate limit,
a rejected tier dropped, the fallback to the default tier when the slack runs out."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

import httpx2
import openai
import pytest

from planrun.core.scheduling import RetryPolicy, TierChoice
from planrun.model import FLEX_REFUSED_CODE, FlexRefused
from planrun.model._tiers import TierRejected, Tiers, send_at_tier, tier_refusal


def _error(status: int, code: str | None, message: str = "no",
           param: str | None = None) -> openai.APIStatusError:
    body = {"message": message, "type": "invalid_request_error", "code": code, "param": param}
    request = httpx2.Request("POST", "https://api.test/v1/chat/completions")
    response = httpx2.Response(status, json={"error": body}, request=request)
    kind = openai.RateLimitError if status == 429 else openai.BadRequestError
    return kind(message, response=response, body=body)


def test_a_flex_refusal_is_no_rate_limit_and_a_rejected_tier_is_told_apart() -> None:
    assert isinstance(tier_refusal(_error(429, FLEX_REFUSED_CODE)), FlexRefused)
    assert tier_refusal(_error(429, "rate_limit_exceeded")) is None
    assert isinstance(tier_refusal(_error(400, "invalid_value", param="service_tier")),
                      TierRejected)
    assert isinstance(tier_refusal(_error(400, None, "service_tier 'flex' is not available")),
                      TierRejected)
    assert tier_refusal(_error(400, None, "bad response_format", "response_format")) is None
    assert tier_refusal(ValueError("x")) is None


def test_a_rejected_tier_is_not_sent_again_and_is_named_once(
        caplog: pytest.LogCaptureFixture) -> None:
    tiers = Tiers()
    assert tiers.wire("flex") == "flex"
    with caplog.at_level(logging.WARNING, logger="planrun.model"):
        tiers.reject("flex", "gpt-4o-mini", "http://x/v1")
        tiers.reject("flex", "gpt-4o-mini", "http://x/v1")
    assert len(caplog.records) == 1 and "'flex'" in caplog.records[0].getMessage()
    assert tiers.wire("flex") == "default" and tiers.wire("priority") == "priority"
    tiers.reject("default", "gpt-4o-mini", "http://x/v1")
    assert tiers.wire("flex") is None and tiers.wire("default") is None  # sent without one


def _sender(refusals: int) -> tuple[list[str], Any]:
    sent: list[str] = []

    async def send(params: dict[str, Any], tier: str) -> str:
        sent.append(params.get("service_tier", "-"))
        if params.get("service_tier") == "flex" and len(sent) <= refusals:
            raise FlexRefused("no room")
        return tier

    return sent, send


FAST = RetryPolicy(attempts=4, base=0.01, cap=0.01, jitter=0.0)


def test_flex_is_tried_again_while_the_slack_lasts() -> None:
    sent, send = _sender(refusals=2)
    served = asyncio.run(send_at_tier(TierChoice("flex", 10.0, 1.0), {}, send, Tiers(), FAST,
                                      random.Random(0), model="m", base_url="u"))
    assert served == "flex" and sent == ["flex", "flex", "flex"]


def test_without_slack_left_a_refused_flex_call_goes_at_the_default_tier_at_once() -> None:
    sent, send = _sender(refusals=5)
    served = asyncio.run(send_at_tier(TierChoice("flex", 0.5, 0.0), {}, send, Tiers(), FAST,
                                      random.Random(0), model="m", base_url="u"))
    assert served == "default" and sent == ["flex", "default"]


def test_a_rejected_tier_is_dropped_and_the_call_sent_again() -> None:
    sent: list[str] = []

    async def send(params: dict[str, Any], tier: str) -> str:
        sent.append(params.get("service_tier", "-"))
        if params.get("service_tier") == "priority":
            raise TierRejected("no priority here")
        return tier

    tiers = Tiers()
    served = asyncio.run(send_at_tier(TierChoice("priority", -1.0), {"model": "m"}, send,
                                      tiers, FAST, random.Random(0), model="m", base_url="u"))
    assert served == "default" and sent == ["priority", "default"]
    assert tiers.wire("priority") == "default"
