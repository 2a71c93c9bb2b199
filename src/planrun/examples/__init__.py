"""Worked examples: the competitive brief, the ticket triage and the release.

Each module has a ``main()`` that runs it live against the configured endpoint
(``python -m planrun.examples.brief``); :func:`run_main` gives them one way to end: a
report and exit 0 when every task completed, exit 1 otherwise, and a one-paragraph error
(not a traceback) when the run could not happen.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

__all__ = ["run_main"]


def run_main(body: Callable[[], int]) -> int:
    """Run an example's ``main`` body; planrun errors become a message and exit 1 or 2."""
    from planrun.core import ConfigError, InvalidPlan, PlanrunError, UsageError, redact

    try:
        return body()
    except InvalidPlan as exc:
        print(redact(str(exc)), file=sys.stderr)
        return 1
    except (ConfigError, UsageError) as exc:
        print(f"error: {redact(str(exc))}", file=sys.stderr)
        return 2
    except PlanrunError as exc:
        print(f"error: {type(exc).__name__}: {redact(str(exc))}", file=sys.stderr)
        return 1
