"""What ``planrun status`` and the run viewer read of a stored run: written once for both."""

from __future__ import annotations

from typing import Any

from planrun.obs import RunStatus, run_status
from planrun.stores import RunState, SQLStore

__all__ = ["read_status"]


async def read_status(store: SQLStore, state: RunState, now: float) -> RunStatus:
    """The status of the run ``state`` holds at ``now``, with its spend row and its rate
    limit: the shared limiter's row, or the rates the run recorded when one process keeps
    its limiter in memory."""
    from planrun.model import RunLimits

    limits = RunLimits.from_meta(state.run.meta)
    limiter: Any = await store.limiter_state(limits.key) if limits.key else None
    if limiter is None and limits.rated:  # kept in memory by the one process running it
        limiter = {"key": limits.key, "rpm": limits.rpm, "tpm": limits.tpm,
                   "shared": False, "recent_rpm": None}
    return run_status(state, now, await store.spend(state.run.id), limiter)
