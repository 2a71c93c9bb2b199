"""What an attempt's exception means, as data the scheduler decides on.

A driver (or a worker process) turns the exception a handler raised into a
:class:`Failure` with :func:`failure_of`; it decides nothing else. The scheduler reads the
failure and decides: retry at a time, dead, or stop the run for its budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from planrun.core._errors import BudgetExceeded, ErrorClass, TransientError, classify

__all__ = ["Failure", "ReportedFailure", "failure_of", "timed_out"]


@dataclass(frozen=True, slots=True)
class Failure:
    """An attempt that ended in an error."""

    error: str
    """``"ErrorType: message"``, as stored on the task record."""
    error_class: str
    """:class:`~planrun.core._errors.ErrorClass`: transient or permanent."""
    retry_after: float | None = None
    """Seconds the server asked to wait (``Retry-After``), if it said."""
    budget: bool = False
    """The run's budget refused the attempt's spending: nothing more should start."""


class ReportedFailure(Exception):
    """An attempt's failure as the process that ran it classified it (with
    :func:`failure_of`, there): the driver that hears of it hands it on unchanged."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.error)
        self.failure = failure


def failure_of(exc: BaseException) -> Failure:
    """Classify the exception an attempt raised."""
    if isinstance(exc, ReportedFailure):
        return exc.failure
    from planrun.core._redact import redact  # the key never reaches a record, an event or a report

    error = redact(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, BudgetExceeded):
        return Failure(error, ErrorClass.PERMANENT, budget=True)
    retry_after = getattr(exc, "retry_after", None)
    return Failure(error, classify(exc),
                   float(retry_after) if isinstance(retry_after, int | float) else None)


def timed_out(exc: BaseException, limit: float | None) -> Exception:
    """A timeout as the transient failure it is."""
    if isinstance(exc, TransientError):
        return exc
    if limit is None:  # the handler's own timeout, not ours
        return TransientError(f"{type(exc).__name__}: {exc}")
    return TransientError(f"attempt timed out after {limit} s")
