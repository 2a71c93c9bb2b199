"""The live tier: the real ``openai`` SDK against ``tools/standin.py`` on a loopback port.

Nothing is mocked here. The stand-in is a real HTTP/1.1 keep-alive server
(``ThreadingHTTPServer``) on 127.0.0.1 and an ephemeral port, started per test in a thread;
the SDK opens real sockets to it, pools them and reuses them, so a transport bug (a
connection pool bound to a closed event loop, a reset connection, a body that is not JSON)
fails a test here even when every replay passes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))

from standin import StandIn, for_scenario  # noqa: E402

from planrun.model import Model, RetryPolicy  # noqa: E402

LIVE_KEY = "sk-live-tier-Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0Lz9Xc8"
"""A key-shaped placeholder: the stand-in accepts any bearer token."""

FAST_RETRY = RetryPolicy(attempts=4, base=0.01, cap=0.05, jitter=0.0)
"""Real waits, but short ones: the live tier runs on real time."""

Start = Callable[..., StandIn]


@pytest.fixture
def standin() -> Iterator[Start]:
    """Start a stand-in (``for_scenario`` arguments); every one started is stopped after."""
    started: list[StandIn] = []

    def start(scenario: str | None = None, **options: Any) -> StandIn:
        server = for_scenario(scenario, **options).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def server(standin: Start) -> StandIn:
    """A plain stand-in: every example's answers, no scripted failures."""
    return standin()


def live_model(server: StandIn, **options: Any) -> Model:
    """A Model aimed at ``server`` with short real retries."""
    options.setdefault("retry", FAST_RETRY)
    return Model("gpt-4o-mini", api_key=LIVE_KEY, base_url=server.base_url, **options)
