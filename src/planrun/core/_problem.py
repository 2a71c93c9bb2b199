"""What is wrong with a plan (:class:`Problem`) and what the compiler did about it
(:class:`Repair`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Problem", "Repair"]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a plan: a stable ``code``, the task index (or None), a message."""

    code: str
    task: int | None
    message: str

    def __str__(self) -> str:
        prefix = "" if self.task is None else f"task {self.task}: "
        return f"{prefix}{self.code}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        """The problem as JSON-ready data: ``{"code", "task", "message"}``."""
        return {"code": self.code, "task": self.task, "message": self.message}


@dataclass(frozen=True)
class Repair:
    """One fix an accepted plan went through before it was accepted.

    ``by="code"``: a rule of the plan compiler (``rule`` names it) fixed a problem the
    registry settles without a guess. ``by="model"``: the model was shown the problem and
    answered a plan without it. ``task`` is the index the fix concerns in the plan as it
    stood then (the model's reply, or the plan after the repairs before it); ``attempt`` is
    the model reply (from 1) the fix belongs to; ``final_task`` is the index the fix
    concerns in the accepted plan.
    """

    by: Literal["code", "model"]
    code: str
    """The problem code fixed."""
    task: int | None
    detail: str
    """What was done (a code repair) or what the problem was (a model repair)."""
    rule: str | None = None
    attempt: int = 1
    final_task: int | None = None
    """The index, in the accepted plan, of the task the fix concerns (a merged task: the
    one it was merged into). None when the fix concerns no one task of that plan: a model
    repair (its ``task`` is an index of a reply the model replaced) and the reordering of
    the whole plan."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: ``{"by", "code", "task", "detail", "attempt"}``, for a code
        repair ``"rule"``, and ``"final_task"`` when the fix concerns one task of the
        accepted plan."""
        data: dict[str, Any] = {"by": self.by, "code": self.code}
        if self.rule is not None:
            data["rule"] = self.rule
        data.update(task=self.task, detail=self.detail, attempt=self.attempt)
        if self.final_task is not None:
            data["final_task"] = self.final_task
        return data

    def __str__(self) -> str:
        where = "" if self.task is None else f" (task {self.task})"
        how = f"code, {self.rule}" if self.rule else "model"
        return f"{self.code}{where} by {how}: {self.detail}"
