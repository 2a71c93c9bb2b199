"""When calls waiting in a Batch API job must go live instead: the deadline's rule.

A batched call is cheap and slow: a batch may take minutes or hours. With a deadline, the
run keeps its calls batched only while the time left still covers doing the rest of the
run live: every unfinished task one live call, as many at once as the workers have slots,
and no task before the tasks it depends on. The rule is here, in the core, and nowhere
else; the model client only carries out what it says (cancel the batch, keep the lines
that came back, send the rest live).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

__all__ = ["batch_take_back", "live_rounds"]


def live_rounds(unfinished: Collection[str], dependents: Mapping[str, Sequence[str]],
                slots: int) -> int:
    """Rounds of live calls the ``unfinished`` tasks need, one call each: at least their
    number over ``slots``, and at least their longest chain of dependencies."""
    if not unfinished:
        return 0
    depth: dict[str, int] = {}
    for root in unfinished:
        if root in depth:
            continue
        stack = [(root, False)]
        while stack:  # depth-first, children first, without recursion
            tid, ready = stack.pop()
            below = [d for d in dependents.get(tid, ()) if d in unfinished]
            if ready:
                depth[tid] = 1 + max((depth[d] for d in below), default=0)
                continue
            if tid in depth:
                continue
            stack.append((tid, True))
            stack.extend((d, False) for d in below if d not in depth)
    return max(math.ceil(len(unfinished) / max(1, slots)), max(depth.values()))


def batch_take_back(*, now: float, deadline: float | None, waiting: int, rounds: int,
                    live_s: float, margin_s: float) -> bool:
    """Whether the ``waiting`` batched calls must be taken back and sent live at ``now``.

    The rest of the run needs ``rounds`` rounds of live calls (:func:`live_rounds`) of about
    ``live_s`` seconds each; ``margin_s`` more covers cancelling the batch (the lines it
    finishes meanwhile are kept). True once the time left before ``deadline`` no longer
    exceeds that; never without a deadline or with nothing waiting.
    """
    if deadline is None or waiting <= 0:
        return False
    return deadline - now <= rounds * live_s + margin_s
