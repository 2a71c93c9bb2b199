"""Which tier each model call goes at: the deadline's one rule of cost against speed.

A model call can go at one of four tiers, cheapest first:

- ``batch``: a line of a Batch API job, at half price, answered within hours;
- ``flex``: at the Batch API's price, answered at once but more slowly, and sometimes
  refused for want of capacity;
- ``default``: the list price;
- ``priority``: faster, at a higher price.

The rule (:func:`choose_tier`): with a deadline, the rest of the run needs ``rounds``
rounds of calls at the default tier (:func:`live_rounds`: every unfinished task one call,
as many at once as the workers have slots, and no task before the tasks it depends on). A
ready task's *slack* (:func:`slack_s`) is the time left before the deadline beyond what
the rest of the run needs at the default tier, counting for its own chain only the tasks
that depend on it: ``deadline - now - max(unfinished / slots, depth) * lat(default) -
margin``. Its call goes at the cheapest allowed tier whose extra latency over the default
tier (``lat(tier) - lat(default)``) fits that slack; when none fits (the slack is spent),
at the fastest allowed tier (before the run has any answer to learn from, at the default
one: the starting figures are a worst case, no evidence that the slack is gone). Without
a deadline nothing is at stake: the cheapest allowed tier.

The Batch API's take-back (:func:`batch_take_back`) is a case of the same rule: calls
waiting in a batch go live once the run's slack (its whole longest chain counted) is gone.

Latencies are learned (:class:`Latencies`), per kind and tier, from the run's own answers,
starting from conservative figures (a live tier not tried yet is scaled from one that was).
The rule is here, in the core, and nowhere else: the model client only sends the tier a
:class:`TierChoice` names.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from planrun.core._errors import UsageError

__all__ = ["DEFAULT_LATENCY_S", "TIERS", "Latencies", "TierChoice", "TierPolicy",
           "batch_take_back", "check_tiers", "choose_tier", "depth_below", "live_rounds",
           "slack_s"]

TIERS = ("batch", "flex", "default", "priority")
"""Every tier, cheapest first (``batch`` and ``flex`` bill the same; a batch spares the
live rate limits, so it comes first)."""

DEFAULT_LATENCY_S: Mapping[str, float] = {
    "batch": 3600.0, "flex": 300.0, "default": 30.0, "priority": 15.0}
"""Seconds one call is taken to need at each tier before the run has seen any answer at it:
on the slow side for the cheap tiers (a cheap tier is not chosen on hope), so that the run
learns a cheap tier's real figure only where the slack allows its worst case."""


def check_tiers(tiers: Iterable[str]) -> tuple[str, ...]:
    """The allowed tiers, cheapest first, ``default`` always among them; a
    :class:`~planrun.core.UsageError` in one line for a name that is no tier."""
    if isinstance(tiers, str):
        tiers = [t for t in tiers.split(",") if t.strip()]
    names = {str(t).strip() for t in tiers}
    unknown = sorted(names - set(TIERS))
    if unknown:
        raise UsageError(f"unknown tier {unknown[0]!r}: tiers are "
                         f"{', '.join(t for t in TIERS if t != 'default')} (and default)")
    return tuple(t for t in TIERS if t in names or t == "default")


def depth_below(task: str, unfinished: Container[str],
                dependents: Mapping[str, Sequence[str]]) -> int:
    """How many calls, one after the other, ``task`` and the unfinished tasks that depend
    on it need: 1 plus the longest chain of its unfinished dependents (0 when ``task``
    itself is finished)."""
    if task not in unfinished:
        return 0
    return _depths([task], unfinished, dependents)[task]


def _depths(roots: Iterable[str], unfinished: Container[str],
            dependents: Mapping[str, Sequence[str]]) -> dict[str, int]:
    depth: dict[str, int] = {}
    for root in roots:
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
    return depth


def live_rounds(unfinished: Collection[str], dependents: Mapping[str, Sequence[str]],
                slots: int) -> int:
    """Rounds of calls the ``unfinished`` tasks need, one call each: at least their
    number over ``slots``, and at least their longest chain of dependencies."""
    if not unfinished:
        return 0
    depth = _depths(unfinished, unfinished, dependents)
    return max(math.ceil(len(unfinished) / max(1, slots)), max(depth.values()))


def slack_s(*, now: float, deadline: float, unfinished: int, depth: int, slots: int,
            default_s: float, margin_s: float = 0.0) -> float:
    """The time left before ``deadline`` beyond what the rest of the run needs at the
    default tier: ``unfinished`` calls ``slots`` at once, and at least ``depth`` of them one
    after the other, ``default_s`` seconds each, plus ``margin_s``. Negative when even the
    default tier is too slow."""
    return deadline - now - rounds_ahead(unfinished, depth, slots) * default_s - margin_s


