"""Batch traffic in a cassette: uploads, batches, polls and result files, recorded from the
stand-in over HTTP and replayed with no server at all."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from pydantic import BaseModel

from planrun import Batching, Model
from planrun.dev.fixtures import Cassette, record, replay
from planrun.dev.testing import FakeOpenAI
from planrun.model import Batcher

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
from standin import StandIn  # noqa: E402

KEY = "sk-standin-batch-cassette-000000000"


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
    return [r.parsed.word for r in replies]


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
    with replay(path) as played:  # nothing listens there: every answer is the cassette's
        replayed = asyncio.run(three_batched_calls("http://127.0.0.1:9/v1"))
    assert replayed == recorded
    assert not played.misses and not played.unused()


def test_an_upload_matches_whatever_boundary_the_sdk_chose() -> None:
    from planrun.dev.fixtures import _parse_body

    def form(boundary: str) -> bytes:
        return (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n"
                f"batch\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
                f"filename=\"x.jsonl\"\r\nContent-Type: application/jsonl\r\n\r\n"
                f"{{\"custom_id\": \"a\"}}\n\r\n--{boundary}--\r\n").encode()

    one, _ = _parse_body(form("aaaa1111"))
    two, _ = _parse_body(form("zz99"))
    assert one == two == {"multipart": {"purpose": "batch", "file": {
        "filename": "x.jsonl", "content": "{\"custom_id\": \"a\"}\n"}}}
