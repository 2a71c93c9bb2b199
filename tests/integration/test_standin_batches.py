"""The stand-in's Batch API, through the real openai SDK over HTTP: what planrun's batch mode
and its tests rely on, in the API's wire format."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import openai
import pytest

from planrun.dev.testing import FakeBatchAPI, FakeOpenAI

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tools"))
from standin import StandIn  # noqa: E402

CHAT = "/v1/chat/completions"


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def lines(n: int, url: str = CHAT, prefix: str = "c") -> bytes:
    body: dict[str, Any] = ({"model": "gpt-4o-mini", "input": [{"role": "user", "content": "hi"}]}
                            if url.endswith("responses") else
                            {"model": "gpt-4o-mini", "messages": [
                                {"role": "user", "content": "hi"}]})
    return b"".join(json.dumps({"custom_id": f"{prefix}{i}", "method": "POST", "url": url,
                                "body": body}).encode() + b"\n" for i in range(n))


def serve(**options: Any) -> tuple[StandIn, FakeBatchAPI, Clock]:
    clock = Clock()
    fake = FakeOpenAI()
    api = FakeBatchAPI(fake, clock=clock, **options)
    return StandIn(fake, batch_api=api), api, clock


async def submit(client: openai.AsyncOpenAI, content: bytes, endpoint: str = CHAT,
                 **metadata: str) -> Any:
    uploaded = await client.files.create(file=("in.jsonl", content, "application/jsonl"),
                                         purpose="batch")
    return await client.batches.create(input_file_id=uploaded.id, endpoint=endpoint,  # type: ignore[arg-type]
                                       completion_window="24h", metadata=metadata or None)


async def results(client: openai.AsyncOpenAI, file_id: str | None) -> dict[str, Any]:
    if file_id is None:
        return {}
    text = (await client.files.content(file_id)).text
    return {(line := json.loads(t))["custom_id"]: line for t in text.splitlines()}


def client_of(server: StandIn) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(api_key="sk-standin", base_url=server.base_url, max_retries=0)


@pytest.mark.parametrize("endpoint", [CHAT, "/v1/responses"])
def test_a_batch_completes_with_the_bodies_a_live_request_gets(endpoint: str) -> None:
    server, _, clock = serve(complete_after=60)

    async def main() -> None:
        async with client_of(server) as client:
            await body(client)

    async def body(client: openai.AsyncOpenAI) -> None:
        batch = await submit(client, lines(3, endpoint), endpoint)
        assert batch.status == "validating" and batch.request_counts.total == 3
        assert (await client.batches.retrieve(batch.id)).status == "in_progress"
        clock.now += 60
        done = await client.batches.retrieve(batch.id)
        assert done.status == "completed" and done.request_counts.completed == 3
        assert done.error_file_id is None
        out = await results(client, done.output_file_id)
        assert sorted(out) == ["c0", "c1", "c2"]
        body = out["c0"]["response"]["body"]
        live = (await client.responses.create(model="gpt-4o-mini", input=[
            {"role": "user", "content": "hi"}]) if endpoint.endswith("responses") else
            await client.chat.completions.create(model="gpt-4o-mini", messages=[
                {"role": "user", "content": "hi"}]))
        shown = live.model_dump(mode="json", exclude_unset=True)
        assert set(body) == set(shown) and body["usage"] == shown["usage"]
        assert body["object"] == shown["object"] and body["model"] == shown["model"]
        assert out["c0"]["response"]["status_code"] == 200 and out["c0"]["error"] is None

    with server:
        asyncio.run(main())


def test_failed_lines_go_to_the_error_file() -> None:
    def fail(custom_id: str, body: Any) -> Any:
        return (500, {"error": {"message": "boom", "type": "server_error", "param": None,
                                "code": None}}) if custom_id == "c1" else None

    server, _, _ = serve(fail_lines=fail)

    async def main() -> None:
        async with client_of(server) as client:
            await body(client)

    async def body(client: openai.AsyncOpenAI) -> None:
        batch = await client.batches.retrieve((await submit(client, lines(3))).id)
        assert batch.request_counts.model_dump() == {"total": 3, "completed": 2, "failed": 1}
        errors = await results(client, batch.error_file_id)
        assert errors["c1"]["response"]["status_code"] == 500
        assert errors["c1"]["response"]["body"]["error"]["message"] == "boom"
        assert sorted(await results(client, batch.output_file_id)) == ["c0", "c2"]

    with server:
        asyncio.run(main())


def test_an_expired_batch_keeps_what_it_did_and_expires_the_rest() -> None:
    server, _, clock = serve(complete_after=100, progress=True, expire_after=50)

    async def main() -> None:
        async with client_of(server) as client:
            await body(client)

    async def body(client: openai.AsyncOpenAI) -> None:
        batch = await submit(client, lines(10))
        clock.now += 50
        expired = await client.batches.retrieve(batch.id)
        assert expired.status == "expired"
        done = await results(client, expired.output_file_id)
        gone = await results(client, expired.error_file_id)
        assert len(done) == 5 and len(gone) == 5
        assert {e["error"]["code"] for e in gone.values()} == {"batch_expired"}
        assert all(e["response"] is None for e in gone.values())

    with server:
        asyncio.run(main())


def test_a_cancelled_batch_keeps_the_lines_done_before_the_cancel() -> None:
    server, api, clock = serve(complete_after=100, progress=True)

    async def main() -> None:
        async with client_of(server) as client:
            await body(client)

    async def body(client: openai.AsyncOpenAI) -> None:
        batch = await submit(client, lines(10))
        clock.now += 30
        cancelling = await client.batches.cancel(batch.id)
        assert cancelling.status == "cancelling"
        cancelled = await client.batches.retrieve(batch.id)
        assert cancelled.status == "cancelled" and cancelled.request_counts.completed == 3
        assert len(await results(client, cancelled.output_file_id)) == 3
        with pytest.raises(openai.ConflictError):
            await client.batches.cancel(batch.id)
        assert api.cancelled == 1

    with server:
        asyncio.run(main())


def test_batches_are_listed_newest_first_in_pages_with_their_metadata() -> None:
    server, _, _ = serve()

    async def main() -> None:
        async with client_of(server) as client:
            await body(client)

    async def body(client: openai.AsyncOpenAI) -> None:
        made = [await submit(client, lines(1, prefix=f"b{i}-"), planrun_batch=f"run-b{i}")
                for i in range(5)]
        first = await client.batches.list(limit=2)
        assert [b.id for b in first.data] == [made[4].id, made[3].id] and first.has_more
        rest = await client.batches.list(limit=10, after=first.data[-1].id)
        assert [b.metadata["planrun_batch"] for b in rest.data] == ["run-b2", "run-b1",
                                                                     "run-b0"]
        assert not rest.has_more

    with server:
        asyncio.run(main())


def test_unknown_ids_and_bad_input_are_the_apis_errors() -> None:
    server, _, _ = serve()

    async def main() -> None:
        async with client_of(server) as client:
            await body(client)

    async def body(client: openai.AsyncOpenAI) -> None:
        with pytest.raises(openai.NotFoundError):
            await client.batches.retrieve("batch_nope")
        with pytest.raises(openai.NotFoundError):
            await client.files.content("file-nope")
        dup = lines(2).replace(b'"c1"', b'"c0"')
        failed = await submit(client, dup)
        assert failed.status == "failed"
        assert failed.errors is not None and "duplicate custom_id" in \
            failed.errors.data[0].message
        wrong = await submit(client, lines(1, "/v1/responses"))
        assert wrong.status == "failed"

    with server:
        asyncio.run(main())
