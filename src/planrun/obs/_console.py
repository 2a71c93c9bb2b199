"""Terminal rendering with rich: the plan as a tree, live progress, the final report.

Kept apart from the supervisor and the runner, which never print.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from types import TracebackType
from typing import Protocol

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from planrun.core import Event, Plan, Status, Task, redact

__all__ = ["Progress", "plan_tree", "report_table"]


class _TaskLine(Protocol):
    """What :func:`report_table` reads of a :class:`planrun.TaskReport`."""

    @property
    def id(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def status(self) -> str: ...

    @property
    def attempts(self) -> int: ...

    @property
    def tokens(self) -> int: ...

    @property
    def cost_usd(self) -> float: ...

    @property
    def error(self) -> str | None: ...

    @property
    def cause(self) -> str | None: ...


class _Report(Protocol):
    """What :func:`report_table` reads of a :class:`planrun.RunReport`."""

    @property
    def run_id(self) -> str: ...

    @property
    def tasks(self) -> Sequence[_TaskLine]: ...

_STYLE = {
    "pending": "dim", "assigned": "cyan", "running": "yellow", "completed": "green",
    "failed": "magenta", "dead": "bold red", "cancelled": "red", "waiting": "blue",
}


def _label(plan: Plan, index: int) -> str:
    task = plan.tasks[index]
    payload = ", ".join(f"{k}={v!r}" for k, v in list(task.payload.items())[:2])
    if len(payload) > 70:
        payload = payload[:67] + "..."
    return f"[bold]{index}[/] {task.kind}" + (f" [dim]({payload})[/]" if payload else "")


def plan_tree(plan: Plan, limit: int | None = None) -> Tree:
    """The plan as a tree: each task under the last of its dependencies, others noted.

    With ``limit``, only the first ``limit`` tasks (in dependency order) are drawn.
    """
    tree = Tree(f"[bold]{plan.goal or 'plan'}[/] [dim]({len(plan.tasks)} tasks)[/]")
    nodes: dict[int, Tree] = {}
    order = plan.topological_order()
    if limit is not None and len(order) > limit:
        order = order[:limit]
        tree.add(f"[dim]... and {len(plan.tasks) - limit} more tasks[/]")
    for i in order:
        deps = sorted(plan.tasks[i].depends_on)
        parent = nodes[deps[-1]] if deps else tree
        extra = f" [dim]after {', '.join(map(str, deps))}[/]" if len(deps) > 1 else ""
        nodes[i] = parent.add(_label(plan, i) + extra)
    return tree


class Progress:
    """Live counts by status and per-worker activity, fed by the supervisor's events."""

    def __init__(self, total: int, console: Console | None = None) -> None:
        self.total = total
        self.console = console or Console()
        self.status: dict[str, str] = {}
        self.active: Counter[str] = Counter()
        self.events = 0
        self._live: Live | None = None

    def __call__(self, event: Event, task: Task) -> None:
        """The ``progress``/``on_event`` hook."""
        self.events += 1
        previous = self.status.get(task.id)
        self.status[task.id] = task.status.value
        if task.status is Status.RUNNING and event.worker:
            self.active[event.worker] += 1
        elif previous == "running" and event.worker:
            self.active[event.worker] -= 1
        if self._live is not None and self.events % 5 == 0:
            self._live.update(self.render())

    def render(self) -> Table:
        """The current state as a small table."""
        counts = Counter(self.status.values())
        done = sum(counts[s] for s in ("completed", "dead", "cancelled"))
        table = Table.grid(padding=(0, 2))
        line = Text(f"{done}/{max(self.total, len(self.status))} finished  ")
        for status in ("running", "waiting", "completed", "failed", "dead", "cancelled"):
            if counts[status]:
                line.append(f"{status} {counts[status]}  ", style=_STYLE[status])
        table.add_row(line)
        busy = ", ".join(f"{w}:{n}" for w, n in sorted(self.active.items()) if n > 0)
        table.add_row(Text(f"active: {busy or '-'}", style="dim"))
        return table

    def __enter__(self) -> Progress:
        self._live = Live(self.render(), console=self.console, refresh_per_second=8,
                          transient=False)
        self._live.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._live is not None:
            self._live.update(self.render())
            self._live.__exit__(exc_type, exc, tb)
            self._live = None
            if not self.console.is_terminal and not self.console.is_jupyter:
                # Off a terminal the last render ends without a line break (rich ends the
                # line only on a terminal): what is printed next would follow on its line.
                self.console.line()


def report_table(report: _Report, limit: int = 20) -> Table:
    """Per-task outcome: status, attempts, tokens, cost, and the error or cause."""
    table = Table(title=f"run {report.run_id}", show_lines=False)
    for col in ("task", "kind", "status", "attempts", "tokens", "cost $"):
        table.add_column(col, justify="right" if col in ("attempts", "tokens", "cost $") else
                         "left", overflow="fold")
    # The error is shown whole, wrapped to the width there is (a terminal's, or 80 columns
    # when piped), never cut: a server's message often says what is wrong on its later
    # lines. Every column may fold, so the table fits however narrow the width.
    table.add_column("note", overflow="fold", ratio=1)
    for t in report.tasks[:limit]:
        note = redact(t.error) if t.error else (f"cause: {t.cause}" if t.cause else "")
        table.add_row(t.id, t.kind, Text(t.status, style=_STYLE.get(t.status, "")),
                      str(t.attempts), str(t.tokens), f"{t.cost_usd:.5f}", Text(note))
    if len(report.tasks) > limit:
        table.caption = f"... and {len(report.tasks) - limit} more tasks"
    return table

