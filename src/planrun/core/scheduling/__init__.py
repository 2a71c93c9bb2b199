"""The scheduling core: every rule of a run, in one place, with no I/O.

:class:`Scheduler` holds a run's state and decides (ready, route, retry or die, reclaim,
cancel, lock, budget, deadline, effects due, stall); :class:`RetryPolicy` is the one retry
policy of planrun (the scheduler's and the model client's); :func:`failure_of` turns an
attempt's exception into the :class:`Failure` the scheduler decides on. The in-process
:class:`~planrun.runtime.Supervisor` is the driver over it (its attempts done in process, or by
worker processes on DBOS): it feeds it what happened and carries out what it decided.
"""

from planrun.core.scheduling._approval import (
    Approval,
    as_approval,
    decide_record,
    waiting_cause,
)
from planrun.core.scheduling._common import (
    EFFECT_RETRY,
    Fragment,
    OnDead,
    ReplanRequest,
    RunFacts,
    Sink,
    check_policies,
    dependency_order,
    replans_spent,
    retries_spent,
    spawn_refused,
)
from planrun.core.scheduling._outcome import Failure, ReportedFailure, failure_of, timed_out
from planrun.core.scheduling._retry import (
    SCHEDULER_RETRY,
    STORE_PATIENCE,
    RetryPolicy,
    as_policy,
    store_wait,
)
from planrun.core.scheduling._scheduler import Scheduler
from planrun.core.scheduling._spawn import Addition, SpawnLimits, expand
from planrun.core.scheduling._tiers import (
    DEFAULT_LATENCY_S,
    TIERS,
    Latencies,
    TierChoice,
    TierPolicy,
    batch_take_back,
    check_tiers,
    choose_tier,
    depth_below,
    live_rounds,
    slack_s,
)

__all__ = [
    "DEFAULT_LATENCY_S",
    "EFFECT_RETRY",
    "SCHEDULER_RETRY",
    "STORE_PATIENCE",
    "TIERS",
    "Addition",
    "Approval",
    "Failure",
    "Fragment",
    "Latencies",
    "OnDead",
    "ReplanRequest",
    "ReportedFailure",
    "RetryPolicy",
    "RunFacts",
    "Scheduler",
    "Sink",
    "SpawnLimits",
    "TierChoice",
    "TierPolicy",
    "as_approval",
    "as_policy",
    "batch_take_back",
    "check_policies",
    "check_tiers",
    "choose_tier",
    "decide_record",
    "dependency_order",
    "depth_below",
    "expand",
    "failure_of",
    "live_rounds",
    "replans_spent",
    "retries_spent",
    "slack_s",
    "spawn_refused",
    "store_wait",
    "timed_out",
    "waiting_cause",
]
