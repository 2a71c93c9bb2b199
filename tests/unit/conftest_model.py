"""Helpers for tests of the model client: a scripted OpenAI server on respx, wire bodies.

Imported explicitly (``from conftest_model import ...``); nothing here is a fixture.
Every mock is ``respx.mock(using="httpcore2", assert_all_mocked=True)``: the ``openai``
SDK sends through httpx2/httpcore2, and a request no route matches raises instead of
leaving the machine.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import httpx
import pytest_httpx2  # noqa: F401  (registers respx's "httpcore2" mocker)
import respx

from planrun.model import Model, RetryPolicy
from planrun.runtime._clock import VirtualClock

T = TypeVar("T")

BASE_URL = "https://api.test/v1"
API_KEY = "sk-proj-Zx81QmT4vLp0Rk7Ws2Nd9Hf3Yb6Gc5Je1Ua8Oi4Xt2Kq7Ve0Pm3Ls9Dr5Cw1By6Nh"
MODEL = "gpt-4o-mini"
SNAPSHOT = "gpt-4o-mini-2024-07-18"


def chat_completion(
    content: str | None = "ok",
    *,
    model: str = SNAPSHOT,
    finish_reason: str = "stop",
    refusal: str | None = None,
    prompt_tokens: int = 12,
    completion_tokens: int = 5,
    cached_tokens: int = 0,
    completion_id: str = "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
) -> dict[str, Any]:
    """A chat.completions response body, exactly as the API sends it."""
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": 1741569952,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": content,
                    "refusal": refusal,
                    "annotations": [],
                },
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        },
        "service_tier": "default",
        "system_fingerprint": "fp_06737a9306",
    }


def ok(content: str | None = "ok", *, request_id: str = "req_ok", **kwargs: Any) -> httpx.Response:
    """A 200 response carrying :func:`chat_completion`."""
    return httpx.Response(
        200, json=chat_completion(content, **kwargs), headers={"x-request-id": request_id}
    )


def error(
    status: int,
    message: str = "error",
    *,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    """An error response with the API's error body."""
    body = {"error": {"message": message, "type": type, "param": param, "code": code}}
    return httpx.Response(status, json=body, headers={"x-request-id": "req_err", **(headers or {})})


Item = httpx.Response | BaseException | Callable[[httpx.Request], Coroutine[Any, Any, Any]]


class Server:
    """A scripted ``/chat/completions``: answers in order (the last answer repeats).

    Records each request and the loop time it arrived at. An item may be a response, an
    exception to raise (a transport failure), or an async function of the request.
    """

    def __init__(self, *script: Item) -> None:
        self.script = list(script)
        self.requests: list[httpx.Request] = []
        self.times: list[float] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.times.append(asyncio.get_running_loop().time())
        self.requests.append(request)
        item = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, httpx.Response):
            return httpx.Response(item.status_code, headers=item.headers, content=item.content)
        result = await item(request)
        assert isinstance(result, httpx.Response)
        return result

    @property
    def bodies(self) -> list[dict[str, Any]]:
        """The JSON bodies of the requests received."""
        return [json.loads(r.content) for r in self.requests]

    @property
    def gaps(self) -> list[float]:
        """Seconds between consecutive requests."""
        return [b - a for a, b in zip(self.times, self.times[1:], strict=False)]


def mock_api(server: Server) -> respx.MockRouter:
    """A respx router serving ``server`` on ``POST /chat/completions``; all else raises."""
    router = respx.mock(
        using="httpcore2", base_url=BASE_URL, assert_all_mocked=True, assert_all_called=False
    )
    router.post("/chat/completions").mock(side_effect=server)
    return router


def make_model(**kwargs: Any) -> Model:
    """A Model against the mock API, with jitter off so waits are exact."""
    kwargs.setdefault("api_key", API_KEY)
    kwargs.setdefault("base_url", BASE_URL)
    kwargs.setdefault("retry", RetryPolicy(jitter=0.0))
    kwargs.setdefault("model", MODEL)
    return Model(**kwargs)


def run(coro: Coroutine[Any, Any, T], clock: VirtualClock | None = None) -> T:
    """Run ``coro`` under virtual time (a fresh clock at 0 unless one is given)."""
    return (clock or VirtualClock()).run(coro)
