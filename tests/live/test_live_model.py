"""The Model over real HTTP: failures, fallback per server, compat, portable, Responses."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from live_support import LIVE_KEY, Start, live_model
from pydantic import BaseModel, Field
from standin import DROP, EMULATIONS, StandIn

from planrun._facade import plan_and_run
from planrun.core._errors import ModelRefused, PermanentError, RateLimited, TransientError
from planrun.dev.scenarios import get_scenario
from planrun.dev.testing import FakeOpenAI, Scripted
from planrun.examples import release
from planrun.model import VALIDATION_KEYWORDS, Model
from planrun.model._usage import Usage


class Label(BaseModel):
    """A ticket's label."""

    category: str = Field(pattern=r"^[a-z]+$", max_length=20)
    tags: list[str] = Field(min_length=1, max_length=3)
    confidence: float = Field(ge=0, le=1)


class Other(BaseModel):
    """Another schema: its fallback is its own."""

    answer: str


LABEL = {"category": "billing", "tags": ["refund"], "confidence": 0.9}


@pytest.fixture
def make(standin: Start) -> Any:
    """A stand-in with the Label/Other answers (stopped after the test)."""
    servers: list[StandIn] = []

    def build(*script: Scripted, **options: Any) -> StandIn:
        answers = {"Label": LABEL, "Other": {"answer": "yes"}}
        server = StandIn(FakeOpenAI(answers, script=script), **options).start()
        servers.append(server)
        return server

    yield build
    for server in servers:
        server.stop()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# ---- failure scenarios over HTTP -------------------------------------------------------------


@pytest.mark.parametrize("name", ["server_error", "refusal", "bad_request"])
def test_failure_scenarios_end_as_recorded(standin: Start, name: str) -> None:
    scenario = get_scenario(name)
    server = standin(name)
    report = plan_and_run(release.RELEASE_PLAN, release.make_app(), model=live_model(server),
                          on_dead="abort_run")
    counts = {k: report.counts.get(k, 0) for k in scenario.counts}
    assert counts == dict(scenario.counts)
    assert server.requests == scenario.requests


def test_rate_limited_release_waits_for_retry_after_and_completes(make: Any) -> None:
    limited = Scripted(429, "Rate limit reached for gpt-4o-mini on tokens per min (TPM): "
                       "Limit 200000, Used 200000, Requested 900.", code="rate_limit_exceeded",
                       headers={"retry-after-ms": "30", "x-ratelimit-remaining-tokens": "0"})
    server = make(limited, limited)
    report = plan_and_run(release.RELEASE_PLAN, release.make_app(), model=live_model(server))
    assert report.counts["completed"] == 3
    assert server.requests == 5


