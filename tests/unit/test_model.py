"""planrun.model: the chat client, driven through HTTP-level mocks under virtual time."""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import enum
import json
import logging
import random
import time
import traceback
from typing import Any, Literal

import httpx
import httpx2
import openai
import pytest
import respx
from conftest_model import (
    API_KEY,
    BASE_URL,
    MODEL,
    SNAPSHOT,
    Server,
    error,
    make_model,
    mock_api,
    ok,
    run,
)
from pydantic import AnyUrl, BaseModel, Field

from planrun.core._errors import (
    BudgetExceeded,
    ConfigError,
    ModelRefused,
    PermanentError,
    RateLimited,
    TransientError,
    UsageError,
)
from planrun.model import (
    Completion,
    Model,
    RetryPolicy,
    portable_schema,
    rejects_schema,
    retry_after_seconds,
    strict_schema,
    translate_error,
)
from planrun.model._limiter import RateLimiter
from planrun.model._prompts import RenderedPrompt, prompt_hash
from planrun.model._usage import Budget, Usage
from planrun.runtime._clock import VirtualClock


class Label(BaseModel):
    """A ticket's label."""

    category: str
    urgency: str = "normal"
    confidence: float = Field(ge=0, le=1)


class Color(enum.Enum):
    red = "red"
    blue = "blue"


class Step(BaseModel):
    kind: str
    payload: dict[str, Any]


PLAN_SCHEMA: dict[str, Any] = {
    "title": "plan",
    "type": "object",
    "properties": {
        "goal": {"type": "string"},
        "tasks": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "kind": {"type": "string", "enum": ["migrate_db", "deploy_app"]},
                    "payload": {"type": "object"},
                    "depends_on": {"type": "array", "items": {"type": "integer"}},
                },
                "required": ["kind", "payload", "depends_on"],
            },
        },
    },
    "required": ["goal", "tasks"],
}

LABEL_JSON = json.dumps({"category": "billing", "urgency": "high", "confidence": 0.9})


# ---------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------


def test_missing_api_key_is_a_config_error_at_construction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        Model()


def test_environment_is_read_once_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", BASE_URL)
    monkeypatch.setenv("PLANRUN_MODEL", "gpt-4.1-mini")
    model = Model(retry=1)
    monkeypatch.setenv("PLANRUN_MODEL", "other")
    monkeypatch.setenv("OPENAI_BASE_URL", "https://elsewhere.test/v1")
    monkeypatch.delenv("OPENAI_API_KEY")
    server = Server(ok())
    with mock_api(server):
        run(model.complete("hi"))
    assert model.model == "gpt-4.1-mini"
    assert server.bodies[0]["model"] == "gpt-4.1-mini"
    assert server.requests[0].headers["authorization"] == f"Bearer {API_KEY}"


def test_arguments_win_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANRUN_MODEL", "gpt-4.1")
    model = make_model(model="gpt-5-mini")
    assert model.model == "gpt-5-mini"
    assert model.base_url.rstrip("/") == BASE_URL


def test_default_model_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PLANRUN_MODEL", raising=False)
    assert Model(api_key=API_KEY).model == "gpt-4o-mini"


def test_bad_structured_option_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="structured"):
        make_model(structured="xml")


def test_injected_client_has_sdk_retries_switched_off() -> None:
    client = openai.AsyncOpenAI(api_key=API_KEY, base_url=BASE_URL, max_retries=5)
    model = Model(client=client, retry=1)
    server = Server(error(500, "boom", type="server_error"))
    with mock_api(server), pytest.raises(TransientError):
        run(model.complete("hi"))
    assert len(server.requests) == 1


@pytest.mark.parametrize("attempts", [1, 2, 4])
def test_only_planruns_policy_retries(attempts: int) -> None:
    server = Server(error(503, "overloaded", type="server_error"))
    with mock_api(server), pytest.raises(TransientError):
        run(make_model(retry=attempts).complete("hi"))
    assert len(server.requests) == attempts


# ---------------------------------------------------------------------------------------------
# plain and structured completions
# ---------------------------------------------------------------------------------------------


def test_text_completion() -> None:
    server = Server(ok("Hello there", request_id="req_123"))
    with mock_api(server):
        result = run(make_model().complete("Say hello", prompt_hash="abc"))
    assert isinstance(result, Completion)
    assert result.text == "Hello there"
    assert result.parsed is None
    assert result.mode == "text"
    assert result.model == SNAPSHOT
    assert result.finish_reason == "stop"
    assert result.request_id == "req_123"
    assert result.prompt_hash == "abc"
    assert result.attempts == 1
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (12, 5)
    body = server.bodies[0]
    assert body["messages"] == [{"role": "user", "content": "Say hello"}]
    assert body["model"] == MODEL
    assert "response_format" not in body


def test_structured_output_is_requested_strict_and_parsed() -> None:
    server = Server(ok(LABEL_JSON))
    with mock_api(server):
        result = run(make_model().complete("label it", result_model=Label))
    assert result.parsed == Label(category="billing", urgency="high", confidence=0.9)
    assert result.mode == "json_schema"
    assert not result.fell_back
    response_format = server.bodies[0]["response_format"]
    assert response_format == {
        "type": "json_schema",
        "json_schema": {"name": "Label", "strict": True, "schema": strict_schema(Label).schema},
    }


def test_optional_field_sent_as_null_takes_its_default() -> None:
    reply = json.dumps({"category": "bug", "urgency": None, "confidence": 0.5})
    with mock_api(Server(ok(reply))):
        result = run(make_model().complete("label", result_model=Label))
    assert result.parsed == Label(category="bug", confidence=0.5)


