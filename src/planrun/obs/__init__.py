"""Observation: tracing (OpenTelemetry GenAI conventions), run status, console output.

Nothing here changes a run.
"""

from planrun.obs._console import Progress, plan_tree, report_table
from planrun.obs._status import (
    RunStatus,
    Sample,
    SpendSample,
    run_status,
    spend_timeline,
    spent_by_task,
    spent_by_tier,
    timeline,
)

__all__ = ["Progress", "RunStatus", "Sample", "SpendSample", "plan_tree", "report_table",
           "run_status", "spend_timeline", "spent_by_task", "spent_by_tier",
           "timeline"]
