"""Cassettes of the Responses API: recorded from the stand-in over HTTP, replayed offline."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from live_support import LIVE_KEY, live_model
from standin import StandIn

from planrun._facade import aplan_and_run
from planrun.dev.fixtures import FixtureMiss, record, replay
from planrun.examples import release
from planrun.runtime._clock import VirtualClock


def _release(model: object, clock: object = None) -> object:
    return aplan_and_run(release.RELEASE_PLAN, release.make_app(), model=model,  # type: ignore[arg-type]
                         clock=clock)  # type: ignore[arg-type]


def test_a_responses_run_records_and_replays(live_server: StandIn, tmp_path: Path) -> None:
    server = live_server
    path = tmp_path / "release_responses.json"
    with record(path, made="synthesized") as recorder:
        live = asyncio.run(_release(live_model(server, api="responses")))  # type: ignore[arg-type]
    assert {i.request.path for i in recorder.cassette.interactions} == {"/v1/responses"}
    assert {i.request.schema_name for i in recorder.cassette.interactions} == {
        "migrate_db", "deploy_app", "smoke_test"}
    text = path.read_text()
    assert LIVE_KEY not in text and "input_tokens" in text
    sent = server.requests
    clock = VirtualClock()
    with replay(path) as cassette:
        replayed = clock.run(_release(cassette.model(api="responses"), clock))  # type: ignore[arg-type]
    assert server.requests == sent  # nothing reached the server
    assert not cassette.unused()
    assert replayed.results() == live.results()  # type: ignore[attr-defined]
    assert replayed.usage.total == live.usage.total  # type: ignore[attr-defined]
    assert "tokens:" in cassette.summary() and " 0 prompt" not in cassette.summary()


def test_a_chat_request_misses_a_responses_cassette(live_server: StandIn, tmp_path: Path) -> None:
    server = live_server
    path = tmp_path / "responses.json"
    with record(path, made="synthesized"):
        asyncio.run(live_model(server, api="responses").complete("hello"))
    with pytest.raises(FixtureMiss, match="POST /v1/chat/completions"), replay(path) as cassette:
        asyncio.run(cassette.model().complete("hello"))
