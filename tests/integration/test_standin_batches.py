"""The stand-in's Batch API, through the real openai SDK over HTTP (and in process): what
planrun's batch mode and its tests rely on, in the API's wire format."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import openai
import pytest
from openai.types import Batch, FileObject
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from planrun.dev.testing import FakeBatchAPI, FakeOpenAI
from planrun.testing import answered_by

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tools"))
import standin  # noqa: E402
from standin import StandIn  # noqa: E402

CHAT: Final = "/v1/chat/completions"
RESPONSES: Final = "/v1/responses"
BATCH_FIELDS = {
    "id", "object", "endpoint", "errors", "input_file_id", "completion_window", "status",
    "output_file_id", "error_file_id", "created_at", "in_progress_at", "expires_at",
    "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at",
    "cancelled_at", "request_counts", "metadata"}
T0 = 1_800_000_000.0


class Clock:
    """Epoch seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def body_for(url: str, text: str = "hi") -> dict[str, Any]:
    if url == RESPONSES:
        return {"model": "gpt-4o-mini", "input": [{"role": "user", "content": text}]}
    return {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}]}


def lines(n: int, url: str = CHAT, prefix: str = "c") -> bytes:
    return b"".join(json.dumps({"custom_id": f"{prefix}{i}", "method": "POST", "url": url,
                                "body": body_for(url, f"say {i}")}).encode() + b"\n"
                    for i in range(n))


Body = Callable[[openai.AsyncOpenAI, FakeBatchAPI, Clock], Awaitable[None]]


def run(body: Body, **options: Any) -> StandIn:
    """Serve a FakeBatchAPI (``options``) on the stand-in; run ``body`` with an SDK client."""
    clock = Clock()
    fake = FakeOpenAI()
    api = FakeBatchAPI(fake, clock=clock, **options)
    server = StandIn(fake, batch_api=api)

    async def main() -> None:
        async with openai.AsyncOpenAI(api_key="sk-standin", base_url=server.base_url,
                                      max_retries=0) as client:
            await body(client, api, clock)

    with server:
        asyncio.run(main())
    return server


async def submit(client: openai.AsyncOpenAI, content: bytes, endpoint: str = CHAT,
                 **metadata: str) -> Batch:
    uploaded = await client.files.create(file=("in.jsonl", content, "application/jsonl"),
                                         purpose="batch")
    return await client.batches.create(input_file_id=uploaded.id, endpoint=endpoint,  # type: ignore[arg-type]
                                       completion_window="24h", metadata=metadata or None)


async def raw_batch(client: openai.AsyncOpenAI, batch_id: str) -> dict[str, Any]:
    """The batch object as it came over the wire (every field, checked by the SDK's type)."""
    raw = await client.batches.with_raw_response.retrieve(batch_id)
    data: dict[str, Any] = json.loads(raw.content)
    assert set(data) >= BATCH_FIELDS
    Batch.model_validate(data)
    return data


async def results(client: openai.AsyncOpenAI, file_id: str | None) -> dict[str, Any]:
    if file_id is None:
        return {}
    content = (await client.files.content(file_id)).content
    assert content.endswith(b"\n")
    return {(line := json.loads(t))["custom_id"]: line for t in content.decode().splitlines()}


def without_ids(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_ids(v) for k, v in value.items()
                if k not in ("id", "system_fingerprint")}
    return [without_ids(v) for v in value] if isinstance(value, list) else value


@pytest.mark.parametrize("endpoint", [CHAT, RESPONSES])
def test_a_batch_completes_with_the_bodies_a_live_request_gets(endpoint: str) -> None:
    async def body(client: openai.AsyncOpenAI, api: FakeBatchAPI, clock: Clock) -> None:
        batch = await submit(client, lines(4, endpoint), endpoint, planrun_batch="run-b1")
        assert batch.status == "validating" and batch.request_counts is not None
        assert batch.request_counts.total == 4 and batch.metadata == {"planrun_batch": "run-b1"}
        clock.now += 30
        half = await raw_batch(client, batch.id)
        assert half["status"] == "in_progress" and half["in_progress_at"] == int(T0)
        assert half["request_counts"] == {"total": 4, "completed": 2, "failed": 0}
        clock.now += 31
        done = await raw_batch(client, batch.id)
        assert done["status"] == "completed" and done["completed_at"] == int(T0) + 60
        assert done["request_counts"] == {"total": 4, "completed": 4, "failed": 0}
        assert done["error_file_id"] is None and done["model"] == "gpt-4o-mini"
        out = await results(client, done["output_file_id"])
        assert list(out) == ["c0", "c1", "c2", "c3"]
        line = out["c2"]
        assert line["error"] is None and line["id"].startswith("batch_req_")
        assert line["response"]["status_code"] == 200
        assert line["response"]["request_id"].startswith("req_")
        got = line["response"]["body"]
        if endpoint == RESPONSES:
            live: Any = await client.responses.with_raw_response.create(
                **body_for(endpoint, "say 2"))
            assert live.parse().output_text == Response.construct(**got).output_text
        else:
            live = await client.chat.completions.with_raw_response.create(
                **body_for(endpoint, "say 2"))
            ChatCompletion.model_validate(got)
        # the same reply, but for the ids drawn from the request's own bytes
        assert without_ids(got) == without_ids(json.loads(live.content))
        usage = done["usage"]
        assert usage["total_tokens"] == sum(
            o["response"]["body"]["usage"]["total_tokens"] for o in out.values())
        assert api.submitted == 1 and api.uploads == 1 and api.retrieves == 2

    run(body, complete_after=60, progress=True)


