"""Batch traffic in a cassette: uploads, batches, polls and result files, recorded from the
stand-in over HTTP and replayed with no server at all."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from pydantic import BaseModel

from planrun import Batching, Model
from planrun.dev.fixtures import (
    Cassette,
    FixtureMiss,
    Interaction,
    RecordedRequest,
    RecordedResponse,
    _parse_body,
    record,
    replay,
)
from planrun.dev.testing import FakeBatchAPI, FakeOpenAI
from planrun.model import Batcher

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
from standin import StandIn  # noqa: E402

KEY = "sk-standin-batch-cassette-000000000"
NOWHERE = "http://127.0.0.1:9/v1"
"""Nothing listens there: in a replay every answer is the cassette's."""


class Word(BaseModel):
    word: str


async def three_batched_calls(base_url: str) -> list[str]:
    batcher = Batcher(Batching(wait_s=0.05, poll_s=0.05))
    batcher.bind("cassette-run")
    model = Model("gpt-4o-mini", api_key=KEY, base_url=base_url).batched(batcher)
    try:
        replies = await asyncio.gather(*(
            model.complete(f"a word for {i}", result_model=Word, idempotency_key=f"k{i}")
            for i in range(3)))
    finally:
        await batcher.aclose()
        await model.aclose()
    assert batcher.submitted == 1
    return [r.parsed.word for r in replies if r.parsed is not None]


def test_batch_traffic_is_recorded_and_replayed_without_a_server(tmp_path: Path) -> None:
    path = tmp_path / "batch.json"
    fake = FakeOpenAI({"Word": lambda req: {"word": req.messages[-1]["content"][-1]}})
    with StandIn(fake) as server, record(path, made="synthesized"):
        recorded = asyncio.run(three_batched_calls(server.base_url))
    assert recorded == ["0", "1", "2"]
    cassette = Cassette.load(path)
    by = {(i.request.method, i.request.path.split("/")[2], i.request.path.endswith("content")):
          i for i in cassette.interactions}
    assert set(by) == {("POST", "files", False), ("POST", "batches", False),
                       ("GET", "batches", False), ("GET", "files", True)}
    output = by["GET", "batches", False].response.body["output_file_id"]
    assert by["GET", "files", True].request.path == f"/v1/files/{output}/content"
    upload = by["POST", "files", False].request.body["multipart"]
    assert upload["purpose"] == "batch"
    assert upload["file"]["filename"] == "cassette-run-b1.jsonl"
    assert upload["file"]["content"].count("\n") == 3  # one line per call
    assert KEY not in path.read_text()
    with replay(path) as played:
        replayed = asyncio.run(three_batched_calls(NOWHERE))
    assert replayed == recorded
    assert not played.misses and not played.unused()


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


SECRET_IN_A_PROMPT = "sk-live-AbCdEf0123456789"


def jsonl(n: int) -> bytes:
    return b"".join(json.dumps({
        "custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "gpt-4o-mini", "messages": [
            {"role": "user", "content": f"line {i}; my key is {SECRET_IN_A_PROMPT}"}]},
    }).encode() + b"\n" for i in range(n))


async def follow_a_batch(base_url: str, clock: Clock | None) -> dict[str, Any]:
    """Upload, create, poll until done (the clock moves 20 s a poll while recording), read
    both result files: everything the SDK saw."""
    seen: dict[str, Any] = {"polls": []}
    async with openai.AsyncOpenAI(api_key=KEY, base_url=base_url, max_retries=0) as client:
        upload = await client.files.create(file=("in.jsonl", jsonl(4), "application/jsonl"),
                                           purpose="batch")
        batch = await client.batches.create(input_file_id=upload.id,
                                            endpoint="/v1/chat/completions",
                                            completion_window="24h",
                                            metadata={"planrun_batch": "polls-b1"})
        while batch.status not in ("completed", "failed", "expired", "cancelled"):
            batch = await client.batches.retrieve(batch.id)
            assert batch.request_counts is not None
            seen["polls"].append((batch.status, batch.request_counts.completed))
            if clock is not None:
                clock.now += 20
        assert batch.output_file_id and batch.error_file_id
        seen["output"] = (await client.files.content(batch.output_file_id)).content
        seen["errors"] = (await client.files.content(batch.error_file_id)).content
        listed = await client.batches.list(limit=100)
        seen["listed"] = [b.id for b in listed.data]
    return seen