def test_free_form_field_travels_as_json_text_and_comes_back_decoded() -> None:
    reply = json.dumps({"kind": "migrate_db", "payload": json.dumps({"table": "users"})})
    server = Server(ok(reply))
    with mock_api(server):
        result = run(make_model().complete("plan", result_model=Step))
    assert result.parsed == Step(kind="migrate_db", payload={"table": "users"})
    sent = server.bodies[0]["response_format"]["json_schema"]["schema"]
    assert sent["properties"]["payload"]["type"] == "string"


def test_raw_json_schema_returns_parsed_json() -> None:
    plan = {
        "goal": "ship v2",
        "tasks": [
            {"kind": "migrate_db", "payload": json.dumps({"version": 2}), "depends_on": []},
            {"kind": "deploy_app", "payload": "{}", "depends_on": [0]},
        ],
    }
    server = Server(ok(json.dumps(plan)))
    with mock_api(server):
        result = run(make_model().complete("plan it", result_model=PLAN_SCHEMA))
    assert result.parsed == {
        "goal": "ship v2",
        "tasks": [
            {"kind": "migrate_db", "payload": {"version": 2}, "depends_on": []},
            {"kind": "deploy_app", "payload": {}, "depends_on": [0]},
        ],
    }
    sent = server.bodies[0]["response_format"]["json_schema"]
    assert sent["name"] == "plan"
    assert sent["strict"] is True


def test_raw_schema_violation_is_permanent_with_every_problem() -> None:
    bad = {"goal": 3, "tasks": [{"kind": "nope", "payload": "{}", "depends_on": []}]}
    server = Server(ok(json.dumps(bad)))
    with mock_api(server), pytest.raises(PermanentError) as caught:
        run(make_model().complete("plan", result_model=PLAN_SCHEMA))
    assert "goal: 3 is not of type 'string'" in str(caught.value)
    assert "tasks/0/kind" in str(caught.value)
    assert len(server.requests) == 1


def test_reply_failing_the_model_is_permanent_with_the_validation_message() -> None:
    reply = json.dumps({"category": "billing", "urgency": "low", "confidence": 7})
    server = Server(ok(reply))
    with mock_api(server), pytest.raises(PermanentError) as caught:
        run(make_model(retry=4).complete("label", result_model=Label))
    assert "does not match Label" in str(caught.value)
    assert "confidence" in str(caught.value)
    assert "less than or equal to 1" in str(caught.value)
    assert len(server.requests) == 1


def test_reply_that_is_not_json_is_permanent() -> None:
    with mock_api(Server(ok("Sure! Here it is:"))), pytest.raises(PermanentError, match="JSON"):
        run(make_model().complete("label", result_model=Label))


def test_validate_false_hands_back_the_raw_json() -> None:
    reply = json.dumps({"goal": 3, "tasks": []})
    with mock_api(Server(ok(reply), ok("not json"))):
        first = run(make_model().complete("plan", result_model=PLAN_SCHEMA, validate=False))
        second = run(make_model().complete("plan", result_model=PLAN_SCHEMA, validate=False))
    assert first.parsed == {"goal": 3, "tasks": []}
    assert second.parsed is None
    assert second.text == "not json"


def test_schema_name_is_sanitised() -> None:
    server = Server(ok(LABEL_JSON))
    with mock_api(server):
        run(make_model().complete("x", result_model=Label, schema_name="my label/v2"))
    assert server.bodies[0]["response_format"]["json_schema"]["name"] == "my_label_v2"


def test_messages_forms() -> None:
    prompt = RenderedPrompt("p", "rendered text", prompt_hash("p", "rendered text"))
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    server = Server(ok())
    with mock_api(server):
        from_prompt = run(make_model().complete(prompt))
        run(make_model().complete(chat))
    assert from_prompt.prompt_hash == prompt.hash
    assert server.bodies[0]["messages"] == [{"role": "user", "content": "rendered text"}]
    assert server.bodies[1]["messages"] == chat
    with pytest.raises(UsageError):
        run(make_model().complete([]))


def test_max_tokens_and_temperature_are_sent() -> None:
    server = Server(ok())
    with mock_api(server):
        run(make_model(max_tokens=50, temperature=0.2).complete("a"))
        run(make_model().complete("b", max_tokens=7, temperature=0.0))
    assert server.bodies[0]["max_completion_tokens"] == 50
    assert server.bodies[0]["temperature"] == 0.2
    assert server.bodies[1]["max_completion_tokens"] == 7
    assert server.bodies[1]["temperature"] == 0.0


# ---------------------------------------------------------------------------------------------
# JSON-mode fallback
# ---------------------------------------------------------------------------------------------

REJECT_SCHEMA = error(
    400,
    "Invalid parameter: 'response_format' of type 'json_schema' is not supported with this model.",
    param="response_format",
)