def test_failed_lines_go_to_the_error_file_as_the_api_answered_them() -> None:
    async def body(client: openai.AsyncOpenAI, api: FakeBatchAPI, clock: Clock) -> None:
        batch = await raw_batch(client, (await submit(client, lines(5))).id)
        assert batch["request_counts"] == {"total": 5, "completed": 2, "failed": 3}
        errors = await results(client, batch["error_file_id"])
        assert sorted(errors) == ["c1", "c2", "c3"]
        for cid, status, kind, code in (("c1", 500, "server_error", None),
                                        ("c2", 429, "requests", "rate_limit_exceeded"),
                                        ("c3", 400, "invalid_request_error", "invalid_value")):
            line = errors[cid]
            assert line["error"] is None and line["response"]["status_code"] == status
            error = line["response"]["body"]["error"]
            assert (error["type"], error["code"]) == (kind, code) and error["message"]
        assert sorted(await results(client, batch["output_file_id"])) == ["c0", "c4"]

    run(body, fail_lines={"c1": 500, "c2": 429,
                          "c3": FakeBatchAPI.failure(400, "bad", code="invalid_value")})


def test_a_failure_rule_sees_each_line_and_its_body() -> None:
    seen: list[tuple[str, str]] = []

    def fail(custom_id: str, body: Any) -> Any:
        seen.append((custom_id, body["messages"][0]["content"]))
        return FakeBatchAPI.failure(500) if custom_id == "c1" else None

    async def body(client: openai.AsyncOpenAI, api: FakeBatchAPI, clock: Clock) -> None:
        batch = await client.batches.retrieve((await submit(client, lines(3))).id)
        assert batch.request_counts is not None and batch.request_counts.failed == 1
        assert seen == [("c0", "say 0"), ("c1", "say 1"), ("c2", "say 2")]

    run(body, fail_lines=fail)


def test_an_expired_batch_keeps_what_it_did_and_expires_the_rest() -> None:
    async def body(client: openai.AsyncOpenAI, api: FakeBatchAPI, clock: Clock) -> None:
        batch = await submit(client, lines(10))
        clock.now += 500  # read long after: only what was done by the expiry counts
        expired = await raw_batch(client, batch.id)
        assert expired["status"] == "expired" and expired["expired_at"] == int(T0) + 50
        assert expired["request_counts"] == {"total": 10, "completed": 5, "failed": 5}
        done = await results(client, expired["output_file_id"])
        gone = await results(client, expired["error_file_id"])
        assert sorted(done) == [f"c{i}" for i in range(5)]
        assert sorted(gone) == [f"c{i}" for i in range(5, 10)]
        for line in gone.values():
            assert line["response"] is None
            assert line["error"]["code"] == "batch_expired" and line["error"]["message"]

    run(body, complete_after=100, progress=True, expire_after=50)


def test_a_cancelled_batch_keeps_the_lines_done_before_the_cancel() -> None:
    async def body(client: openai.AsyncOpenAI, api: FakeBatchAPI, clock: Clock) -> None:
        batch = await submit(client, lines(10))
        clock.now += 30
        cancelling = await client.batches.cancel(batch.id)
        assert cancelling.status == "cancelling" and cancelling.cancelling_at == int(T0) + 30
        clock.now += 50  # nothing more is done once cancelled
        cancelled = await raw_batch(client, batch.id)
        assert cancelled["status"] == "cancelled"
        assert cancelled["cancelled_at"] == int(T0) + 80
        assert cancelled["request_counts"] == {"total": 10, "completed": 3, "failed": 0}
        assert sorted(await results(client, cancelled["output_file_id"])) == ["c0", "c1", "c2"]
        assert cancelled["error_file_id"] is None  # the lines not done are in no file
        with pytest.raises(openai.ConflictError):
            await client.batches.cancel(batch.id)
        assert api.cancelled == 1

    run(body, complete_after=100, progress=True)


def test_batches_are_listed_newest_first_in_pages_and_found_by_metadata() -> None:
    async def body(client: openai.AsyncOpenAI, api: FakeBatchAPI, clock: Clock) -> None:
        made = [await submit(client, lines(1, prefix=f"b{i}-"), planrun_batch=f"run-b{i}")
                for i in range(5)]
        first = await client.batches.list(limit=2)
        assert [b.id for b in first.data] == [made[4].id, made[3].id] and first.has_more
        raw = await client.batches.with_raw_response.list(limit=2)
        page = json.loads(raw.content)
        assert page["object"] == "list" and page["first_id"] == made[4].id
        assert page["last_id"] == made[3].id and page["has_more"] is True
        rest = await client.batches.list(limit=10, after=first.data[-1].id)
        assert [b.metadata["planrun_batch"] for b in rest.data if b.metadata] == [
            "run-b2", "run-b1", "run-b0"]
        assert not rest.has_more
        found = [b async for b in await client.batches.list(limit=2)
                 if b.metadata and b.metadata.get("planrun_batch") == "run-b0"]
        assert [b.id for b in found] == [made[0].id]  # the SDK followed the pages

    run(body)


