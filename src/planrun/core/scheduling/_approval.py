"""Approval gates: what a task waits for, and how a decision is written on its record.

A gated task waits in status ``waiting``; its ``cause`` says for what
(``approval:start`` or ``approval:effect``) and ``not_before`` holds the time its approval
timeout decides by default (None: no timeout). A person's decision taken in another
process (the CLI) is written on the waiting record itself, as ``approve:<stage>`` or
``reject:<stage>`` in ``cause`` with the note or reason in ``error``; the run's driver
reads it and the core carries it out, so every status change is still the core's, with its
ledger event, and a decision written while no driver runs is carried out at resume.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from planrun.core._errors import UsageError
from planrun.core._task import Status, Task

__all__ = ["APPROVED", "REJECTED", "Approval", "Stage", "as_approval",
           "recorded_decision", "stage_of", "waiting_cause"]

Stage = Literal["start", "effect"]
STAGES: tuple[str, ...] = ("start", "effect")

APPROVED = "approved"
"""``cause`` of a task a person approved (it never waits again)."""
REJECTED = "rejected"
"""``cause`` of a dead task a person (or a timeout) rejected."""

_WAIT = "approval:"
_DECISIONS = ("approve:", "reject:")


@dataclass(frozen=True)
class Approval:
    """A task needs a person's approval before it starts or before its effect is applied.

    Args:
        before: ``"start"`` (the task waits before its first attempt) or ``"effect"`` (the
            attempt runs, its result is kept, and the task completes, so that its effect is
            applied and its dependents start, only once approved).
        timeout_s: seconds after which ``on_timeout`` decides (None: wait for ever).
        on_timeout: ``"reject"`` (default) or ``"approve"``.
        when: the approval applies only to tasks for which ``when(task)`` is true (None:
            every task it names). Before the effect it sees the record with its result, so
            a result can decide (a reply to a security incident).
    """

    before: Stage = "start"
    timeout_s: float | None = None
    on_timeout: Literal["approve", "reject"] = "reject"
    when: Callable[[Task], bool] | None = None

    def applies(self, task: Task) -> bool:
        """Whether ``task`` needs this approval (a ``when`` that raises: it does)."""
        if self.when is None:
            return True
        try:
            return bool(self.when(task))
        except Exception:  # cannot tell: a person decides rather than nobody
            return True

    def __post_init__(self) -> None:
        if self.before not in STAGES:
            raise UsageError(f"Approval.before must be 'start' or 'effect', not {self.before!r}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise UsageError(f"Approval.timeout_s must be > 0 or None, got {self.timeout_s}")
        if self.on_timeout not in ("approve", "reject"):
            raise UsageError(
                f"Approval.on_timeout must be 'approve' or 'reject', not {self.on_timeout!r}")


def as_approval(value: Approval | str) -> Approval:
    """An :class:`Approval` from itself or a stage name (``"start"``, ``"effect"``)."""
    if isinstance(value, Approval):
        return value
    if value not in STAGES:
        raise UsageError(f"an approval is 'start', 'effect' or an Approval, not {value!r}")
    return Approval(before=value)  # type: ignore[arg-type]


def waiting_cause(stage: str) -> str:
    """The ``cause`` of a task waiting for approval at ``stage``."""
    return _WAIT + stage


def stage_of(task: Task) -> str:
    """What a waiting task waits for: ``"start"`` or ``"effect"``."""
    cause = task.cause or ""
    return cause.split(":", 1)[1] if ":" in cause else "start"


def recorded_decision(task: Task) -> tuple[bool, str | None] | None:
    """The decision written on a waiting record by another process: (approved, note)."""
    if task.status is not Status.WAITING or not task.cause:
        return None
    if task.cause.startswith("approve:"):
        return True, task.error
    if task.cause.startswith("reject:"):
        return False, task.error
    return None


def decide_record(task: Task, approve: bool, note: str | None) -> Task:
    """``task`` with a person's decision written on it (still ``waiting``).

    Raises:
        UsageError: the task is not waiting for approval, or was already decided.
    """
    if task.status is not Status.WAITING:
        raise UsageError(
            f"task {task.id!r} is not waiting for approval (it is {task.status.value})")
    cause = task.cause or ""
    if cause.startswith(_DECISIONS):
        verb = "approved" if cause.startswith("approve:") else "rejected"
        raise UsageError(f"task {task.id!r} was already {verb}")
    prefix = "approve:" if approve else "reject:"
    return task.evolve(cause=prefix + stage_of(task), error=note)