def test_a_429_body_and_headers_are_the_apis(make: Any) -> None:
    server = make(Scripted(429, "Rate limit reached on requests per min (RPM)",
                           code="rate_limit_exceeded", headers={"retry-after": "1"}))
    with httpx.Client(base_url=server.base_url, headers={"authorization": f"Bearer {LIVE_KEY}"}
                      ) as client:
        limited = client.post("/chat/completions", json={"model": "m", "messages": []})
        fine = client.post("/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "x" * 6000}]})
    assert limited.status_code == 429
    assert limited.json()["error"]["type"] == "requests"
    assert limited.headers["retry-after"] == "1"
    assert limited.headers["x-ratelimit-limit-requests"]
    assert fine.headers["x-ratelimit-remaining-tokens"]
    cached = fine.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 1024 and cached % 128 == 0
    assert server.connections == 1  # both requests on one keep-alive connection


def test_context_length_400_names_messages_and_is_permanent(make: Any) -> None:
    server = make(Scripted(400, "This model's maximum context length is 128000 tokens.",
                           code="context_length_exceeded"))
    with pytest.raises(PermanentError, match="context_length_exceeded") as caught:
        run(live_model(server).complete("x"))
    assert caught.value.__cause__.body["param"] == "messages"  # type: ignore[union-attr]
    assert server.requests == 1


def test_small_prompts_report_no_cached_tokens(make: Any) -> None:
    server = make()
    meter = Usage()
    run(live_model(server, meter=meter).complete("hello " * 300))
    assert 0 < meter.total.prompt_tokens < 1024
    assert meter.total.cached_tokens == 0


# ---- transport errors ------------------------------------------------------------------------


def test_a_dropped_connection_is_transient_and_retried(make: Any) -> None:
    server = make(raw=[DROP, DROP])
    completion = run(live_model(server).complete("hi"))
    assert completion.text == "ok" and completion.attempts == 3


def test_connections_dropped_every_time_end_in_transient_error(make: Any) -> None:
    server = make(raw=[DROP] * 4)
    with pytest.raises(TransientError, match=r"connect|reach|connection"):
        run(live_model(server).complete("hi"))
    assert server.requests == 4


def test_a_200_page_that_is_not_an_api_answer_is_permanent_at_once(make: Any) -> None:
    server = make(raw=[(200, {"content-type": "text/html"},
                        b"<html><body>Welcome to nginx!</body></html>")])
    with pytest.raises(PermanentError, match=r"not a completion") as caught:
        run(live_model(server).complete("hi"))
    assert not isinstance(caught.value, json.JSONDecodeError)
    assert server.requests == 1


CUT = b"{\"id\": \"chatcmpl-1\", \"object\": \"chat.compl"
PAGE = b"<html><body><h1>502 Bad Gateway</h1></body></html>"


def test_a_body_cut_short_is_transient_and_the_retry_gets_the_answer(make: Any) -> None:
    server = make(raw=[(200, {"content-type": "application/json"}, CUT)])
    completion = run(live_model(server).complete("hi"))
    assert completion.text == "ok" and completion.attempts == 2 and server.requests == 2


def test_the_same_body_that_is_not_json_twice_is_permanent_naming_the_server(
    make: Any,
) -> None:
    server = make(raw=[(200, {"content-type": "application/json"}, PAGE)] * 5)
    with pytest.raises(PermanentError, match=r"answered twice with the same body") as caught:
        run(live_model(server).complete("hi"))
    assert server.base_url.removesuffix("/v1") in str(caught.value)
    assert LIVE_KEY not in str(caught.value)
    assert server.requests == 2  # not retried until the policy runs out


def test_bodies_cut_short_every_time_end_in_a_transient_error_naming_the_server(
    make: Any,
) -> None:
    server = make(raw=[(200, {"content-type": "application/json"}, CUT)] * 6)
    with pytest.raises(TransientError, match=r"answered with a body that is not JSON") as caught:
        run(live_model(server).complete("hi"))
    assert server.base_url.removesuffix("/v1") in str(caught.value)
    assert server.requests == live_model(server).retry.attempts


def test_a_second_event_loop_gets_a_working_connection(make: Any) -> None:
    server = make()
    model = live_model(server)
    for _ in range(3):
        assert run(model.complete("hi")).text == "ok"
    assert server.connections == 3  # one pool per loop, each closed with its loop


# ---- JSON-mode fallback, per server ----------------------------------------------------------


@pytest.mark.parametrize("server_kind", sorted(EMULATIONS))
def test_auto_falls_back_on_each_servers_rejection(make: Any, server_kind: str) -> None:
    server = make(emulate=server_kind)
    model = live_model(server)

    async def main() -> list[Any]:
        return [await model.complete("label", result_model=Label),
                await model.complete("label", result_model=Label),
                await model.complete("other", result_model=Other)]

    first, again, other = run(main())
    assert first.parsed == Label(**LABEL) and first.fell_back and first.mode == "json_mode"
    levels = 3 if server_kind == "openai" else 2  # OpenAI refuses response_format.schema too
    assert first.attempts == levels
    assert again.attempts == 1 and again.mode == "json_mode" and not again.fell_back
    assert other.fell_back and other.attempts == levels  # per schema, not for the Model
    assert server.rejected == 2 * (levels - 1)


@pytest.mark.parametrize("server_kind", ["ollama", "llama-cpp-python"])
def test_strict_mode_fails_at_once_on_a_500_rejection(make: Any, server_kind: str) -> None:
    server = make(emulate=server_kind)
    with pytest.raises(PermanentError) as caught:
        run(live_model(server, structured="strict").complete("x", result_model=Label))
    assert server.requests == 1  # not retried as a server error
    if server_kind == "llama-cpp-python":
        assert "Input should be 'text' or 'json_object'" in str(caught.value)


def test_json_object_mode_sends_the_schema_where_the_server_takes_it(make: Any) -> None:
    server = make(emulate="llama-cpp-python")
    completion = run(live_model(server, structured="json_object").complete(
        "x", result_model=Label))
    assert completion.attempts == 1 and completion.parsed == Label(**LABEL)
    body = server.fake.requests[0].body
    assert body["response_format"]["type"] == "json_object"
    assert body["response_format"]["schema"]["properties"]["tags"]["minItems"] == 1
    assert "JSON Schema" in body["messages"][0]["content"]


def test_release_runs_on_llama_cpp_python(standin: Start) -> None:
    server = standin(emulate="llama-cpp-python")
    report = plan_and_run(release.RELEASE_PLAN, release.make_app(), model=live_model(server))
    assert report.counts["completed"] == 3


def test_cli_shows_a_multi_line_server_error_whole(standin: Start) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    server = standin(emulate="llama-cpp-python")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "PLANRUN_"))}
    env.update(OPENAI_BASE_URL=server.base_url, OPENAI_API_KEY=LIVE_KEY,
               PLANRUN_STRUCTURED="strict")
    planrun = str(Path(sys.executable).parent / "planrun")
    done = subprocess.run([planrun, "demo", "--live"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0
    assert "Input should be 'text' or 'json_object'" in done.stderr
    assert LIVE_KEY not in done.stderr + done.stdout


# ---- compat and portable schemas -------------------------------------------------------------


def test_compat_also_sends_max_tokens(make: Any) -> None:
    server = make()
    run(live_model(server, compat=True, max_tokens=64).complete("a"))
    run(live_model(server, max_tokens=64).complete("b"))
    with_compat, without = server.fake.requests
    assert with_compat.max_tokens == 64 and with_compat.body["max_completion_tokens"] == 64
    assert without.max_tokens is None and without.body["max_completion_tokens"] == 64


def _keywords(node: Any) -> set[str]:
    if isinstance(node, list):
        return set().union(*map(_keywords, node)) if node else set()
    if not isinstance(node, dict):
        return set()
    found = set(node) & VALIDATION_KEYWORDS
    for key, value in node.items():
        if key == "properties":
            found |= set().union(*map(_keywords, value.values())) if value else set()
        else:
            found |= _keywords(value)
    return found


def test_portable_schema_strips_keywords_and_still_enforces_them(make: Any) -> None:
    server = make()
    model = live_model(server, schema="portable")
    assert run(model.complete("x", result_model=Label)).parsed == Label(**LABEL)
    sent = server.fake.requests[0].body["response_format"]["json_schema"]["schema"]
    assert _keywords(sent) == set()
    full = live_model(server)
    run(full.complete("x", result_model=Label))
    assert {"pattern", "minItems", "maximum"} <= _keywords(
        server.fake.requests[1].body["response_format"]["json_schema"]["schema"])
    server.fake.answers["Label"] = {**LABEL, "tags": []}
    with pytest.raises(PermanentError, match="tags"):
        run(model.complete("x", result_model=Label))


# ---- the Responses API -----------------------------------------------------------------------


def test_responses_api_structured_output_and_usage(make: Any) -> None:
    server = make()
    meter = Usage()
    model = live_model(server, api="responses", meter=meter, max_tokens=300)
    completion = run(model.complete("x" * 8000, result_model=Label))
    assert completion.parsed == Label(**LABEL) and completion.mode == "json_schema"
    body = server.fake.requests[0].body
    assert body["text"]["format"]["type"] == "json_schema"
    assert body["text"]["format"]["name"] == "Label" and body["max_output_tokens"] == 300
    assert "messages" not in body and body["input"][0]["role"] == "user"
    record = completion.usage
    assert record.prompt_tokens > 1024 and record.completion_tokens > 0
    assert record.cached_tokens >= 1024 and record.cached_tokens % 128 == 0
    assert meter.total.requests == 1


def test_responses_api_falls_back_retries_and_refuses(make: Any) -> None:
    server = make(emulate="vllm")
    model = live_model(server, api="responses")
    assert run(model.complete("x", result_model=Label)).fell_back
    assert server.fake.requests[-1].body["text"]["format"] == {"type": "json_object"}
    server = make(Scripted(503, "overloaded"), Scripted(refusal="I can't help with that."))
    with pytest.raises(ModelRefused, match="can't help"):
        run(live_model(server, api="responses").complete("x"))
    assert server.requests == 2
    server = make(Scripted(429, "Rate limit", code="rate_limit_exceeded",
                           headers={"retry-after": "0"}))
    with pytest.raises(RateLimited):
        run(live_model(server, api="responses", retry=1).complete("x"))


def test_release_runs_on_the_responses_api(live_server: StandIn) -> None:
    server = live_server
    model = live_model(server, api="responses")
    report = plan_and_run(release.RELEASE_PLAN, release.make_app(), model=model)
    assert report.counts["completed"] == 3
    assert all(r.body.get("input") for r in server.fake.requests)


def test_model_rejects_an_unknown_api() -> None:
    from planrun.core._errors import UsageError

    with pytest.raises(UsageError, match="api"):
        Model(api="completions", api_key=LIVE_KEY)  # type: ignore[arg-type]


def test_a_worker_reasks_over_http_and_the_run_completes() -> None:
    from planrun.examples import tickets
    from planrun.examples.answers import answers
    from planrun.examples.ticket_data import generate_tickets

    base = answers()
    classify = base["classify_ticket"]

    def first_wrong(req: Any) -> Any:
        return {"category": "spam"} if req.repairs == 0 else classify(req)

    with StandIn(FakeOpenAI({**base, "classify_ticket": first_wrong})) as server:
        app, _, _ = tickets.make_app()
        plan = tickets.ticket_plan(generate_tickets(3, seed=1), app.registry)
        usage = Usage()
        report = plan_and_run(plan, app, model=live_model(server), usage=usage)
    assert report.counts["completed"] == 6
    assert server.requests == 3 * 2 + 3  # each classification re-asked once, drafts once
    reasks = [r for r in server.fake.requests if r.repairs]
    assert len(reasks) == 3 and all("Validation errors" in r.last_user for r in reasks)
    assert usage.total.requests == 9