def rounds_ahead(unfinished: int, depth: int, slots: int) -> int:
    """Rounds of calls ``unfinished`` tasks need, ``slots`` at once and at least ``depth``
    of them one after the other."""
    return max(math.ceil(unfinished / max(1, slots)), depth)


@dataclass(frozen=True)
class TierChoice:
    """The tier a task's model calls go at, as the rule chose it for one attempt; it
    travels with the attempt (to a worker process too: :meth:`to_dict`).

    Args:
        tier: ``batch``, ``flex``, ``default`` or ``priority``.
        slack_s: the task's slack when chosen (None: the run has no deadline).
        flex_retry_s: for ``flex``: how long after the choice a call that flex refused for
            want of capacity may still be sent at flex again; after that it goes at the
            default tier at once (its round's share of the slack that is left once flex's
            extra time is paid: the calls of every round ahead wait for flex in turn).
    """

    tier: str = "default"
    slack_s: float | None = None
    flex_retry_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (:meth:`from_dict` reads it back)."""
        return {"tier": self.tier, "slack_s": self.slack_s, "flex_retry_s": self.flex_retry_s}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> TierChoice | None:
        """A choice from :meth:`to_dict` output, or None for none."""
        if not data:
            return None
        slack = data.get("slack_s")
        return cls(str(data.get("tier", "default")), None if slack is None else float(slack),
                   float(data.get("flex_retry_s", 0.0)))


def choose_tier(*, allowed: Sequence[str], slack: float | None,
                latency: Mapping[str, float], rounds: int = 1,
                learned: bool = True) -> TierChoice:
    """The cheapest of ``allowed`` (cheapest first, as :func:`check_tiers` gives them)
    whose extra latency over the default tier fits ``slack``; when none fits, the fastest
    allowed; without a deadline (``slack`` None) the cheapest. ``latency``: seconds of one
    call at each tier; ``rounds``: the rounds of calls ahead, which share what is left of
    the slack (a refused flex call's :attr:`TierChoice.flex_retry_s`). ``learned``: the
    latencies come from the run's answers; before any (the starting figures are a worst
    case, not evidence that the slack is spent) a call that fits no tier goes at the
    default one, not the fastest."""
    if slack is None:
        return TierChoice(allowed[0] if allowed else "default")
    base = latency["default"]
    for tier in allowed:
        extra = latency[tier] - base
        if extra <= slack:
            room = (slack - extra) / max(1, rounds) if tier == "flex" else 0.0
            return TierChoice(tier, slack, room)
    if not learned:
        return TierChoice("default", slack)
    fastest = min(allowed or ("default",), key=lambda t: (latency[t], TIERS.index(t)))
    return TierChoice(fastest, slack)


def batch_take_back(*, now: float, deadline: float | None, waiting: int, rounds: int,
                    live_s: float, margin_s: float) -> bool:
    """Whether the ``waiting`` batched calls must be taken back and sent live at ``now``:
    the case of :func:`choose_tier` where batch no longer fits because the run's slack
    (:func:`slack_s`, its ``rounds`` of :func:`live_rounds` at ``live_s`` each, plus
    ``margin_s`` for cancelling the batch) is gone. Never without a deadline or with
    nothing waiting."""
    if deadline is None or waiting <= 0:
        return False
    return slack_s(now=now, deadline=deadline, unfinished=0, depth=rounds, slots=1,
                   default_s=live_s, margin_s=margin_s) <= 0


class Latencies:
    """Seconds one model call takes, learned per kind and tier from the run's answers.

    Before any answer, a conservative figure per tier (``defaults``, over
    :data:`DEFAULT_LATENCY_S`). Each answer moves an exponentially weighted mean and mean
    deviation (the first answers weigh most); the figure is the mean plus twice the
    deviation, so an unsteady tier is taken to be slow. A kind with no answer at a tier yet
    uses the tier's figure over every kind; a live tier with no answer at all (``flex``,
    ``default``, ``priority``) is scaled from one that has answers, in the ratio of their
    starting figures (so one answer at priority also tells how slow flex is taken to be).
    """

    ALPHA = 0.2
    """The weight of a new answer once five were seen."""

    LIVE = ("default", "priority", "flex")
    """The tiers whose figures are scaled from one another."""

    def __init__(self, defaults: Mapping[str, float] | None = None) -> None:
        figures = dict(DEFAULT_LATENCY_S)
        for tier, seconds in (defaults or {}).items():
            check_tiers([tier])
            if isinstance(seconds, bool) or not isinstance(seconds, int | float) or \
                    not seconds > 0:
                raise UsageError(f"the latency of tier {tier!r} must be seconds > 0, got "
                                 f"{seconds!r}")
            figures[tier] = float(seconds)
        self.defaults: Mapping[str, float] = figures
        self._seen: dict[tuple[str | None, str], tuple[int, float, float]] = {}

    def observe(self, kind: str | None, tier: str, seconds: float) -> None:
        """One answer of ``kind`` served at ``tier`` took ``seconds``."""
        if tier not in self.defaults or not seconds >= 0:
            return
        for key in {(kind, tier), (None, tier)}:
            n, mean, dev = self._seen.get(key, (0, 0.0, 0.0))
            if n == 0:
                self._seen[key] = (1, seconds, seconds / 4)
                continue
            alpha = max(self.ALPHA, 1 / (n + 1))
            mean += alpha * (seconds - mean)
            dev += alpha * (abs(seconds - mean) - dev)
            self._seen[key] = (n + 1, mean, dev)

    def _learned(self, tier: str, kind: str | None) -> float | None:
        seen = self._seen.get((kind, tier)) or self._seen.get((None, tier))
        return None if seen is None else seen[1] + 2 * seen[2]

    def of(self, tier: str, kind: str | None = None) -> float:
        """The figure of one call of ``kind`` (None: any) at ``tier``."""
        learned = self._learned(tier, kind)
        if learned is not None:
            return learned
        if tier in self.LIVE:
            for other in self.LIVE:
                known = self._learned(other, kind)
                if known is not None:
                    return known * self.defaults[tier] / self.defaults[other]
        return self.defaults[tier]

    @property
    def learned_live(self) -> bool:
        """Some answer at a live tier was learned from (every live figure is then scaled
        from evidence)."""
        return any((None, tier) in self._seen for tier in self.LIVE)

    def answers(self, tier: str, kind: str | None = None) -> int:
        """How many answers at ``tier`` (of ``kind``; None: of any kind) were learned from."""
        return self._seen.get((kind, tier), (0, 0.0, 0.0))[0]

    def table(self, kind: str | None = None) -> dict[str, float]:
        """The figure of every tier for ``kind``."""
        return {tier: self.of(tier, kind) for tier in TIERS}


class TierPolicy:
    """A run's tiers: the allowed ones, their learned latencies, and the rule that picks one
    for each ready task (:meth:`choose`). Held by the run's
    :class:`~planrun.core.scheduling.Scheduler`, whose state it reads.

    Args:
        tiers: the tiers a call may go at beside ``default`` (``flex``, ``priority``,
            ``batch``); empty: every call at the default tier, and nothing is chosen; None:
            those a resumed run stored (:meth:`resume`).
        latency_s: starting figures per tier (over :data:`DEFAULT_LATENCY_S`).
        slots: calls the run's workers make at once (None: a runner sets it from the app).
        margin_s: time kept in hand beside the default tier's need.
    """

    def __init__(self, tiers: Iterable[str] | None = (), *,
                 latency_s: Mapping[str, float] | None = None, slots: int | None = None,
                 margin_s: float = 0.0) -> None:
        self.given = tiers is not None
        self.allowed = check_tiers(tiers or ())
        self.latencies = Latencies(latency_s)
        self.slots = None if slots is None else max(1, int(slots))
        self.margin_s = float(margin_s)

    def resume(self, stored: Iterable[str] | None) -> None:
        """The tiers a resumed run was started with, unless others were given."""
        if not self.given and stored:
            self.allowed = check_tiers(stored)

    @property
    def active(self) -> bool:
        """True when a tier beside the default one is allowed."""
        return self.allowed != ("default",)

    def choose(self, *, now: float, deadline: float | None, kind: str | None,
               unfinished: int, depth: int, exclude: Collection[str] = ()) -> TierChoice:
        """The tier of a ready task's call at ``now`` (see :func:`choose_tier`): ``depth``
        is the task's own chain (:func:`depth_below`), ``unfinished`` the run's unfinished
        tasks; ``exclude``: tiers no longer usable (a batch taken back, a tier the
        provider rejected)."""
        allowed = [t for t in self.allowed if t not in exclude] or ["default"]
        latency = self.latencies.table(kind)
        if deadline is None:
            return choose_tier(allowed=allowed, slack=None, latency=latency)
        slots = self.slots or 1
        slack = slack_s(now=now, deadline=deadline, unfinished=unfinished, depth=depth,
                        slots=slots, default_s=latency["default"], margin_s=self.margin_s)
        return choose_tier(allowed=allowed, slack=slack, latency=latency,
                           rounds=rounds_ahead(unfinished, depth, slots),
                           learned=self.latencies.learned_live)
