"""One thing wrong with a plan, as validation reports it and :class:`InvalidPlan` carries it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Problem"]


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
