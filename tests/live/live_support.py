"""Helpers of the live tier (imported by its tests; the fixtures are in ``conftest.py``)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))

from standin import StandIn  # noqa: E402

from planrun.model import Model, RetryPolicy  # noqa: E402

LIVE_KEY = "sk-live-tier-Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0Lz9Xc8"
"""A key-shaped placeholder: the stand-in accepts any bearer token."""

FAST_RETRY = RetryPolicy(attempts=4, base=0.01, cap=0.05, jitter=0.0)
"""Real waits, but short ones: the live tier runs on real time."""

Start = Callable[..., StandIn]


def live_model(server: StandIn, **options: Any) -> Model:
    """A Model aimed at ``server`` with short real retries."""
    options.setdefault("retry", FAST_RETRY)
    return Model("gpt-4o-mini", api_key=LIVE_KEY, base_url=server.base_url, **options)
