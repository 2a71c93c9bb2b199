"""Observation: tracing (OpenTelemetry GenAI conventions), run status, console output.

Nothing here changes a run.
"""

from planrun.obs._console import Progress, plan_tree, report_table
from planrun.obs._status import RunStatus, Sample, run_status, timeline

__all__ = ["Progress", "RunStatus", "Sample", "plan_tree", "report_table", "run_status", "timeline"]
