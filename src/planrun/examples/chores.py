"""Chores: a durable run of many small tasks, each with an effect, that can be crashed.

The smallest run that shows what a store is for. Each ``chore`` task sleeps a moment and
returns its number; its effect delivers the result to an outbox (a SQLite file whose
table is keyed by the effect key, as an API with idempotency keys would be). Run it in a
process of its own and have it kill itself with SIGKILL after some tasks, then carry the
run on with :func:`planrun.resume_run`::

    python -m planrun.examples.chores --db sqlite:///chores.db --run-id nightly \\
        --tasks 60 --crash-after 20
    planrun resume nightly --db sqlite:///chores.db --app planrun.examples.chores:app
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from planrun._facade import App, plan_and_run
from planrun.core import PlanrunError, Registry, Task, TaskContext, WorkerSpec

__all__ = ["OUTBOX", "app", "delivered", "make_app", "plan"]

OUTBOX = "outbox.db"
"""The outbox file of :data:`app` (in the current directory)."""


def plan(tasks: int) -> list[dict[str, Any]]:
    """A plan of ``tasks`` independent chores."""
    return [{"kind": "chore", "payload": {"n": n}, "depends_on": []} for n in range(tasks)]


def make_app(outbox: str | Path = OUTBOX, *, crash_after: int | None = None,
             seconds: float = 0.02) -> App:
    """The chores app: one worker doing 4 chores at a time, each delivered to ``outbox``.

    Args:
        outbox: the SQLite file the effects write to (created when missing).
        crash_after: kill this process with SIGKILL when this many chores have been done
            (``None``: never). A crash, not an exception: nothing in the process runs after.
        seconds: how long each chore takes.
    """
    done = 0
    registry = Registry()

    @registry.kind("chore", description="Do one chore and return its number")
    async def chore(payload: dict[str, Any], ctx: TaskContext) -> int:
        nonlocal done
        if crash_after is not None and done >= crash_after:
            os.kill(os.getpid(), signal.SIGKILL)
        await asyncio.sleep(seconds)
        done += 1
        return int(payload["n"])

    def deliver(task: Task, key: str) -> None:
        with sqlite3.connect(outbox) as db:
            db.execute("CREATE TABLE IF NOT EXISTS outbox (key TEXT PRIMARY KEY, result)")
            db.execute("INSERT OR IGNORE INTO outbox VALUES (?, ?)", (key, task.result))
        db.close()

    return App(registry, workers=[WorkerSpec("w1", skills={"chore": 1.0}, capacity=4)],
               effects={"chore": deliver})


def delivered(outbox: str | Path = OUTBOX) -> int:
    """How many distinct effect keys reached ``outbox``."""
    if not Path(outbox).exists():
        return 0
    with sqlite3.connect(outbox) as db:
        (count,) = db.execute("SELECT count(*) FROM outbox").fetchone()
    db.close()
    return int(count)


app = make_app()
"""The chores app, its outbox in the current folder (``--app planrun.examples.chores:app``)."""


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chores as a durable run; exit 0 when every chore completed."""
    parser = argparse.ArgumentParser(prog="python -m planrun.examples.chores",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="the store URL (sqlite:///chores.db)")
    parser.add_argument("--run-id", default=None, help="the run's id")
    parser.add_argument("--tasks", type=_positive, default=60, help="how many chores")
    parser.add_argument("--outbox", default=OUTBOX)
    parser.add_argument("--crash-after", type=_positive, default=None, metavar="N",
                        help="SIGKILL this process after N chores")
    args = parser.parse_args(argv)
    try:
        report = plan_and_run(plan(args.tasks), make_app(args.outbox,
                                                         crash_after=args.crash_after),
                              store=args.db, run_id=args.run_id)
    except PlanrunError as exc:  # a bad store URL, a run id in use: one line, exit 2
        print(f"chores: error: {exc}", file=sys.stderr)
        return 2
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