def test_polls_and_result_files_replay_in_order_and_byte_for_byte(tmp_path: Path) -> None:
    path = tmp_path / "polls.json"
    clock = Clock()
    fake = FakeOpenAI()
    api = FakeBatchAPI(fake, clock=clock, complete_after=60, progress=True,
                       fail_lines={"c3": 500})
    with StandIn(fake, batch_api=api) as server, record(path, made="synthesized"):
        recorded = asyncio.run(follow_a_batch(server.base_url, clock))
    assert recorded["polls"] == [("in_progress", 0), ("in_progress", 1), ("in_progress", 2),
                                 ("completed", 3)]
    assert recorded["errors"].count(b"\n") == 1  # one JSON line: still kept as its bytes
    cassette = Cassette.load(path)
    polls = [i.response.body for i in cassette.interactions
             if i.request.method == "GET" and i.request.path.startswith("/v1/batches/")]
    assert [p["status"] for p in polls] == ["in_progress"] * 3 + ["completed"]
    files = [i.response for i in cassette.interactions if i.request.path.endswith("/content")]
    assert sorted(f.text.encode() for f in files if f.text) == sorted(
        [recorded["output"], recorded["errors"]])
    assert {f.headers["content-type"] for f in files} == {"application/octet-stream"}
    text = path.read_text()
    assert KEY not in text and SECRET_IN_A_PROMPT not in text
    with replay(path) as played:
        replayed = asyncio.run(follow_a_batch(NOWHERE, None))
    assert replayed == recorded
    assert not played.misses and not played.unused()


def form(boundary: str, content: str = '{"custom_id": "a"}\n') -> bytes:
    return (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n"
            f"batch\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"x.jsonl\"\r\nContent-Type: application/jsonl\r\n\r\n"
            f"{content}\r\n--{boundary}--\r\n").encode()


def test_an_upload_matches_whatever_boundary_the_sdk_chose() -> None:
    one, _ = _parse_body(form("aaaa1111"))
    two, _ = _parse_body(form("zz99"))
    assert one == two == {"multipart": {"purpose": "batch", "file": {
        "filename": "x.jsonl", "content": "{\"custom_id\": \"a\"}\n"}}}
    answer = RecordedResponse(200, {}, {"id": "file-1", "object": "file"})
    cassette = Cassette([Interaction(
        RecordedRequest.from_http("POST", "/v1/files", form("recorded-boundary"), None),
        answer)])
    served = cassette.serve(httpx2.Request(
        "POST", "http://x/v1/files", content=form("another-boundary-0123"),
        headers={"content-type": "multipart/form-data; boundary=another-boundary-0123"}))
    assert served.json() == {"id": "file-1", "object": "file"} and not cassette.misses


def test_an_upload_of_other_lines_is_a_miss() -> None:
    cassette = Cassette([Interaction(
        RecordedRequest.from_http("POST", "/v1/files", form("b1"), None),
        RecordedResponse(200, {}, {"id": "file-1"}))])
    request = httpx2.Request("POST", "http://x/v1/files",
                             content=form("b2", '{"custom_id": "z"}\n'))
    with pytest.raises(FixtureMiss):
        cassette.serve(request)


def test_a_file_content_is_kept_as_text_and_served_back_byte_for_byte() -> None:
    raw = b'{"custom_id": "a", "response": null}\n'
    kept = RecordedResponse.from_http(200, {"Content-Type": "application/octet-stream",
                                            "x-request-id": "req_1"}, raw)
    assert kept.text == raw.decode() and kept.body is None
    assert kept.headers == {"content-type": "application/octet-stream", "x-request-id": "req_1"}
    again = RecordedResponse.from_dict(json.loads(json.dumps(kept.to_dict())))
    served = again.to_httpx()
    assert served.content == raw
    assert served.headers["content-type"] == "application/octet-stream"
    # a cassette of before (a text body, no content-type kept) replays as it did
    old = RecordedResponse.from_dict({"status": 200, "headers": {}, "text": "a\nb\n"})
    assert old.to_httpx().content == b"a\nb\n"
    # and a JSON answer is still kept as JSON
    assert RecordedResponse.from_http(200, {"content-type": "application/json"},
                                      b'{"a": 1}').body == {"a": 1}
