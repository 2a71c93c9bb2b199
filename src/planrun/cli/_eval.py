"""``planrun eval``: measure decomposition prompts over a goal set (see :mod:`planrun.dev.eval`).

    planrun eval examples --replay examples --prompts default --prompts strict
    planrun eval goals.jsonl --app myapp:app --prompts a=prompts_a --prompts b=new.md \\
        --record evals/mine.json --json
    planrun eval taskbench --replay taskbench --prompts default --prompts strict \\
        --compare default strict
    planrun eval examples --replay examples_smollm2 --no-code-repair
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["add_eval_parser", "cmd_eval"]


def add_eval_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``eval`` verb on ``subparsers``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "eval", help="measure decomposition prompts over a set of goals",
        description="Decompose every goal of a JSON Lines goal set with every prompt version "
        "and report the share of goals that end with an accepted plan (shape and contracts), "
        "model calls and tokens per accepted plan, model and code repairs, problem codes, "
        "plan size, tokens, cost and (against reference plans) node and link F1.",
    )
    parser.add_argument("goals", help="a goal file (JSON Lines) or a shipped set: examples, "
                        "taskbench")
    parser.add_argument("--prompts", action="append", default=[], metavar="NAME[=PATH]",
                        help="a prompt version: a folder or a decompose.md file; NAME alone "
                        "is 'default' (the shipped prompts) or a shipped variant ('strict'); "
                        "repeat for several")
    parser.add_argument("--app", metavar="module:attr",
                        help="the kinds for goal lines that name no registry")
    parser.add_argument("--model", help="model name (default PLANRUN_MODEL or gpt-4o-mini); "
                        "'test': the offline test model")
    parser.add_argument("--min-tasks", type=int, default=1, metavar="N",
                        help="fewest tasks the decomposer accepts in a plan")
    parser.add_argument("--max-tasks", type=int, default=8, metavar="N",
                        help="most tasks the decomposer accepts in a plan")
    parser.add_argument("--repair-attempts", type=int, default=2, metavar="N",
                        help="repairs of an invalid plan asked of the model per goal")
    parser.add_argument("--no-code-repair", action="store_true",
                        help="ask the model for every repair (no code repairs): the figures "
                        "without the plan compiler's fixes")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"),
                        help="list the goals whose outcome or plan changed from A to B")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--concurrency", type=int, default=None, metavar="N",
                        help="goals decomposed at once (default 4)")
    parser.add_argument("--out", metavar="FILE",
                        help="append each outcome to this JSON Lines file as it is measured; "
                        "outcomes already in it are kept and not measured again")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar on standard error")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--record", metavar="PATH", help="record the model traffic to a cassette")
    group.add_argument("--replay", metavar="PATH",
                       help="answer from a cassette (a path or a shipped set's name)")
    parser.set_defaults(func=cmd_eval)
    return parser


@contextmanager
def _progress(shown: bool) -> Iterator[Any]:
    """A progress bar on standard error (rich's, shown while a terminal watches), fed by
    the evaluation's ``on_outcome``."""
    if not shown or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("goals", total=None)

        def on_outcome(version: str, outcome: Any, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total,
                       description=f"{version}: {outcome.id} {outcome.outcome()}")

        yield on_outcome


def cmd_eval(args: argparse.Namespace) -> int:
    """Run the eval and print the table (or JSON); 0 unless a goal hit an error."""
    from planrun.core import UsageError
    from planrun.dev.eval import evaluate, iter_changed, prompt_versions

    if args.min_tasks < 1 or args.max_tasks < args.min_tasks or args.repair_attempts < 0:
        raise UsageError("need 1 <= --min-tasks <= --max-tasks and --repair-attempts >= 0")
    versions = prompt_versions(args.prompts)
    if args.compare:
        missing = [name for name in args.compare if name not in versions]
        if missing:
            raise UsageError(f"--compare names {missing}, not among the versions "
                             f"{list(versions)}")
    model = None
    if args.replay:
        from planrun.dev.eval import _cassette_path
        from planrun.dev.fixtures import Cassette

        model = Cassette.load(_cassette_path(args.replay)).model(args.model)
    elif args.model:
        from planrun._facade import load_app
        from planrun.dev.testmodel import model_named

        model = model_named(args.model, load_app(args.app) if args.app else None)
    from planrun.dev.eval import DEFAULT_CONCURRENCY

    concurrency = DEFAULT_CONCURRENCY if args.concurrency is None else args.concurrency
    with _progress(not args.no_progress) as on_outcome:
        report = evaluate(
            args.goals, versions, model=model, replay=args.replay, record=args.record,
            registry=args.app, min_tasks=args.min_tasks, max_tasks=args.max_tasks,
            repair_attempts=args.repair_attempts,
            repair="model" if args.no_code_repair else "code",
            command=shlex.join(["planrun", *sys.argv[1:]]),
            concurrency=concurrency, out=args.out, on_outcome=on_outcome,
        )
    if args.json:
        data = report.to_dict()
        if args.compare:
            data["changed"] = report.compare(*args.compare)
        print(json.dumps(data, indent=2))
    else:
        print(report.table())
        if args.compare:
            a, b = args.compare
            lines = list(iter_changed(report, a, b))
            print(f"\nchanged from {a} to {b}: {len(lines)} goal(s)")
            for line in lines:
                print(f"  {line}")
    errors = sum(s["errors"] for s in report.summaries().values())
    return 0 if not errors else 1
