"""At a provider's token limit: a bound on every call, a cut reply counted, the limiter
corrected by the provider's ``x-ratelimit-*`` headers (in memory and through a store)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import httpx
import pytest
from conftest_model import Server, chat_completion, make_model, mock_api, ok, run
from pydantic import BaseModel, Field

from planrun import Registry, TaskContext
from planrun.core import InvalidPlan, Plan, UsageError
from planrun.model import (
    DEFAULT_COMPLETION_ESTIMATE,
    ModelWorker,
    OutputTruncated,
    ProviderLimits,
    RateLimiter,
    SharedRateLimiter,
    Usage,
    adecompose,
)
from planrun.model._decompose import plan_bound
from planrun.model._limiter import behind, duration_seconds
from planrun.model._schema import (
    FREE_ITEMS,
    FREE_TEXT_TOKENS,
    MAX_OUTPUT_BOUND,
    MIN_OUTPUT_BOUND,
    output_bound,
)
from planrun.stores import open_store


class Label(BaseModel):
    category: Literal["billing", "bug", "other"]
    urgent: bool
    reason: str = Field(max_length=120)


class Long(BaseModel):
    notes: list[str]


# ---- the bound a schema implies ---------------------------------------------------------------


def test_the_bound_of_a_schema_counts_its_values() -> None:
    small = output_bound(Label.model_json_schema())
    # An enum, a boolean and 120 characters: far below free text, above the floor.
    assert MIN_OUTPUT_BOUND <= small < FREE_TEXT_TOKENS
    longer = output_bound({**Label.model_json_schema(), "properties": {
        **Label.model_json_schema()["properties"], "reason": {"type": "string"}}})
    assert longer > small  # free text is allowed more than 120 characters
    # An array without maxItems takes FREE_ITEMS items of free text; with maxItems, that many.
    free = output_bound(Long.model_json_schema())
    assert free >= FREE_ITEMS * FREE_TEXT_TOKENS
    capped = output_bound({"type": "object", "properties": {"notes": {
        "type": "array", "maxItems": 2, "items": {"type": "string", "maxLength": 30}}}})
    assert capped < free
    # A recursive type does not recurse for ever, and nothing passes the ceiling.
    tree = {"$defs": {"Node": {"type": "object", "properties": {
        "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}},
        "$ref": "#/$defs/Node"}
    assert MIN_OUTPUT_BOUND <= output_bound(tree) <= MAX_OUTPUT_BOUND


def test_a_plans_bound_grows_with_max_tasks() -> None:
    assert plan_bound(4) < plan_bound(8) < plan_bound(50)
    assert plan_bound(8) - plan_bound(4) == plan_bound(12) - plan_bound(8)


# ---- every call sends its bound ---------------------------------------------------------------


def _label_reply() -> httpx.Response:
    return ok(json.dumps({"category": "bug", "urgent": False, "reason": "crash"}))


def test_every_call_sends_a_bound_that_fits_it() -> None:
    server = Server(_label_reply())

    async def main() -> None:
        plain = make_model()
        await plain.complete("free text")                       # no schema: the default
        await plain.complete("label it", result_model=Label)    # derived from the schema
        await plain.complete("label it", result_model=Label, max_tokens=77)  # the call's
        await make_model(max_tokens=500).complete("x", result_model=Label)   # the Model's
        await make_model(compat=True).complete("x", result_model=Label)      # both fields

    with mock_api(server):
        run(main())
    derived = output_bound(Label.model_json_schema())
    bodies = server.bodies
    assert [b["max_completion_tokens"] for b in bodies] == [
        DEFAULT_COMPLETION_ESTIMATE, derived, 77, 500, derived]
    assert [b.get("max_tokens") for b in bodies] == [None, None, None, None, derived]


def test_a_kind_and_the_decomposer_send_their_own_bounds() -> None:
    plan_reply = ok(json.dumps({"tasks": [{"kind": "label", "payload": {}, "depends_on": []}]}))
    server = Server(_label_reply())
    registry = Registry()
    worker = ModelWorker("classify_ticket", result=Label, max_tokens=90)
    registry.register("label", worker, description="Label a ticket.")
    with pytest.raises(UsageError, match="ModelWorker: max_tokens must be a whole number"):
        ModelWorker("classify_ticket", result=Label, max_tokens=0)

    async def main() -> None:
        model = make_model()
        server.script = [plan_reply]
        await adecompose("label the tickets", registry, model, min_tasks=1, max_tasks=5)
        await adecompose("label the tickets", registry, model, min_tasks=1, max_tasks=5,
                         max_tokens=321)
        server.script = [_label_reply()]
        ctx = TaskContext("r", "t1", "label", 1, "w", 1.0, extras={"model": model})
        await worker({"ticket": {"id": 1, "text": "it crashes"}}, ctx)

    with mock_api(server):
        run(main())
    assert [b["max_completion_tokens"] for b in server.bodies] == [plan_bound(5), 321, 90]


def test_a_bound_that_is_not_a_whole_number_is_refused_before_anything_is_sent() -> None:
    server = Server(_label_reply())
    registry = Registry()
    registry.register("label", ModelWorker("classify_ticket", result=Label),
                      description="Label a ticket.")
    for bad in (0, -5, 2.5, True):
        with pytest.raises(UsageError, match=r"^Model: max_tokens must be a whole number"):
            make_model(max_tokens=bad)

    async def main(bad: object) -> None:
        model = make_model()
        with pytest.raises(UsageError, match=r"^Model.complete: max_tokens must be"):
            await model.complete("x", max_tokens=bad)  # type: ignore[arg-type]
        with pytest.raises(UsageError, match=r"^decompose: max_tokens must be"):
            await adecompose("label it", registry, model, max_tokens=bad)  # type: ignore[arg-type]

    with mock_api(server):
        for bad in (0, -1):
            run(main(bad))
    assert server.requests == []


def test_a_reply_cut_at_its_bound_is_a_clear_counted_outcome() -> None:
    cut = httpx.Response(200, json=chat_completion('{"category": "bu', finish_reason="length",
                                                   completion_tokens=40))
    server = Server(cut)
    meter = Usage()

    async def main() -> None:
        await make_model(meter=meter).complete("label it", result_model=Label, max_tokens=40)

    with mock_api(server), pytest.raises(OutputTruncated) as caught:
        run(main())
    assert caught.value.bound == 40 and caught.value.text == '{"category": "bu'
    assert "output bound of 40 tokens" in str(caught.value) and "max_tokens" in str(caught.value)
    assert len(server.requests) == 1  # the same call would stop at the same place
    (record,) = meter.records
    assert record.error == "OutputTruncated" and record.completion_tokens == 40


# ---- the provider's headers -------------------------------------------------------------------


def test_the_headers_are_read_as_the_api_writes_them() -> None:
    limits = ProviderLimits.from_headers({
        "x-ratelimit-limit-requests": "500", "x-ratelimit-remaining-requests": "499",
        "x-ratelimit-reset-requests": "120ms", "x-ratelimit-limit-tokens": "30000",
        "X-RateLimit-Remaining-Tokens": "29100", "x-ratelimit-reset-tokens": "1m2.5s",
    }, age=0.2)
    assert limits == ProviderLimits(500, 499, 0.12, 30000, 29100, 62.5, age=0.2)
    assert ProviderLimits.from_headers({"x-request-id": "r"}) is None
    assert ProviderLimits.from_headers({"x-ratelimit-remaining-tokens": "lots"}) is None
    assert duration_seconds("6m0s") == 360 and duration_seconds("1h") == 3600
    assert duration_seconds("2.5") == 2.5 and duration_seconds(None) is None
    # A bucket holding more than the provider says remains is full again later; the
    # time the answer spent in flight is already past.
    assert behind(1000, 100, 400) == 6.0
    assert behind(1000, 100, 400, age=1.0) == 5.0
    assert behind(1000, 100, 1000) is None and behind(1000, 100, None) is None


def _limited(remaining: int, limit: int = 6000) -> httpx.Response:
    return httpx.Response(200, json=chat_completion("ok", prompt_tokens=10), headers={
        "x-ratelimit-limit-tokens": str(limit), "x-ratelimit-remaining-tokens": str(remaining)})


def test_the_limiter_adopts_the_providers_limit_and_what_remains() -> None:
    # Configured at twice the provider's 6,000 tokens a minute: the first answer says so,
    # and that nothing remains, so the second call waits for the provider's bucket.
    server = Server(_limited(0), _limited(6000))
    limiter = RateLimiter(tokens_per_minute=12_000)

    async def main() -> None:
        model = make_model(limiter=limiter, max_tokens=50)
        await model.complete("x")
        await model.complete("y")

    with mock_api(server):
        run(main())
    assert limiter.tokens_per_minute == 6000
    # The provider's bucket (one second's worth, 100 tokens, at 100 a second) was empty at
    # 0: the second call (about 60 tokens: its prompt and its bound of 50) waits until the
    # bucket holds it, 0.6 s on. Without the headers it would have gone at once.
    assert 0.5 <= server.times[1] <= 1.0
    quiet = Server(ok(prompt_tokens=10))
    limiter = RateLimiter(tokens_per_minute=12_000)
    with mock_api(quiet):
        run(main())
    assert quiet.times == [0.0, 0.0]


def test_a_limit_the_limiter_did_not_have_is_learnt() -> None:
    limiter = RateLimiter(requests_per_minute=600)
    server = Server(_limited(6000, limit=6000))

    async def main() -> None:
        await make_model(limiter=limiter).complete("x")

    with mock_api(server):
        run(main())
    assert limiter.tokens_per_minute == 6000
    assert server.bodies[0]["max_completion_tokens"] == DEFAULT_COMPLETION_ESTIMATE


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_a_shared_limiter_is_corrected_for_every_process(
        backend: str, tmp_path: Path) -> None:
    store = open_store("memory://" if backend == "memory" else f"sqlite:///{tmp_path / 'l.db'}")
    await store.open()
    try:
        limiter = SharedRateLimiter(store, "k", tokens_per_minute=12_000)
        await limiter.acquire(10)
        await limiter.observe(ProviderLimits(tokens_limit=6000, tokens_remaining=0))
        state = await store.limiter_state("k")
        assert state is not None and state.tpm == 6000 and state.token_burst == 100
        assert state.tokens_available is not None and state.tokens_available <= 1
        # Whoever asks next for the key (another process) waits for the provider's bucket.
        wait = await store.limiter_take("k", 50)
        assert wait > 0.4
        before = limiter.store_calls
        await limiter.observe(ProviderLimits(tokens_limit=6000, tokens_remaining=5000))
        assert limiter.store_calls == before  # nothing to correct: no write
    finally:
        await store.close()


def test_a_plan_cut_at_its_bound_is_repaired_into_a_shorter_one() -> None:
    registry = Registry()
    registry.register("label", ModelWorker("classify_ticket", result=Label),
                      description="Label a ticket.")
    runaway = '{"tasks": [{"kind": "label", "payload": {}, "depends_on": []}, {"kind": "la'
    short = json.dumps({"tasks": [{"kind": "label", "payload": {}, "depends_on": []}]})
    server = Server(
        httpx.Response(200, json=chat_completion(runaway, finish_reason="length",
                                                 completion_tokens=plan_bound(3))),
        ok(short))
    meter = Usage()

    async def main() -> Plan:
        return await adecompose("label the tickets", registry, make_model(), min_tasks=1,
                                max_tasks=3, meter=meter)

    with mock_api(server):
        plan = run(main())
    assert [t.kind for t in plan.tasks] == ["label"]
    repair = server.bodies[1]["messages"][-1]["content"]
    assert "- truncated (task -):" in repair and "shorter plan" in repair
    assert server.bodies[1]["messages"][1] == {"role": "assistant", "content": runaway}
    assert [r.error for r in meter.records] == ["OutputTruncated", None]  # both counted


def test_a_plan_still_cut_after_the_repairs_is_invalid_with_the_code() -> None:
    registry = Registry()
    registry.register("label", ModelWorker("classify_ticket", result=Label),
                      description="Label a ticket.")
    server = Server(httpx.Response(200, json=chat_completion('{"tasks": [',
                                                             finish_reason="length")))

    async def main() -> Plan:
        return await adecompose("label the tickets", registry, make_model(), min_tasks=1,
                                max_tasks=3, repair_attempts=1)

    with mock_api(server), pytest.raises(InvalidPlan) as caught:
        run(main())
    assert [p.code for p in caught.value.problems] == ["truncated"]
    assert len(server.requests) == 2 and caught.value.raw_outputs == ['{"tasks": [', '{"tasks": [']