def test_rejected_json_schema_falls_back_to_json_mode_and_remembers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = Server(REJECT_SCHEMA, ok(LABEL_JSON))
    meter = Usage()

    async def main() -> tuple[Completion[Label], Completion[Label]]:
        model = make_model(meter=meter)
        first = await model.complete("label", result_model=Label)
        assert not model.json_schema_supported
        second = await model.complete("label", result_model=Label)
        return first, second

    with caplog.at_level(logging.WARNING, logger="planrun.model"), mock_api(server):
        first, second = run(main())
    assert (
        first.parsed == second.parsed == Label(category="billing", urgency="high", confidence=0.9)
    )
    assert first.fell_back and first.mode == "json_mode" and first.attempts == 2
    assert second.mode == "json_mode" and not second.fell_back and second.attempts == 1
    formats = [b["response_format"]["type"] for b in server.bodies]
    assert formats == ["json_schema", "json_object", "json_object"]
    instructions = server.bodies[1]["messages"][0]
    assert instructions["role"] == "system"
    assert "JSON" in instructions["content"] and '"confidence"' in instructions["content"]
    assert any("JSON mode" in r.getMessage() for r in caplog.records)
    assert meter.total.requests == 3


def test_json_mode_reply_is_validated_locally() -> None:
    bad = json.dumps({"category": "billing"})
    with mock_api(Server(REJECT_SCHEMA, ok(bad))), pytest.raises(PermanentError, match="Label"):
        run(make_model().complete("label", result_model=Label))


def test_json_mode_with_a_wrapped_root() -> None:
    reply = json.dumps({"value": [1, 2, 3]})
    schema = {"type": "array", "items": {"type": "integer"}}
    with mock_api(Server(REJECT_SCHEMA, ok(reply))):
        result = run(make_model().complete("numbers", result_model=schema))
    assert result.parsed == [1, 2, 3]


def test_structured_json_schema_never_falls_back() -> None:
    server = Server(REJECT_SCHEMA)
    with mock_api(server), pytest.raises(PermanentError, match="response_format"):
        run(make_model(structured="json_schema").complete("label", result_model=Label))
    assert len(server.requests) == 1


def test_structured_json_mode_uses_json_object_from_the_start() -> None:
    server = Server(ok(LABEL_JSON))
    with mock_api(server):
        result = run(make_model(structured="json_mode").complete("x", result_model=Label))
    assert result.mode == "json_mode" and not result.fell_back
    sent = server.bodies[0]["response_format"]
    assert sent == {"type": "json_object", "schema": Label.model_json_schema()}
    assert '"confidence"' in server.bodies[0]["messages"][0]["content"]


def test_other_bad_requests_do_not_trigger_the_fallback() -> None:
    server = Server(error(400, "'messages' must contain the word 'json'", param="messages"))
    with mock_api(server), pytest.raises(PermanentError):
        run(make_model().complete("x", result_model=Label))
    assert len(server.requests) == 1


# ---------------------------------------------------------------------------------------------
# retries
# ---------------------------------------------------------------------------------------------

TRANSIENT_STATUSES = [
    (408, "Request timed out.", "timeout"),
    (409, "Conflict with a concurrent request.", "conflict"),
    (429, "Rate limit reached for gpt-4o-mini.", "requests"),
    (500, "The server had an error while processing your request.", "server_error"),
    (502, "Bad gateway.", "server_error"),
    (503, "The engine is currently overloaded.", "server_error"),
    (504, "Gateway timeout.", "server_error"),
]


@pytest.mark.parametrize(("status", "message", "kind"), TRANSIENT_STATUSES)
def test_transient_status_is_retried_with_exponential_backoff(
    status: int, message: str, kind: str
) -> None:
    server = Server(error(status, message, type=kind), error(status, message, type=kind), ok())
    clock = VirtualClock()
    with mock_api(server):
        result = run(make_model(retry=RetryPolicy(base=0.5, jitter=0)).complete("x"), clock)
    assert result.text == "ok"
    assert result.attempts == 3
    assert server.gaps == [0.5, 1.0]
    assert clock.now() == 1.5


@pytest.mark.parametrize(
    "failure",
    [httpx.ReadTimeout("read timed out"), httpx.ConnectError("connection refused")],
    ids=["timeout", "connection-error"],
)
def test_transport_failures_are_retried(failure: Exception) -> None:
    server = Server(failure, ok())
    with mock_api(server):
        result = run(make_model().complete("x"))
    assert result.attempts == 2
    assert server.gaps == [0.5]


def test_backoff_is_capped() -> None:
    server = Server(error(500, "boom", type="server_error"))
    policy = RetryPolicy(attempts=6, base=1.0, cap=3.0, jitter=0)
    with mock_api(server), pytest.raises(TransientError):
        run(make_model(retry=policy).complete("x"))
    assert server.gaps == [1.0, 2.0, 3.0, 3.0, 3.0]


def test_jitter_stays_within_its_band() -> None:
    server = Server(error(500, "boom", type="server_error"))
    policy = RetryPolicy(attempts=8, base=1.0, cap=100.0, jitter=0.5)
    with mock_api(server), pytest.raises(TransientError):
        run(make_model(retry=policy, rng=random.Random(7)).complete("x"))
    for n, gap in enumerate(server.gaps, start=1):
        full = 2.0 ** (n - 1)
        assert full / 2 <= gap <= full
    assert len(set(server.gaps)) == len(server.gaps)


def test_exhausted_retries_raise_the_last_transient_error() -> None:
    server = Server(error(502, "Bad gateway.", type="server_error"))
    with mock_api(server), pytest.raises(TransientError, match="HTTP 502") as caught:
        run(make_model(retry=3).complete("x"))
    assert isinstance(caught.value.__cause__, openai.InternalServerError)
    assert len(server.requests) == 3


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "7"}, 7.0),
        ({"retry-after-ms": "2500"}, 2.5),
        ({"retry-after-ms": "1200", "retry-after": "2"}, 1.2),
        ({"retry-after": "0.1"}, 0.5),  # the backoff is longer: Retry-After is a minimum
    ],
)
def test_retry_after_is_a_minimum_wait(headers: dict[str, str], expected: float) -> None:
    limited = error(429, "Rate limit reached.", type="requests", headers=headers)
    server = Server(limited, ok())
    clock = VirtualClock()
    with mock_api(server):
        run(make_model().complete("x"), clock)
    assert server.gaps == [pytest.approx(expected)]
    assert clock.now() == pytest.approx(expected)