def test_unknown_ids_are_the_apis_404() -> None:
    async def body(client: openai.AsyncOpenAI, api: FakeBatchAPI, clock: Clock) -> None:
        for call in (client.batches.retrieve("batch_nope"), client.batches.cancel("batch_nope"),
                     client.files.content("file-nope"), client.files.retrieve("file-nope"),
                     client.batches.create(input_file_id="file-nope", endpoint=CHAT,
                                           completion_window="24h")):
            with pytest.raises(openai.NotFoundError) as caught:
                await call
            error = caught.value.body
            assert isinstance(error, dict) and error["type"] == "invalid_request_error"
            assert error["message"] and "param" in error and "code" in error

    run(body)


BAD_INPUT = {
    "invalid_json_line": (lines(1) + b"{not json\n", 2),
    "missing_required_parameter": (lines(1) + b'{"method": "POST", "url": "/v1/chat/'
                                   b'completions", "body": {"model": "gpt-4o-mini"}}\n', 2),
    "duplicate_custom_id": (lines(2).replace(b'"c1"', b'"c0"'), 2),
    "url_mismatch": (lines(1) + lines(1, RESPONSES, "r"), 2),
    "model_mismatch": (lines(1) + lines(1, prefix="d").replace(b"gpt-4o-mini", b"gpt-4o"),
                       None),
    "empty_file": (b"\n", None),
}


@pytest.mark.parametrize("code", sorted(BAD_INPUT))
def test_an_input_file_the_api_refuses_fails_its_batch(code: str) -> None:
    content, line = BAD_INPUT[code]

    async def body(client: openai.AsyncOpenAI, api: FakeBatchAPI, clock: Clock) -> None:
        failed = await raw_batch(client, (await submit(client, content)).id)
        assert failed["status"] == "failed" and failed["failed_at"] == int(T0)
        assert failed["output_file_id"] is None and failed["error_file_id"] is None
        assert failed["errors"]["object"] == "list"
        [error] = failed["errors"]["data"]
        assert (error["code"], error["line"]) == (code, line) and error["message"]

    run(body)


def test_fail_batch_fails_every_batch_with_its_error() -> None:
    async def body(client: openai.AsyncOpenAI, api: FakeBatchAPI, clock: Clock) -> None:
        failed = await client.batches.retrieve((await submit(client, lines(2))).id)
        assert failed.status == "failed" and failed.errors and failed.errors.data
        assert failed.errors.data[0].code == "token_limit_exceeded"
        assert api.submitted == 1

    run(body, fail_batch=("token_limit_exceeded", "Enqueued token limit reached."))


def test_the_batch_api_has_its_own_pool_outside_the_live_rate_limit() -> None:
    fake = FakeOpenAI()
    with StandIn(fake, rpm_limit=60, rpm_burst=1) as server:
        async def main() -> None:
            async with openai.AsyncOpenAI(api_key="sk-standin", base_url=server.base_url,
                                          max_retries=0) as client:
                for _ in range(3):
                    batch = await client.batches.retrieve((await submit(client, lines(2))).id)
                    assert batch.status == "completed"
                    assert len(await results(client, batch.output_file_id)) == 2
                await client.chat.completions.create(**body_for(CHAT))
                with pytest.raises(openai.RateLimitError):
                    await client.chat.completions.create(**body_for(CHAT))

        asyncio.run(main())
    assert server.rate_limited == 1 and len(server.admitted) == 1
    assert server.batch_api.submitted == 3 and len(fake.requests) == 7


def test_served_in_process_with_the_same_ids_every_time() -> None:
    async def once() -> tuple[str, str, bytes, FileObject]:
        fake = FakeOpenAI()
        api = FakeBatchAPI(fake, clock=Clock())
        with answered_by(api):
            async with openai.AsyncOpenAI(api_key="sk-test", base_url="https://api.test/v1",
                                          max_retries=0) as client:
                batch = await client.batches.retrieve((await submit(client, lines(2))).id)
                assert batch.output_file_id is not None
                content = (await client.files.content(batch.output_file_id)).content
                info = await client.files.retrieve(batch.output_file_id)
        return batch.id, batch.input_file_id, content, info

    first, second = asyncio.run(once()), asyncio.run(once())
    assert first == second
    info = first[3]
    assert info.purpose == "batch_output" and info.bytes == len(first[2])


def test_the_command_line_refuses_a_negative_batch_time() -> None:
    with pytest.raises(SystemExit):
        standin.main(["--batch-complete-after", "-1"])
