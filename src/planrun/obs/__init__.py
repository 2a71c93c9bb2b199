"""Observation: tracing (OpenTelemetry GenAI conventions), run status, console output.

Nothing here changes a run.
"""

from planrun.obs._console import Progress, plan_tree, report_table
from planrun.obs._status import run_status

__all__ = ["Progress", "plan_tree", "report_table", "run_status"]