def test_retry_after_as_http_date() -> None:
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    limited = error(503, "Service unavailable.", type="server_error", headers={"retry-after": when})
    server = Server(limited, ok())
    with mock_api(server):
        run(make_model().complete("x"))
    assert 28.0 <= server.gaps[0] <= 30.5


def test_a_very_long_retry_after_is_left_to_the_caller() -> None:
    limited = error(429, "Rate limit reached.", type="requests", headers={"retry-after": "600"})
    server = Server(limited, ok())
    with mock_api(server), pytest.raises(RateLimited) as caught:
        run(make_model(retry=RetryPolicy(max_retry_after=120)).complete("x"))
    assert caught.value.retry_after == 600.0
    assert len(server.requests) == 1


def test_per_call_timeout_is_transient_and_retried() -> None:
    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(30)
        return ok()

    server = Server(slow, ok())
    clock = VirtualClock()
    with mock_api(server):
        result = run(make_model().complete("x", timeout=5), clock)
    assert result.attempts == 2
    assert server.gaps == [5.5]  # 5 s timeout, then 0.5 s backoff


def test_default_timeout_from_the_model() -> None:
    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(100)
        return ok()

    clock = VirtualClock()
    with mock_api(Server(slow)), pytest.raises(TransientError, match="timed out"):
        run(make_model(timeout=2.0, retry=1).complete("x"), clock)
    assert clock.now() == pytest.approx(2.0)


PERMANENT = [
    (400, "Invalid value for 'temperature'.", "invalid_request_error", None),
    (401, "Incorrect API key provided: sk-proj-****abcd.", "invalid_request_error", None),
    (403, "Project does not have access to model.", "invalid_request_error", None),
    (404, "The model 'gpt-9' does not exist.", "invalid_request_error", "model_not_found"),
    (422, "Unprocessable entity.", "invalid_request_error", None),
    (
        400,
        "This model's maximum context length is 128000 tokens.",
        "invalid_request_error",
        "context_length_exceeded",
    ),
    (429, "You exceeded your current quota.", "insufficient_quota", "insufficient_quota"),
]


@pytest.mark.parametrize(("status", "message", "kind", "code"), PERMANENT)
def test_permanent_status_fails_after_exactly_one_request(
    status: int, message: str, kind: str, code: str | None
) -> None:
    server = Server(error(status, message, type=kind, code=code), ok())
    with mock_api(server), pytest.raises(PermanentError) as caught:
        run(make_model(retry=4).complete("x"))
    assert len(server.requests) == 1
    assert f"HTTP {status}" in str(caught.value)
    assert isinstance(caught.value.__cause__, openai.APIStatusError)


def test_idempotency_key_is_sent_on_every_attempt() -> None:
    server = Server(error(500, "boom", type="server_error"), ok())
    with mock_api(server):
        run(make_model().complete("x", idempotency_key="planrun-abc"))
    assert [r.headers["idempotency-key"] for r in server.requests] == ["planrun-abc"] * 2


def test_no_idempotency_header_without_a_key() -> None:
    server = Server(ok())
    with mock_api(server):
        run(make_model().complete("x"))
    assert "idempotency-key" not in server.requests[0].headers


# ---------------------------------------------------------------------------------------------
# translate_error and Retry-After parsing
# ---------------------------------------------------------------------------------------------


def _status_exc(
    status: int, code: str | None = None, headers: dict[str, str] | None = None
) -> openai.APIStatusError:
    request = httpx2.Request("POST", f"{BASE_URL}/chat/completions")
    body = {"message": "m", "type": "t", "param": None, "code": code}
    response = httpx2.Response(status, json={"error": body}, headers=headers, request=request)
    return openai.APIStatusError(f"Error code: {status}", response=response, body=body)


@pytest.mark.parametrize(
    ("status", "code", "expected"),
    [
        (408, None, TransientError),
        (409, None, TransientError),
        (429, None, RateLimited),
        (500, None, TransientError),
        (529, None, TransientError),
        (400, None, PermanentError),
        (401, None, PermanentError),
        (403, None, PermanentError),
        (404, None, PermanentError),
        (422, None, PermanentError),
        (418, None, PermanentError),
        (400, "context_length_exceeded", PermanentError),
        (429, "insufficient_quota", PermanentError),
    ],
)
def test_translate_error_classes(status: int, code: str | None, expected: type) -> None:
    translated = translate_error(_status_exc(status, code))
    assert type(translated) is expected


def test_translate_error_transport_and_passthrough() -> None:
    request = httpx2.Request("POST", BASE_URL)
    timeout = translate_error(openai.APITimeoutError(request=request))
    connection = translate_error(openai.APIConnectionError(request=request))
    assert type(timeout) is TransientError and "timed out" in str(timeout)
    assert type(connection) is TransientError
    assert type(translate_error(asyncio.TimeoutError())) is TransientError
    refused = ModelRefused("no")
    assert translate_error(refused) is refused
    assert type(translate_error(ValueError("odd"))) is PermanentError


