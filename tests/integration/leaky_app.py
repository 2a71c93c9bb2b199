"""An app whose worker fails with secrets in its error text (``leaky_app:app``).

``echo`` raises an error that quotes the request it made, Authorization header included:
the API key of the environment and an ``sk-`` key of some other service.
"""

from __future__ import annotations

import os
from typing import Any

from planrun import App, PermanentError, Registry, TaskContext
from planrun.core import KindSpec

OTHER_KEY = "sk-svcacct-Vb7Nm6Mq5Wn4Eb3Rv2Tt9Yy8Uu7Ii6Oo5Pp4"
"""A key-shaped string the run was never told about."""


async def echo(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    key = os.environ.get("OPENAI_API_KEY", "")
    raise PermanentError(
        f"upstream refused POST /v1/echo with headers {{'authorization': 'Bearer {key}', "
        f"'x-other': '{OTHER_KEY}'}}\nsecond line: key={key}"
    )


registry = Registry([KindSpec("echo", "Echo a request upstream", handler=echo)])
app = App(registry)