def test_translate_error_keeps_retry_after() -> None:
    limited = translate_error(_status_exc(429, headers={"retry-after": "3"}))
    assert isinstance(limited, RateLimited)
    assert limited.retry_after == 3.0


def test_retry_after_parsing() -> None:
    assert retry_after_seconds({}) is None
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds({"retry-after": "-4"}) == 0.0
    assert retry_after_seconds({"retry-after-ms": "x", "retry-after": "2"}) == 2.0
    date = email.utils.formatdate(1_000_100, usegmt=True)
    assert retry_after_seconds({"retry-after": date}, now=1_000_000) == 100.0


# ---------------------------------------------------------------------------------------------
# refusals and truncation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "match"),
    [
        (ok(None, refusal="I can't help with that."), "refused: I can't help with that"),
        (ok('{"category": "bil', finish_reason="length"), "cut off"),
        (ok(None, finish_reason="content_filter"), "content filter"),
    ],
    ids=["refusal", "length", "content_filter"],
)
def test_refusal_length_and_filter_are_model_refused(response: httpx.Response, match: str) -> None:
    server = Server(response)
    meter = Usage()
    with mock_api(server), pytest.raises(ModelRefused, match=match):
        run(make_model(meter=meter, retry=4).complete("x", result_model=Label))
    assert len(server.requests) == 1
    assert meter.total.total_tokens == 17  # tokens spent on a refusal still count


# ---------------------------------------------------------------------------------------------
# usage, cost and budget through the client
# ---------------------------------------------------------------------------------------------


def test_usage_and_cost_are_exact_and_keyed() -> None:
    usage = Usage()
    server = Server(
        ok(prompt_tokens=1000, completion_tokens=200, cached_tokens=400),
        error(500, "boom", type="server_error"),
        ok(prompt_tokens=300, completion_tokens=50),
    )
    prompt = RenderedPrompt("classify_ticket", "t", "0123456789abcdef")

    async def main() -> None:
        model = make_model(meter=usage)
        await model.complete("plan", meter=usage.scoped("decompose"))
        await model.complete(prompt, meter=usage.scoped("task-1", "worker-a"))

    with mock_api(server):
        run(main())
    total = usage.total
    assert (total.requests, total.prompt_tokens, total.completion_tokens) == (3, 1300, 250)
    assert total.cached_tokens == 400
    # gpt-4o-mini: $0.15 input, $0.075 cached input, $0.60 output per 1M tokens
    first = (600 * 0.15 + 400 * 0.075 + 200 * 0.60) / 1e6
    second = (300 * 0.15 + 50 * 0.60) / 1e6
    assert total.cost_usd == pytest.approx(first + second, rel=1e-12)
    assert usage["decompose"].total_tokens == 1200
    assert usage["decompose"].cost_usd == pytest.approx(first, rel=1e-12)
    assert usage["task-1"].requests == 2  # the failed attempt counts as a request
    assert usage["task-1"] == usage["worker-a"]
    assert usage["task-1"].total_tokens == 350
    failed, last = usage.records[1], usage.records[2]
    assert failed.error == "TransientError" and failed.total_tokens == 0
    assert last.prompt_hash == "0123456789abcdef"
    assert last.request_id == "req_ok"
    assert last.model == SNAPSHOT


def test_completion_usage_is_the_call_record() -> None:
    with mock_api(Server(ok(prompt_tokens=10, completion_tokens=2))):
        result = run(make_model().complete("x"))
    assert result.usage.total_tokens == 12
    assert result.usage.cost_usd == pytest.approx((10 * 0.15 + 2 * 0.60) / 1e6)


def test_token_budget_stops_the_call_before_any_request() -> None:
    server = Server(ok())
    usage = Usage(budget=Budget(max_tokens=100))
    with mock_api(server), pytest.raises(BudgetExceeded, match="token budget"):
        run(make_model(meter=usage).complete("x" * 600))
    assert server.requests == []
    assert usage.total.requests == 0


def test_budget_admits_until_spent() -> None:
    server = Server(ok(prompt_tokens=30, completion_tokens=20))
    usage = Usage(budget=Budget(max_tokens=200))

    async def main() -> None:
        model = make_model(meter=usage, max_tokens=20)
        for _ in range(10):
            await model.complete("hi")

    with mock_api(server), pytest.raises(BudgetExceeded):
        run(main())
    # each call is estimated at 9 prompt + 20 completion tokens and uses 50
    assert len(server.requests) == 4
    assert usage.total.total_tokens == 200


def test_cost_budget_stops_the_call() -> None:
    server = Server(ok())
    usage = Usage(budget=Budget(max_cost=0.000001))
    with mock_api(server), pytest.raises(BudgetExceeded, match="cost budget"):
        run(make_model(meter=usage).complete("x"))
    assert server.requests == []


def test_budget_is_checked_before_each_retry() -> None:
    # A fails and backs off; meanwhile B spends most of the budget; A's retry is refused.
    server = Server(error(500, "boom", type="server_error"), ok(prompt_tokens=900))
    usage = Usage(budget=Budget(max_tokens=1000))

    async def main() -> None:
        model = make_model(meter=usage, max_tokens=200, retry=4)

        async def later() -> None:
            await asyncio.sleep(0.1)
            await model.complete("b")

        await asyncio.gather(model.complete("a"), later())

    with mock_api(server), pytest.raises(BudgetExceeded):
        run(main())
    assert len(server.requests) == 2
    assert usage.total.requests == 2


# ---------------------------------------------------------------------------------------------
# rate limiting through the client
# ---------------------------------------------------------------------------------------------


def test_forty_concurrent_callers_stay_under_the_configured_rate() -> None:
    rate = 10.0  # requests per second, what the "server" allows
    recent: list[float] = []

    async def strict_server(request: httpx.Request) -> httpx.Response:
        now = asyncio.get_running_loop().time()
        recent[:] = [t for t in recent if t > now - 1.0 + 1e-9]
        recent.append(now)
        if len(recent) > rate:
            return error(429, "Rate limit reached.", type="requests", headers={"retry-after": "1"})
        return ok()

    server = Server(strict_server)
    limiter = RateLimiter(requests_per_minute=rate * 60)

    async def main() -> list[Completion[Any]]:
        model = make_model(limiter=limiter)
        return await asyncio.gather(*(model.complete(f"ticket {i}") for i in range(40)))

    clock = VirtualClock()
    with mock_api(server):
        results = run(main(), clock)
    assert all(r.attempts == 1 for r in results)  # never throttled by the server
    times = server.times
    assert len(times) == 40
    for start in times:
        in_window = [t for t in times if start <= t < start + 1.0 - 1e-9]
        assert len(in_window) <= rate
    achieved = (len(times) - 1) / (times[-1] - times[0])
    assert achieved == pytest.approx(rate, rel=0.01)
    assert limiter.acquired == 40


def test_a_429_pauses_every_caller_of_the_shared_limiter() -> None:
    limited = error(429, "Rate limit reached.", type="requests", headers={"retry-after": "5"})
    server = Server(limited, ok())
    limiter = RateLimiter(requests_per_minute=600)

    async def main() -> None:
        model = make_model(limiter=limiter)
        await asyncio.gather(model.complete("a"), model.complete("b"))

    with mock_api(server):
        run(main())
    assert server.times[0] == 0.0
    assert all(t >= 5.0 - 1e-9 for t in server.times[1:])
    assert len(server.times) == 3


def test_the_limiter_holds_what_the_provider_counts_and_the_budget_what_was_used() -> None:
    # The provider counts a request's prompt plus its output bound, whatever the reply
    # uses: each call holds ~1010 tokens of a 2000-token bucket refilled at 100 a second,
    # so the second call waits for the first one's tokens to come back.
    server = Server(ok(prompt_tokens=10, completion_tokens=5),
                    ok(prompt_tokens=10, completion_tokens=5))
    limiter = RateLimiter(tokens_per_minute=6_000, token_burst=2_000)
    meter = Usage()

    async def main() -> None:
        model = make_model(limiter=limiter, max_tokens=1000, meter=meter)
        await model.complete("x")
        await model.complete("y")

    with mock_api(server):
        run(main())
    assert server.times[0] == 0.0 and server.times[1] > 0.0
    assert [r["max_completion_tokens"] for r in server.bodies] == [1000, 1000]
    assert meter.total.total_tokens == 30  # the budget settles on the usage


# ---------------------------------------------------------------------------------------------
# secrets and the network
# ---------------------------------------------------------------------------------------------


def test_api_key_never_appears_in_logs_errors_or_repr(caplog: pytest.LogCaptureFixture) -> None:
    masked = "Incorrect API key provided: sk-proj-********************************************Nh."
    server = Server(
        error(500, "boom", type="server_error"),
        ok(),
        error(401, masked, code="invalid_api_key"),
        error(400, f"echo of {API_KEY} from a careless proxy"),
    )
    errors: list[BaseException] = []

    async def main() -> None:
        model = make_model()
        await model.complete("x")
        for _ in range(2):
            try:
                await model.complete("x")
            except PermanentError as exc:
                errors.append(exc)

    with caplog.at_level(logging.DEBUG), mock_api(server):
        run(main())
    assert len(errors) == 2
    assert len(caplog.records) > 0
    for record in caplog.records:
        assert API_KEY not in record.getMessage()
        assert API_KEY[8:] not in record.getMessage()
    for exc in errors:
        assert API_KEY not in str(exc) and API_KEY not in repr(exc)
    chain = "".join(traceback.format_exception(errors[0]))
    assert API_KEY not in chain
    assert API_KEY not in repr(make_model())


def test_an_unmocked_request_fails_instead_of_leaving_the_machine() -> None:
    model = make_model(base_url="https://api.elsewhere.test/v1", retry=1)
    with mock_api(Server(ok())), pytest.raises(respx.models.AllMockedAssertionError):
        run(model.complete("x"))


# ---------------------------------------------------------------------------------------------
# strict_schema
# ---------------------------------------------------------------------------------------------

_FORBIDDEN = {
    "default", "title", "minLength", "maxLength", "oneOf", "allOf", "not", "patternProperties",
    "$schema", "discriminator", "examples", "uniqueItems", "prefixItems", "definitions",
}  # fmt: skip
_FORMATS = {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}


def _assert_strict(node: Any, *, root: bool = False) -> None:
    """What the API's strict mode demands of every node of a schema."""
    assert isinstance(node, dict)
    assert not _FORBIDDEN & node.keys(), _FORBIDDEN & node.keys()
    assert {"type", "anyOf", "$ref", "enum", "const"} & node.keys(), node
    if root:
        assert node["type"] == "object" and "anyOf" not in node
    if "$ref" in node:
        assert node.keys() == {"$ref"} and node["$ref"].startswith("#/$defs/")
    if "format" in node:
        assert node["format"] in _FORMATS
    kinds = node.get("type")
    if kinds == "object" or (isinstance(kinds, list) and "object" in kinds):
        assert node["additionalProperties"] is False
        assert node["required"] == list(node["properties"])
        for sub in node["properties"].values():
            _assert_strict(sub)
    if "items" in node:
        _assert_strict(node["items"])
    for branch in node.get("anyOf", ()):
        _assert_strict(branch)
    for definition in node.get("$defs", {}).values():
        _assert_strict(definition)


class Address(BaseModel):
    """Where to send it."""

    street: str = Field(min_length=1, description="Street and number")
    city: str


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int = 9


class Dog(BaseModel):
    kind: Literal["dog"]
    tricks: list[dict[str, Any]]


class Node(BaseModel):
    name: str
    children: list[Node] = []


class Everything(BaseModel):
    label: Label
    home: Address = Field(description="The customer's address")
    other: Address | None = None
    tags: list[str] = Field(default_factory=list, max_length=5)
    payload: dict[str, Any]
    counts: dict[str, int] = {}
    anything: Any = None
    pet: Cat | Dog = Field(discriminator="kind")
    tree: Node | None = None
    when: datetime.datetime
    link: AnyUrl | None = None
    pair: tuple[int, str] = (0, "")
    text_or_blob: str | dict[str, Any] = ""
    color: Color = Color.red


def test_strict_schema_of_a_rich_model_meets_every_strict_rule() -> None:
    strict = strict_schema(Everything)
    _assert_strict(strict.schema, root=True)
    assert not strict.wrapped
    assert set(strict.encoded) == {
        "/payload", "/counts", "/anything", "/$defs/Dog/tricks/*", "/pair", "/text_or_blob",
    }  # fmt: skip
    props = strict.schema["properties"]
    assert props["when"]["format"] == "date-time"
    assert "format" not in json.dumps(props["link"])  # "uri" is not accepted, so dropped
    assert props["home"]["description"] == "The customer's address"  # $ref + description inlined
    assert props["tags"]["type"] == ["array", "null"]  # optional -> nullable


def test_strict_reply_decodes_into_the_original_model() -> None:
    strict = strict_schema(Everything)
    reply = {
        "label": {"category": "bug", "urgency": None, "confidence": 0.5},
        "home": {"street": "1 Main St", "city": "Oslo"},
        "other": None,
        "tags": None,
        "payload": '{"a": {"b": [1, 2]}}',
        "counts": '{"x": 3}',
        "anything": "[1, null]",
        "pet": {"kind": "dog", "tricks": ['{"name": "sit"}', '{"name": "roll", "times": 2}']},
        "tree": {"name": "root", "children": [{"name": "leaf", "children": None}]},
        "when": "2025-01-02T03:04:05Z",
        "link": None,
        "pair": '[7, "x"]',
        "text_or_blob": '{"stays": "a string"}',
        "color": None,
    }
    value = Everything.model_validate(strict.decode(reply))
    assert value.label == Label(category="bug", confidence=0.5)
    assert value.tags == [] and value.other is None and value.color is Color.red
    assert value.payload == {"a": {"b": [1, 2]}}
    assert value.counts == {"x": 3}
    assert value.anything == [1, None]
    assert isinstance(value.pet, Dog) and value.pet.tricks[1] == {"name": "roll", "times": 2}
    assert value.tree == Node(name="root", children=[Node(name="leaf")])
    assert value.pair == (7, "x")
    assert value.text_or_blob == '{"stays": "a string"}'  # a plain string wins in a union


def test_strict_schema_of_a_raw_schema_with_definitions() -> None:
    schema = {
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": {"$ref": "#/definitions/Item"}},
            "meta": {"type": "object", "additionalProperties": {"type": "string"}},
        },
        "required": ["items"],
        "definitions": {
            "Item": {
                "type": "object",
                "properties": {"n": {"type": "integer", "default": 1}},
                "required": ["n"],
            }
        },
    }
    strict = strict_schema(schema)
    _assert_strict(strict.schema, root=True)
    assert strict.schema["properties"]["items"]["items"] == {"$ref": "#/$defs/Item"}
    assert strict.encoded == ("/meta",)
    assert strict.decode({"items": [{"n": 2}], "meta": '{"k": "v"}'}) == {
        "items": [{"n": 2}],
        "meta": {"k": "v"},
    }
    assert strict.decode({"items": [], "meta": None}) == {"items": []}


@pytest.mark.parametrize(
    ("schema", "reply", "expected"),
    [
        ({"type": "array", "items": {"type": "integer"}}, {"value": [1, 2]}, [1, 2]),
        ({"type": "object"}, {"value": '{"free": true}'}, {"free": True}),
        ({"type": "string"}, {"value": "hi"}, "hi"),
    ],
)
def test_non_object_and_free_form_roots_are_wrapped(
    schema: dict[str, Any], reply: dict[str, Any], expected: Any
) -> None:
    strict = strict_schema(schema)
    _assert_strict(strict.schema, root=True)
    assert strict.wrapped
    assert strict.decode(reply) == expected


def test_strict_schema_rejects_what_it_cannot_handle() -> None:
    with pytest.raises(UsageError, match="local"):
        strict_schema({"type": "object", "properties": {"x": {"$ref": "other.json#/X"}}})
    with pytest.raises(UsageError):
        strict_schema(42)  # type: ignore[arg-type]


def test_bad_json_text_in_an_encoded_field_is_permanent() -> None:
    reply = json.dumps({"kind": "migrate_db", "payload": "{not json"})
    with mock_api(Server(ok(reply))), pytest.raises(PermanentError, match="JSON text"):
        run(make_model().complete("plan", result_model=Step))


# ---------------------------------------------------------------------------------------------
# schema rejections, options from the environment, portable schemas
# ---------------------------------------------------------------------------------------------

_REJECTIONS = {
    "openai": (400, "Invalid parameter: 'response_format' of type 'json_schema' is not "
               "supported with this model.", "response_format"),
    "vllm": (400, "The provided JSON schema contains features not supported by xgrammar.",
             None),
    "ollama": (500, "invalid JSON schema in format", None),
    "llama.cpp": (400, "Failed to initialize samplers: failed to parse grammar", None),
    "llama-cpp-python": (500, "1 validation error:\n  {'type': 'literal_error', 'loc': "
                         "('body', 'response_format', 'type'), 'msg': \"Input should be "
                         "'text' or 'json_object'\"}", None),
}


def _status_error(status: int, message: str, param: str | None) -> openai.APIStatusError:
    response = httpx2.Response(status, request=httpx2.Request("POST", f"{BASE_URL}/x"))
    body = {"message": message, "type": "x", "param": param, "code": None}
    cls = openai.BadRequestError if status == 400 else openai.InternalServerError
    return cls(message, response=response, body=body)


@pytest.mark.parametrize("server", sorted(_REJECTIONS))
def test_each_servers_schema_rejection_is_recognised(server: str) -> None:
    assert rejects_schema(_status_error(*_REJECTIONS[server]))


@pytest.mark.parametrize(
    ("status", "message"),
    [(400, "'messages' must contain the word 'json'"), (500, "The server had an error"),
     (503, "invalid JSON schema in format"), (400, "This model's maximum context length")],
)
def test_other_errors_are_not_schema_rejections(status: int, message: str) -> None:
    assert not rejects_schema(_status_error(status, message, None))
    assert not rejects_schema(ValueError("response_format"))


def test_options_come_from_the_environment_when_not_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PLANRUN_STRUCTURED", "json_object")
    monkeypatch.setenv("PLANRUN_SCHEMA", "portable")
    monkeypatch.setenv("PLANRUN_COMPAT", "1")
    monkeypatch.setenv("PLANRUN_API", "responses")
    model = make_model()
    assert (model.structured, model.schema, model.compat, model.api) == (
        "json_object", "portable", True, "responses")
    explicit = make_model(structured="strict", schema="full", compat=False, api="chat")
    assert (explicit.structured, explicit.schema, explicit.compat, explicit.api) == (
        "strict", "full", False, "chat")
    monkeypatch.setenv("PLANRUN_COMPAT", "maybe")
    with pytest.raises(UsageError, match="PLANRUN_COMPAT"):
        make_model()
    monkeypatch.setenv("PLANRUN_COMPAT", "0")
    monkeypatch.setenv("PLANRUN_SCHEMA", "loose")
    with pytest.raises(UsageError, match="PLANRUN_SCHEMA"):
        make_model()


def test_portable_schema_keeps_property_names_that_look_like_keywords() -> None:
    schema = {
        "type": "object",
        "properties": {
            "format": {"type": "string", "maxLength": 5, "format": "email"},
            "pattern": {"type": "array", "minItems": 1, "items": {"type": "integer",
                                                                  "minimum": 0}},
        },
        "required": ["format", "pattern"],
        "$defs": {"minimum": {"type": "number", "maximum": 3}},
    }
    assert portable_schema(schema) == {
        "type": "object",
        "properties": {"format": {"type": "string"},
                       "pattern": {"type": "array", "items": {"type": "integer"}}},
        "required": ["format", "pattern"],
        "$defs": {"minimum": {"type": "number"}},
    }


def test_the_default_request_is_unchanged_by_the_new_options() -> None:
    server = Server(ok(LABEL_JSON))
    with mock_api(server):
        run(make_model(max_tokens=9).complete("label", result_model=Label))
    body = server.bodies[0]
    assert set(body) == {"model", "messages", "response_format", "max_completion_tokens"}
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["strict"] is True


@pytest.mark.parametrize(
    "failure",
    [RuntimeError("Event loop is closed"), ConnectionResetError(104, "Connection reset by peer"),
     httpx2.RemoteProtocolError("Server disconnected without sending a response.")],
    ids=["loop-closed", "reset", "disconnected"],
)
def test_transport_failures_are_transient_and_retried(failure: BaseException) -> None:
    server = Server(failure, ok("fine"))
    with mock_api(server):
        completion = run(make_model().complete("hi"))
    assert completion.text == "fine" and completion.attempts == 2


def test_a_failure_outside_the_sdk_is_a_planrun_error(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    async def broken(self: Any, **params: Any) -> Any:
        calls.append(1)
        raise RuntimeError("Event loop is closed")

    monkeypatch.setattr(openai.resources.chat.AsyncCompletions, "create", broken)
    with pytest.raises(TransientError, match="Event loop is closed") as caught:
        run(make_model(retry=2).complete("hi"))
    assert len(calls) == 2 and isinstance(caught.value.__cause__, RuntimeError)

    async def buggy(self: Any, **params: Any) -> Any:
        raise KeyError("choices")

    monkeypatch.setattr(openai.resources.chat.AsyncCompletions, "create", buggy)
    with pytest.raises(PermanentError, match="KeyError"):
        run(make_model().complete("hi"))
