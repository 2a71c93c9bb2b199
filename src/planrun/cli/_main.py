"""The ``planrun`` command line.

    planrun validate PLAN.json --kinds a,b,c [--json] [--min-tasks N] [--max-tasks N]
    planrun simulate (--scenario FILE|NAME | --durations 10,2,2 --workers 3) [--strategy S] [--json]
    planrun compare [--rules R,R] [--agent-rules AGENT=R,R]... [--db-failures N]
                [--deploy1-failures N] [--max-retries N] [--sweep] [--ledger] [--json]
    planrun plan GOAL --app module:attr [--json]
    planrun estimate PLAN.json --app module:attr [--model M] [--tiers flex,priority,batch]
                [--rpm N] [--tpm N] [--json]
    planrun run GOAL|PLAN.json --app module:attr [--strategy S] [--budget-tokens N]
                [--budget-usd X [--force]] [--rpm N] [--tpm N] [--deadline S]
                [--tiers flex,priority,batch] [--db URL] [--run-id ID] [--json]
    planrun run PLAN.json --app module:attr --db URL --workers external [--stale-after S]
    planrun worker --db URL --app module:attr [--kinds a,b] [--concurrency N] [--name NAME]
                   [--rpm N] [--tpm N]
    planrun resume RUN_ID --db URL [--app module:attr]
    planrun demo [brief|tickets|triage|batch|release] [--live]
    planrun fixtures check [PATH...] | fixtures show PATH
    planrun runs --db URL [--json]
    planrun status RUN_ID --db URL [--watch] [--json]
    planrun --version

Each verb has an ``_add_<verb>(subparsers)`` that declares its arguments and sets
``func=_cmd_<verb>``; ``_cmd_<verb>(args)`` returns the exit status. To add a verb, write
both and call ``_add_<verb>`` from :func:`_build_parser`.

Exit status: 0 success, 2 an invalid plan or a usage error (bad arguments, an unreadable
file, a resume refused because a live process owns the run); errors are one line on
stderr, ``planrun: error: ...``, never a traceback; with ``--json``, one JSON object on
stdout, ``{"error": ..., "problems": [...]}`` (:func:`_fail`). A reader of stdout that went
away ends the command quietly, status 141 (:func:`_closed_pipe`).
``planrun resume`` of a run that is already finished (or aborted) says so in one line and
exits 0: there is nothing to do.
``planrun runs`` and ``planrun status`` show a run that is not finished and has no live
owner as ``interrupted`` (resumable), however it stopped.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import re
import shlex
import sys
import threading
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from planrun.core import InvalidPlan, Plan, PlanrunError, redact, validate_plan
from planrun.obs import tracing
from planrun.stores.base import FINISHED_RUN

__all__ = ["main"]

EXIT_OK = 0
EXIT_INVALID = 2
EXIT_USAGE = 2

_Subparsers = Any  # argparse._SubParsersAction is private; keep it out of signatures


class _CliError(Exception):
    """A usage problem found while running a verb; printed as one line, exit 2."""


class _ArgumentsError(Exception):
    """Arguments argparse refused: shown by :func:`_main` as any other error (JSON with
    ``--json``), ``planrun VERB: error: ... (see --help)``, exit 2."""

    def __init__(self, prog: str, message: str) -> None:
        super().__init__(f"{message} (see '{prog} --help')")
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line: ``planrun VERB: error: ... (see --help)``.

    Sub-parsers are made of the same class, so every verb's errors read alike.
    """

    def error(self, message: str) -> Any:  # argparse's signature says NoReturn
        raise _ArgumentsError(self.prog, message)


def _version() -> str:
    try:
        return metadata.version("planrun")
    except metadata.PackageNotFoundError:
        return "unknown"


def _kind_list(text: str) -> list[str]:
    names: list[str] = []
    for part in text.split(","):
        name = part.strip()
        if name and name not in names:
            names.append(name)
    if not names:
        raise argparse.ArgumentTypeError(
            "needs at least one kind name, e.g. --kinds fetch,summarise"
        )
    return names


_MAX_INT_FLAG = 10**9
_MAX_SECONDS = 7 * 24 * 3600.0
"""The largest number of seconds any flag takes (a week): more is a typo, not a plan."""


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text.strip()) if len(text) <= 20 else None
    except ValueError:
        value = None
    if value is None:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text[:40]!r}")
    if value < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
    if value > _MAX_INT_FLAG:
        raise argparse.ArgumentTypeError(f"must be at most {_MAX_INT_FLAG}, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    return _int_at_least(text, 0)


def _positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text[:40]!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text[:40]!r}")
    return value


def _positive_float(text: str) -> float:
    value = _number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _seconds(text: str) -> float:
    """A duration flag: more than 0 and at most a week."""
    value = _positive_float(text)
    if value > _MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"must be at most {_MAX_SECONDS:g} s, got {text}")
    return value


def _interval(text: str) -> float:
    """A refresh interval: at least 0.1 s (a smaller one is a busy loop), at most an hour."""
    value = _positive_float(text)
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"must be between 0.1 and 3600 seconds, got {text}")
    return value


_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}")


def _run_id(text: str) -> str:
    """A run id: letters, digits and ``_.:-``, at most 100, starting with a letter or digit
    (it is typed again in ``planrun resume ID``)."""
    if _RUN_ID.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(
            f"expected up to 100 letters, digits, '_', '.', ':' or '-', got {text[:40]!r}")
    return text


def _read_input(path: str) -> bytes | str:
    """The bytes of ``path``, or of stdin for ``-``."""
    if path == "-":
        buffer = getattr(sys.stdin, "buffer", None)
        data: bytes | str = buffer.read() if buffer is not None else sys.stdin.read()
        return data
    if Path(path).is_dir():
        raise _CliError(f"cannot read {path!r}: it is a directory, not a plan file")
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise _CliError(f"cannot read {path!r}: {reason}") from exc


def _read_document(path: str) -> Any:
    """The JSON document in ``path`` (``-``: stdin), parsed strictly; a file that is not
    UTF-8 is a usage error, a file that is not JSON an invalid plan (``not_json``)."""
    from planrun.core import NOT_JSON, SCHEMA, InvalidPlan, Problem

    raw = _read_input(path)
    try:
        text = raw.decode("utf-8-sig") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        raise _CliError(f"{path!r} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        return json.loads(text)
    except RecursionError:
        problem = Problem(SCHEMA, None, f"{path} is nested too deeply to be a plan")
    except ValueError as exc:
        where = (f"{exc.msg} at line {exc.lineno} column {exc.colno}"
                 if isinstance(exc, json.JSONDecodeError) else str(exc))
        problem = Problem(NOT_JSON, None, f"{path} is not valid JSON ({where}); a plan file "
                          'is a JSON document {"goal": "...", "tasks": [...]}')
    raise InvalidPlan([problem])


# ------------------------------------------------------------------------------ validate


def _add_validate(subparsers: _Subparsers) -> None:
    parser = subparsers.add_parser(
        "validate",
        help="check a plan document against the worker kinds",
        description=(
            "Check a plan (a JSON document, a bare task list, or model text with JSON in "
            "it) and list every problem. Exit 0 when valid, 2 when not."
        ),
    )
    parser.add_argument("plan", metavar="PLAN.json", help="the plan file, or - for stdin")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--app",
        metavar="module:attr",
        help="the App (or Registry) whose kinds, payload models and contracts the plan must "
        "keep",
    )
    which.add_argument(
        "--kinds",
        type=_kind_list,
        metavar="a,b,c",
        help="comma-separated names of the kinds that exist (the shape only: no payload "
        "models, no contracts)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='print {"valid": bool, "problems": [{"code", "task", "message"}]}',
    )
    parser.add_argument("--min-tasks", type=_non_negative_int, default=1, metavar="N",
                        help="fewest tasks a valid plan has")
    parser.add_argument("--max-tasks", type=_positive_int, default=50, metavar="N",
                        help="most tasks a valid plan has")
    parser.set_defaults(func=_cmd_validate)


def _cmd_validate(args: argparse.Namespace) -> int:
    if args.min_tasks > args.max_tasks:
        raise _CliError(
            f"--min-tasks ({args.min_tasks}) is greater than --max-tasks ({args.max_tasks})"
        )
    if args.app is not None:
        from planrun._facade import load_app

        kinds: Any = load_app(args.app).registry
    else:
        kinds = args.kinds
    raw = _read_input(args.plan)
    bounds = {"min_tasks": args.min_tasks, "max_tasks": args.max_tasks}
    problems = validate_plan(raw, kinds, **bounds)
    if args.json:
        report = {"valid": not problems, "problems": [p.to_dict() for p in problems]}
        print(json.dumps(report, ensure_ascii=False))
        return EXIT_INVALID if problems else EXIT_OK
    if problems:
        for problem in problems:
            print(problem)
        count = len(problems)
        print(f"invalid: {count} problem{'s' if count != 1 else ''}", file=sys.stderr)
        return EXIT_INVALID
    plan = Plan.parse(raw, kinds, **bounds)
    n = len(plan.tasks)
    print(f"valid: {n} task{'s' if n != 1 else ''}")
    order = plan.topological_order()
    print("order: " + (" -> ".join(str(i) for i in order) if order else "(no tasks)"))
    return EXIT_OK


# ------------------------------------------------------------------------------ simulate


def _float_list(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers like 10,2,2, got {text[:40]!r}"
        ) from None
    if not values or any(not math.isfinite(v) or v < 0 for v in values):
        raise argparse.ArgumentTypeError("expected finite non-negative numbers like 10,2,2")
    return values


def _add_simulate(subparsers: _Subparsers) -> None:
    from planrun.core import STRATEGIES

    parser = subparsers.add_parser(
        "simulate",
        help="run a scenario through the real supervisor in virtual time",
        description="Simulate workers and tasks in virtual time and report the makespan, "
        "the mean time per task and each worker's share. Scenarios: a JSON file, or the "
        "built-in 'article' and 'capability'.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--scenario", metavar="FILE|NAME",
                        help="a scenario file, or a built-in name (article, capability, fanout)")
    source.add_argument("--durations", type=_float_list, metavar="10,2,2,...",
                        help="task durations in seconds, one task each, on --workers equal workers")
    parser.add_argument("--workers", type=_positive_int, default=3, metavar="N",
                        help="equal workers for --durations (default 3)")
    parser.add_argument("--strategy", choices=[*STRATEGIES, "all"],
                        help="override the scenario's strategy; 'all' compares the four")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the random choices a scenario makes")
    parser.add_argument("--deadline", type=_seconds, metavar="S",
                        help="the window the run must fit in: say whether it does")
    parser.add_argument("--json", action="store_true",
                        help='print {"makespan", "mean_task_s", "strategy", "per_worker"}')
    parser.set_defaults(func=_cmd_simulate)


def _cmd_simulate(args: argparse.Namespace) -> int:
    from planrun.core import STRATEGIES
    from planrun.dev.sim import Scenario, simulate

    if args.scenario is not None:
        scenario = Scenario.load(args.scenario)
    else:
        scenario = Scenario.from_durations(args.durations, args.workers)
    strategies = list(STRATEGIES) if args.strategy == "all" else [args.strategy]
    results = [simulate(scenario, s, seed=args.seed, deadline_s=args.deadline)
               for s in strategies]
    if args.json:
        data: Any = [r.to_dict() for r in results]
        print(json.dumps(data if len(data) > 1 else data[0]))
        return EXIT_OK
    for r in results:
        shares = ", ".join(
            f"{name} {int(w['tasks'])} tasks/{w['busy_s']:g} s" for name, w in r.per_worker.items()
        )
        fits = "" if r.fits is None else (
            f"  fits the {r.deadline_s:g} s deadline" if r.fits else
            f"  does NOT fit the {r.deadline_s:g} s deadline "
            f"({r.run.counts['cancelled']} cancelled)")
        print(f"{r.strategy:<13} makespan {r.makespan:g} s  mean task {r.mean_task_s:g} s  "
              f"[{shares}]{fits}")
    return EXIT_OK


# ------------------------------------------------------------------------------- compare


def _add_compare(subparsers: _Subparsers) -> None:
    parser = subparsers.add_parser(
        "compare",
        help="the release scenario through naive peers, peers with a protocol, the supervisor",
        description="Run the release (migrate_db, deploy_app, smoke_test) through three "
        "systems and audit each ledger: order violations, duplicates, missing tasks. The "
        "second peer board follows the rules check_deps, claims and retry; every system "
        "runs under the same failure plan.",
    )
    parser.add_argument("--rules", metavar="RULES",
                        help="every agent's rules on the second peer board, e.g. "
                        "check_deps,claims (or none; default all three)")
    parser.add_argument("--agent-rules", action="append", metavar="AGENT=RULES",
                        help="one agent's rules instead, e.g. deploy-2=claims,retry "
                        "(repeatable; agents deploy-1, deploy-2, qa-1, db-1)")
    parser.add_argument("--db-failures", metavar="N",
                        help="times db-1 fails migrate_db (default 1)")
    parser.add_argument("--deploy1-failures", metavar="N",
                        help="times deploy-1 fails deploy_app (default 0)")
    parser.add_argument("--max-retries", metavar="N",
                        help="retries after a failure, supervisor and peer retry rule "
                        "(default 2)")
    parser.add_argument("--sweep", action="store_true",
                        help="every set of rules for all agents and every agent without "
                        "each rule, next to the supervisor")
    parser.add_argument("--ledger", action="store_true",
                        help="also print each system's ledger (run:, fail:, abort:)")
    parser.add_argument("--json", action="store_true",
                        help='print {"rows": [{"system", "order_violations", "duplicates", '
                        '"missing"}]}, plus "settings" when an option is given')
    parser.set_defaults(func=_cmd_compare)


def _cmd_compare(args: argparse.Namespace) -> int:
    from planrun.dev import compare as cmp

    rules, failures = cmp.options_from_text(args.rules, args.agent_rules, args.db_failures,
                                            args.deploy1_failures, args.max_retries)
    if args.sweep:
        if rules is not None or args.ledger:
            raise _CliError("--sweep runs every set of rules; drop --rules, --agent-rules "
                            "and --ledger")
        combos = cmp.sweep(failures=failures)
        if args.json:
            print(json.dumps({"settings": (failures or cmp.Failures()).to_dict(),
                              "combinations": [c.to_dict() for c in combos]}))
        else:
            print("\n".join(cmp.format_sweep(combos, failures)))
        return EXIT_OK
    rows = cmp.compare(rules=rules, failures=failures)
    if args.json:
        data: dict[str, Any] = {"rows": [r.to_dict(ledger=args.ledger) for r in rows]}
        if rules is not None or failures is not None:
            data["settings"] = cmp.settings(rules, failures)
        print(json.dumps(data))
        return EXIT_OK
    print("\n".join(cmp.format_table(rows, rules=rules, failures=failures, ledger=args.ledger)))
    return EXIT_OK


# ---------------------------------------------------------------------------- plan / run


def _timeout_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timeout", type=_seconds, metavar="S",
                        help="seconds one model request may take (default $PLANRUN_TIMEOUT, "
                        "else 60; a slow local model may need more)")


def _concurrency_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--concurrency", type=_positive_int, metavar="N",
                        help="tasks run at once by the app's default workers (default: the "
                        "App's concurrency, 8)")


def _with_concurrency(app: Any, args: argparse.Namespace) -> Any:
    """The app with ``--concurrency`` applied to its default pool of workers."""
    if getattr(args, "concurrency", None) is None:
        return app
    if app.workers:
        raise _CliError(f"--concurrency sizes the default pool of workers, and app "
                        f"{getattr(args, 'app', None) or 'of the run'} declares its own "
                        f"({len(app.workers)} workers): their capacities decide")
    import dataclasses

    return dataclasses.replace(app, concurrency=args.concurrency)


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--app", required=True, metavar="module:attr",
                        help="the App (or Registry) to use, e.g. planrun.examples.brief:app")
    parser.add_argument("--model", help="model name (default $PLANRUN_MODEL or gpt-4o-mini); "
                        "'test': the offline test model, which plans over the app's kinds")
    _timeout_flag(parser)
    parser.add_argument("--min-tasks", type=_positive_int, default=3, metavar="N",
                        help="fewest tasks the decomposer accepts in a plan")
    parser.add_argument("--max-tasks", type=_positive_int, default=8, metavar="N",
                        help="most tasks the decomposer accepts in a plan")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    _cassette_flags(parser)


def _fixtures_cli() -> Any:
    import importlib

    try:
        return importlib.import_module("planrun.cli._fixtures")
    except ImportError:  # pragma: no cover - a stripped install without fixtures
        return None


def _cassette_flags(parser: argparse.ArgumentParser) -> None:
    module = _fixtures_cli()
    if module is not None:
        module.add_cassette_flags(parser)


def _cassette(args: argparse.Namespace) -> Any:
    import contextlib

    module = _fixtures_cli()
    if module is None:
        return contextlib.nullcontext()
    return module.cassette_context(args, getattr(args, "argv", None))


def _model(args: argparse.Namespace, app: Any) -> Any:
    """The model of a verb: the cassette's under ``--replay``; for ``--model test`` the
    offline :class:`~planrun.testing.TestModel`, planning over ``app``; else the named one."""
    from planrun.dev.testmodel import model_named

    module = _fixtures_cli()
    replayed = module.replay_model(args) if module is not None else None
    if replayed is not None:  # --replay: the cassette answers; no key needed
        return replayed
    timeout = getattr(args, "timeout", None)
    return model_named(args.model, app, **({} if timeout is None else {"timeout": timeout}))


def _limit_flags(parser: argparse.ArgumentParser, worker: bool = False) -> None:
    import os

    whose = ("for runs that record no limit of their own" if worker
             else "recorded with the run; every worker of the run honours it")
    parser.add_argument("--rpm", type=_positive_float, default=os.environ.get("PLANRUN_RPM"),
                        metavar="N", help=f"requests per minute ({whose}; default $PLANRUN_RPM)")
    parser.add_argument("--tpm", type=_positive_float, default=os.environ.get("PLANRUN_TPM"),
                        metavar="N", help=f"tokens per minute ({whose}; default $PLANRUN_TPM)")
    parser.add_argument("--rpm-burst", type=_positive_float, default=2.0, metavar="N",
                        help="requests that may go back to back (default 2: one slot of "
                        "slack absorbs the database round trip, so the full rate is used)")
    parser.add_argument("--limit-key", metavar="NAME",
                        help="name of the rate limit to share (default: the model and a hash "
                        "of the API key, as providers count)")


def _limit_key(args: argparse.Namespace) -> str:
    import os

    from planrun.model import DEFAULT_MODEL, limit_key

    model = getattr(args, "model", None) or os.environ.get("PLANRUN_MODEL") or DEFAULT_MODEL
    return limit_key(model, os.environ.get("OPENAI_API_KEY"), args.limit_key)


def _run_limits(args: argparse.Namespace, budget: bool = True) -> Any:
    from planrun.model import RunLimits

    rated = args.rpm is not None or args.tpm is not None
    if args.rpm_burst < 1:
        raise _CliError(f"--rpm-burst must be >= 1, got {args.rpm_burst:g}")
    return RunLimits(
        rpm=args.rpm, tpm=args.tpm, key=_limit_key(args) if rated else None,
        request_burst=args.rpm_burst if rated else None,
        budget_tokens=getattr(args, "budget_tokens", None) if budget else None,
        budget_usd=getattr(args, "budget_usd", None) if budget else None,
    )


def _limited(model: Any, limits: Any) -> Any:
    """``model`` with an in-process limiter at the run's rates (one process: in memory)."""
    if model is not None and limits.rated:
        from planrun.model import RateLimiter

        model.limiter = RateLimiter(limits.rpm, limits.tpm,
                                    request_burst=limits.request_burst or 1.0)
    return model


def _add_plan(subparsers: _Subparsers) -> None:
    parser = subparsers.add_parser(
        "plan", help="decompose a goal into a validated plan (nothing runs)",
        description="Ask the model for a plan over the app's kinds, validate it (repairing "
        "it when invalid: by code what the kinds' contracts settle, by the model the rest) "
        "and print it with its repairs.",
    )
    parser.add_argument("goal", help="the goal, in prose")
    _add_model_args(parser)
    parser.add_argument("--no-code-repair", action="store_true",
                        help="ask the model for every repair (no code repairs)")
    parser.set_defaults(func=_cmd_plan)


def _cmd_plan(args: argparse.Namespace) -> int:
    from planrun._facade import load_app
    from planrun.model import decompose

    app = load_app(args.app)
    with _cassette(args):
        plan = decompose(args.goal, app.registry, _model(args, app), min_tasks=args.min_tasks,
                         max_tasks=args.max_tasks,
                         repair="model" if args.no_code_repair else "code")
    if args.json:
        document = {**plan.to_document(), "repairs": [r.to_dict() for r in plan.repairs]}
        print(json.dumps(document, ensure_ascii=False, indent=2))
        return EXIT_OK
    from rich.console import Console

    from planrun.obs import plan_tree

    console = Console()
    console.print(plan_tree(plan))
    for repair in plan.repairs:
        console.print(f"repaired: {repair}", markup=False, highlight=False)
    return EXIT_OK


# ------------------------------------------------------------------------------ estimate


def _tier_list(text: str) -> tuple[str, ...]:
    """``--tiers flex,priority[,batch]``: the tiers beside the default one."""
    from planrun.core import UsageError
    from planrun.core.scheduling import check_tiers

    try:
        return tuple(t for t in check_tiers(text) if t != "default")
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_estimate(subparsers: _Subparsers) -> None:
    parser = subparsers.add_parser(
        "estimate", help="what a plan will cost before it runs (no model call)",
        description="Count a plan's model calls, their tokens (as the provider counts them, "
        "response schemas included) and their cost at each allowed tier, expected and with "
        "every output at its bound, and the time they need at the rate limits. No model "
        "call is made and no key is needed.",
    )
    parser.add_argument("plan", metavar="PLAN.json", help="the plan file, or - for stdin")
    parser.add_argument("--app", required=True, metavar="module:attr",
                        help="the App (or Registry) the plan runs on")
    parser.add_argument("--model", help="model name (default $PLANRUN_MODEL or gpt-4o-mini)")
    parser.add_argument("--tiers", type=_tier_list, default=(), metavar="flex,priority,batch",
                        help="tiers the run may use beside the default one (each is priced)")
    parser.add_argument("--rpm", type=_positive_float, default=os.environ.get("PLANRUN_RPM"),
                        metavar="N", help="requests per minute (default $PLANRUN_RPM)")
    parser.add_argument("--tpm", type=_positive_float, default=os.environ.get("PLANRUN_TPM"),
                        metavar="N", help="tokens per minute (default $PLANRUN_TPM)")
    parser.add_argument("--json", action="store_true",
                        help='print {"model", "calls", "by_kind", "tokens", "tiers": {TIER: '
                        '{"cost_usd", "cost_usd_max"}}, "priced", "rpm", "tpm", "time_s"}')
    parser.set_defaults(func=_cmd_estimate)


def _cmd_estimate(args: argparse.Namespace) -> int:
    from planrun._facade import estimate, load_app

    app = load_app(args.app)
    found = estimate(_read_document(args.plan), app, model=args.model, tiers=args.tiers,
                     rpm=args.rpm, tpm=args.tpm)
    print(json.dumps(found.to_dict()) if args.json else found.summary())
    return EXIT_OK


def _afford(args: argparse.Namespace, plan: Any, app: Any) -> None:
    """Refuse at once, spending nothing, a run whose cheapest allowed expected cost is more
    than ``--budget-usd`` (unless ``--force``)."""
    if args.budget_usd is None or args.force:
        return
    from planrun._facade import estimate

    found = estimate(plan, app, model=args.model, tiers=getattr(args, "tiers", ()) or ())
    tier, cost = found.cheapest
    if cost.cost_usd > args.budget_usd:
        raise _CliError(f"the plan is expected to cost ${cost.cost_usd:.4f} at its cheapest "
                        f"allowed tier ({tier}), more than --budget-usd {args.budget_usd:g}; "
                        f"nothing was spent (planrun estimate shows the figures; --force "
                        f"runs it anyway)")


def _add_run(subparsers: _Subparsers) -> None:
    from planrun.core import STRATEGIES

    parser = subparsers.add_parser(
        "run", help="run a goal (decomposed first) or a plan file to the end",
        description="Decompose GOAL (or read PLAN.json), validate, run it under the "
        "supervisor and print the report. Exit 0 when every task completed, 1 otherwise.",
    )
    parser.add_argument("goal", metavar="GOAL|PLAN.json", nargs="?",
                        help="a plan file (an existing path, or - for stdin), else the goal")
    parser.add_argument("--goal", dest="goal_text", metavar="TEXT",
                        help="the goal, even where it names an existing file")
    _add_model_args(parser)
    parser.add_argument("--strategy", choices=STRATEGIES,
                        help="routing (default balanced; local workers only)")
    parser.add_argument("--on-dead", choices=["cancel_dependents", "abort_run", "replan"],
                        default="cancel_dependents",
                        help="what a dead task does to the run: cancel what depends on it, "
                        "abort the run, or ask the model to re-plan it")
    parser.add_argument("--no-code-repair", action="store_true",
                        help="ask the model for every repair of the goal's plan and of its "
                        "replans (no code repairs)")
    parser.add_argument("--budget-tokens", type=_positive_int, metavar="N",
                        help="tokens the whole run may use, in every process")
    parser.add_argument("--budget-usd", type=_positive_float, metavar="X",
                        help="USD the whole run may spend, in every process; a plan whose "
                        "expected cost (planrun estimate) is more is refused before it starts")
    parser.add_argument("--force", action="store_true",
                        help="run a plan even when its expected cost is more than --budget-usd "
                        "(the budget still stops it)")
    _limit_flags(parser)
    parser.add_argument("--retry-budget", type=_non_negative_int, metavar="N",
                        help="retries allowed over the whole run (default: no limit)")
    parser.add_argument("--deadline", type=_seconds, metavar="S",
                        help="seconds after which nothing new starts: tasks not started are "
                        "cancelled (cause: deadline); attempts in flight keep their timeout")
    parser.add_argument("--tiers", type=_tier_list, default=(), metavar="flex,priority,batch",
                        help="tiers each task's model calls may go at beside the default "
                        "one, chosen per task by its slack before --deadline (without one: "
                        "the cheapest); stored with the run for a resume")
    parser.add_argument("--quiet", action="store_true", help="no live progress")
    parser.add_argument("--run-id", type=_run_id, metavar="ID",
                        help="the new run's id (default: a random one); an id the store "
                        "already holds is refused before anything runs")
    _batch_flags(parser)
    _concurrency_flag(parser)
    _db_flag(parser, required=False)
    parser.add_argument("--workers", choices=["local", "external"], default="local",
                        help="external: worker processes (planrun worker) do the tasks; "
                        "this process only coordinates (needs --db)")
    parser.add_argument("--stale-after", type=_seconds, metavar="S",
                        help="external workers: reclaim an attempt whose worker process has "
                        "not heartbeat for this long "
                        "(default 30)")
    parser.set_defaults(func=_cmd_run)


def _batch_flags(parser: argparse.ArgumentParser) -> None:
    from planrun.model import Batching

    parser.add_argument("--batch", action="store_true",
                        help="send the tasks' model calls as Batch API jobs (half price); "
                        "with --deadline, calls a batch cannot finish in time go live")
    parser.add_argument("--batch-size", type=_positive_int, metavar="N",
                        help=f"calls per batch at most (default {Batching.size})")
    parser.add_argument("--batch-wait", type=_seconds, metavar="S",
                        help=f"submit a batch this long after its first call "
                        f"(default {Batching.wait_s:g})")
    parser.add_argument("--batch-poll", type=_seconds, metavar="S",
                        help=f"seconds between reads of a batch's status "
                        f"(default {Batching.poll_s:g})")


def _batching(args: argparse.Namespace, stored: Any = None) -> dict[str, Any] | None:
    """The batch settings the flags give: over those a resumed run was started with
    (``stored``); None when no flag is given (a resumed run keeps its own settings)."""
    given = {name: value for name, value in (
        ("size", getattr(args, "batch_size", None)), ("wait_s", getattr(args, "batch_wait", None)),
        ("poll_s", getattr(args, "batch_poll", None))) if value is not None}
    if not getattr(args, "batch", False):
        if given and not isinstance(stored, dict):
            raise _CliError("--batch-size, --batch-wait and --batch-poll need --batch")
        if not given:
            return None
    return {**(stored if isinstance(stored, dict) else {}), **given}


def _batch_option(options: dict[str, Any], batch: dict[str, Any] | None) -> None:
    """Batch mode in the run's options, from its settings (none: live calls)."""
    if batch is not None:
        from planrun.model import Batching

        options["batch"] = Batching.from_meta(batch)


def _plan_source(args: argparse.Namespace) -> Any:
    """A goal (text) or a plan document: only a goal given as a goal goes to the model."""
    if args.goal_text is not None:
        if args.goal is not None:
            raise _CliError("give the goal once: a GOAL argument or --goal, not both")
        if not args.goal_text.strip():
            raise _CliError("--goal is empty")
        return args.goal_text
    text = args.goal
    if text is None:
        raise _CliError("run needs a GOAL, a PLAN.json or --goal TEXT")
    if text == "-" or os.path.lexists(text):
        return _read_document(text)
    if looks_like_a_file(text):
        raise _CliError(f"no such plan file: {text}; to run it as a goal, give it as "
                        f"--goal {shlex.quote(text)}")
    if not text.strip():
        raise _CliError("the goal is empty")
    return text


_FILE_LIKE = re.compile(r"\S*[/\\]\S*|\S*\.[A-Za-z][A-Za-z0-9]{0,4}")


def looks_like_a_file(text: str) -> bool:
    """Whether a GOAL|PLAN argument reads as a file name rather than a goal: one word (no
    white space) with a path separator, or ending in a file extension (``plan.json``,
    ``plans/next``, ``plan_ok.jsn``). Prose has spaces: ``write a brief on Node.js`` is a
    goal."""
    return _FILE_LIKE.fullmatch(text) is not None


def _refuse_unhonoured(args: argparse.Namespace) -> None:
    """A flag the chosen mode cannot honour is an error, never silently ignored."""
    if args.workers == "external":
        if args.strategy is not None:
            raise _CliError("--strategy routes local workers; with --workers external the "
                            "coordinator assigns (drop --strategy)")
        if args.batch or "batch" in args.tiers:
            raise _CliError("--batch runs with local workers; worker processes on DBOS call "
                            "the model live (drop --batch or --workers external)")


def _cmd_run(args: argparse.Namespace) -> int:
    from planrun._facade import load_app

    _check_run_flags(args)
    _refuse_unhonoured(args)
    source = _plan_source(args)
    external = args.workers == "external"
    app = load_app(args.app) if external else _with_concurrency(load_app(args.app), args)
    limits = _run_limits(args)
    budget = limits.budget()
    if not isinstance(source, str):
        from planrun._facade import READY_PLAN_MAX_TASKS
        from planrun.core import Plan

        if args.no_code_repair and args.on_dead != "replan":
            raise _CliError("--no-code-repair is for a goal's plan and its replans; a plan "
                            "file is not decomposed (drop it, or add --on-dead replan)")

        source = Plan.parse(source, app.registry, max_tasks=READY_PLAN_MAX_TASKS)
        _afford(args, source, app)
    strategy = args.strategy or "balanced"
    meta: dict[str, Any] = {"app": args.app, "on_dead": args.on_dead, "strategy": strategy,
                            "retry_budget": args.retry_budget}
    if limits.rated or limits.budgeted:
        meta["limits"] = limits.to_meta()
    batch = _batching(args)  # kept in the run's meta by the run itself, for its resume
    # A model here decomposes a goal and re-plans; worker processes bring their own.
    needs_model = isinstance(source, str) or (
        app.needs_model() and (not external or args.on_dead == "replan"))
    if external:
        if not args.db:
            raise _CliError("--workers external needs --db (the database the workers use)")
        from planrun.runtime import import_dbos

        import_dbos()  # the [dbos] extra, before the database is touched
        lease = args.stale_after or LEASE_S
        app = _on_dbos(app, args, lease)
        meta.update({"workers": "external", "stale_after": lease})
    model = _model(args, app) if needs_model else None
    options: dict[str, Any] = {
        "model": _limited(model, limits), "strategy": strategy, "budget": budget,
        "min_tasks": args.min_tasks, "max_tasks": args.max_tasks, "on_dead": args.on_dead,
        "meta": meta, "retry_budget": args.retry_budget, "deadline_s": args.deadline,
        "tiers": args.tiers,
        "repair": "model" if args.no_code_repair else "code",
    }
    _batch_option(options, batch)
    if args.run_id is not None:
        options["run_id"] = args.run_id
    if args.db:
        options["store"] = args.db
    if external:
        options["stale_after"] = meta["stale_after"]
    return _execute(source, app, options, args)


LEASE_S = 30.0
"""The lease of an attempt a worker process holds, unless ``--stale-after`` says."""


def _on_dbos(app: Any, args: argparse.Namespace, lease: float | None) -> Any:
    """The app with its attempts done by worker processes (``planrun worker``) through the
    DBOS queues in the run's database."""
    from planrun.runtime import DBOSAttempts

    _with_store(args.db, _reachable)  # a database that does not answer: one line
    attempts = DBOSAttempts(args.db, app_name=args.app or "planrun",
                            in_flight=getattr(args, "concurrency", None) or 32,
                            lease_s=lease or LEASE_S)
    if not (getattr(args, "json", False) or getattr(args, "quiet", False)):
        print(f"attempts go to the DBOS queues of {args.db and _masked(args.db)}: start "
              f"workers with planrun worker --db ... --app {args.app}", file=sys.stderr)
    return attempts.app(app)


def _check_run_flags(args: argparse.Namespace) -> None:
    """Refuse flags the chosen mode cannot use, rather than ignore them."""
    if args.db is not None:
        _check_db(args.db)
    if args.workers != "external" and args.stale_after is not None:
        raise _CliError("--stale-after applies to --workers external; local runs notice "
                        "a stuck attempt by its timeout")


def _check_db(url: str, *, must_exist: bool = False) -> None:
    """A store URL that can be what the user meant; read-only verbs need an existing file."""
    if not url.strip():
        raise _CliError("--db is empty; give a store URL such as sqlite:///runs.db")
    scheme, sep, rest = url.partition("://")
    if must_exist and sep and scheme.lower() == "sqlite" and rest.startswith("/") \
            and rest != "/" and not Path(rest[1:]).is_file():
        raise _CliError(f"no database file {rest[1:]!r} (from --db {url}); nothing was created")


def _execute(source: Any, app: Any, options: dict[str, Any], args: argparse.Namespace) -> int:
    from rich.console import Console

    from planrun._facade import aplan_and_run
    from planrun.obs import Progress, report_table

    if options.get("store"):  # a database that does not answer: one line, nothing shown
        _with_store(options["store"], _reachable)
    console = Console(stderr=args.json)
    progress = None if args.quiet or args.json else Progress(0, console)
    run = _interruptible(options.pop("_runner", aplan_and_run))
    if options.get("store"):
        import uuid

        # resume names its run; a new run is named now (--run-id, or at random), so that
        # an interrupt can say what to resume
        run_id = (options.get("run_id") or getattr(args, "run_id", None)
                  or options.setdefault("run_id", uuid.uuid4().hex[:12]))
        args.on_interrupt = (f"; run {run_id} is left resumable: planrun resume {run_id} "
                             f"--db {_masked(options['store'])}")
    with _cassette(args):
        if progress is not None:
            with progress:
                report = run(source, app, progress=progress, **options)
        else:
            report = run(source, app, **options)
    if args.json:
        print(json.dumps(report.to_dict(), ensure_ascii=False, default=str))
    else:
        console.print(report_table(report))
        console.print(report.summary())
    return EXIT_OK if report.ok else 1


# ------------------------------------------------------------------- resume / runs / status


def _db_flag(parser: argparse.ArgumentParser, required: bool = True) -> None:
    import os

    default = os.environ.get("PLANRUN_DB")
    parser.add_argument("--db", default=default, required=required and default is None,
                        metavar="URL",
                        help="store URL: sqlite:///runs.db or postgresql://... "
                        "(default $PLANRUN_DB)")


def _add_resume(subparsers: _Subparsers) -> None:
    parser = subparsers.add_parser(
        "resume", help="carry on a stored run after a crash",
        description="Load the run's unfinished tasks and carry on: completed tasks keep their "
        "results, tasks in flight under the dead supervisor are reclaimed.",
    )
    parser.add_argument("run_id", metavar="RUN_ID", help="the run's id (planrun runs lists them)")
    _db_flag(parser)
    parser.add_argument("--app", metavar="module:attr",
                        help="the App; default the one the run was started with")
    parser.add_argument("--model", help="model name (default $PLANRUN_MODEL or gpt-4o-mini); "
                        "'test': the offline test model, which plans over the app's kinds")
    _timeout_flag(parser)
    _concurrency_flag(parser)
    _batch_flags(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--quiet", action="store_true", help="no live progress")
    parser.add_argument(
        "--no-wait", dest="wait", action="store_false",
        help="when another live process owns the run, fail at once instead of waiting for "
        "its lease to run out (an owner that is a gone process of this host is taken over "
        "at once either way)")
    _cassette_flags(parser)
    parser.set_defaults(func=_cmd_resume)


def _owner_countdown(quiet: bool) -> Any:
    """A countdown on stderr while a run's live owner is waited for: one line rewritten in
    place on a terminal, a line when the wait starts otherwise."""
    said: list[str] = []

    def show(owner: Any, left: float) -> None:
        if quiet:
            return
        text = (f"waiting for the run's owner {owner.name} to end or let its lease run out "
                f"({left:.0f} s left)")
        if sys.stderr.isatty():
            print(f"\r{text}\033[K", end="", file=sys.stderr, flush=True)
        elif not said:
            print(text, file=sys.stderr, flush=True)
        said.append(owner.name)

    return show


def _cmd_resume(args: argparse.Namespace) -> int:
    from planrun._facade import load_app

    _check_db(args.db, must_exist=True)
    run, counts = _stored_run(args.db, args.run_id)
    if run.status in FINISHED_RUN:  # nothing to carry on: say so, exit 0
        tally = ", ".join(f"{k} {v}" for k, v in counts.items() if v) or "no tasks"
        if args.json:
            print(json.dumps({"run_id": run.id, "status": run.status, "resumed": False,
                              "counts": counts}))
        else:
            print(f"run {run.id} is already {run.status} ({tally}); nothing to resume")
        return EXIT_OK
    meta = dict(run.meta)
    ref = args.app or meta.get("app")
    if not ref:
        raise _CliError(f"run {args.run_id} does not name its app; pass --app module:attr")
    if meta.get("coordinated"):
        raise _CliError(f"run {args.run_id} was coordinated by a planrun release before "
                        "worker processes ran on DBOS; this release cannot resume it")
    external = meta.get("workers") == "external"
    app = load_app(ref) if external else _with_concurrency(load_app(ref), args)
    needs_model = app.needs_model() and (not external or meta.get("on_dead") == "replan")
    if external:  # started with --workers external: its attempts go to the workers again
        args.app = ref
        app = _on_dbos(app, args, float(meta.get("stale_after", LEASE_S)))
    from planrun.model import RunLimits

    limits = RunLimits.from_meta(meta)  # the limits the run was started with
    options: dict[str, Any] = {"store": args.db, "_runner": _resume_runner(args.run_id),
                               "budget": limits.budget(), "wait": args.wait,
                               "on_wait": _owner_countdown(args.quiet or args.json)}
    if meta.get("on_dead"):
        options["on_dead"] = meta["on_dead"]
    if meta.get("strategy"):
        options["strategy"] = meta["strategy"]
    if meta.get("retry_budget") is not None:
        options["retry_budget"] = meta["retry_budget"]
    if external:
        options["stale_after"] = float(meta.get("stale_after", LEASE_S))
    if external and args.batch:
        raise _CliError("--batch runs with local workers; this run's attempts go to worker "
                        "processes on DBOS, which call the model live")
    _batch_option(options, None if external else _batching(args, meta.get("batch")))
    if needs_model:
        options["model"] = _limited(_model(args, app), limits)
    return _execute(None, app, options, args)


def _resume_runner(run_id: str) -> Any:
    from planrun._facade import aresume_run

    async def run(_: Any, app: Any, **options: Any) -> Any:
        store = options.pop("store")
        return await aresume_run(run_id, app, store, **options)

    return run


def _masked(url: str) -> str:
    from planrun.stores import mask_url

    return str(mask_url(url))


def _interruptible(arun: Any) -> Any:
    """``arun(...)`` as a blocking call that Ctrl-C stops within a moment (see
    :func:`_run_interruptibly`)."""

    def run(*args: Any, **kwargs: Any) -> Any:
        return _run_interruptibly(arun(*args, **kwargs))

    return run


class _AbandoningExecutor(concurrent.futures.ThreadPoolExecutor):
    """The loop's default executor for a CLI run: each call on a daemon thread.

    ``asyncio.run`` waits for its executor's threads at the end; after Ctrl-C that would
    mean waiting for every synchronous handler to return. These threads are abandoned
    instead: a handler that finishes later finds its loop closed, so its result is never
    written (the store keeps the attempt as it was, and ``resume`` reclaims it).
    """

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def work() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # handed to the awaiting coroutine, as a pool does
                future.set_exception(exc)
            else:
                future.set_result(result)

        threading.Thread(target=work, daemon=True, name="planrun-handler").start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Nothing to wait for: the threads are daemons."""


_CLEANUP_S = 2.0
"""How long cancelled work may take to wind down after Ctrl-C before it is left behind."""


def _run_interruptibly(coro: Any) -> Any:
    """Run ``coro`` on a fresh loop; Ctrl-C cancels it and raises KeyboardInterrupt.

    In-flight async attempts are cancelled; synchronous handlers are abandoned on their
    daemon threads; a second Ctrl-C while winding down changes nothing.
    """
    import asyncio
    import signal

    loop = asyncio.new_event_loop()
    loop.set_default_executor(_AbandoningExecutor(thread_name_prefix="planrun-handler"))
    main_task = loop.create_task(coro)
    interrupted = False

    def interrupt() -> None:
        nonlocal interrupted
        interrupted = True
        main_task.cancel()

    try:
        loop.add_signal_handler(signal.SIGINT, interrupt)
        handled = True
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread; Windows
        handled = False
    try:
        return loop.run_until_complete(main_task)
    except asyncio.CancelledError:
        if interrupted:
            raise KeyboardInterrupt from None
        raise
    finally:
        try:
            rest = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in rest:
                task.cancel()
            if rest:
                loop.run_until_complete(asyncio.wait(rest, timeout=_CLEANUP_S))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            if handled:
                loop.remove_signal_handler(signal.SIGINT)
            loop.close()


def _with_store(url: str, fn: Any) -> Any:
    import asyncio

    from planrun.stores import open_store

    async def go() -> Any:
        store = open_store(url)
        await store.open()
        try:
            return await fn(store)
        finally:
            await store.close()

    return asyncio.run(go())


async def _reachable(store: Any) -> None:
    """Nothing: opening the store (``_with_store``) was the check."""


def _stored_run(url: str, run_id: str) -> tuple[Any, dict[str, int]]:
    """The stored run (a RunInfo) and its tasks by status."""
    from planrun.core import Status

    async def get(store: Any) -> tuple[Any, dict[str, int]]:
        state = await store.load_tasks(run_id)
        counts = {s.value: 0 for s in Status}
        for task in state.tasks:
            counts[task.status.value] += 1
        return state.run, counts

    result: tuple[Any, dict[str, int]] = _with_store(url, get)
    return result


def _add_runs(subparsers: _Subparsers) -> None:
    parser = subparsers.add_parser("runs", help="list stored runs with status counts")
    _db_flag(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(func=_cmd_runs)


def _cmd_runs(args: argparse.Namespace) -> int:
    _check_db(args.db, must_exist=True)
    import time

    from planrun.stores.base import shown_status

    async def get(store: Any) -> Any:
        return await store.list_runs()

    runs = _with_store(args.db, get)
    now = time.time()
    if args.json:
        print(json.dumps([{"id": r.id, "created_at": r.created_at,
                           "status": shown_status(r, now),
                           "recorded_status": r.status, "owner": r.owner,
                           "owner_until": r.owner_until, "goal": r.goal,
                           "counts": dict(r.counts)} for r in runs]))
        return EXIT_OK
    if not runs:
        print("no runs")
    for r in runs:
        counts = ", ".join(f"{k} {v}" for k, v in r.counts.items() if v)
        status = shown_status(r, now)
        print(f"{r.id}  {status:<11} {counts}  {r.goal[:60]}")
    return EXIT_OK


def _add_status(subparsers: _Subparsers) -> None:
    parser = subparsers.add_parser(
        "status", help="tasks by status, per-worker active count, oldest unfinished task age",
    )
    parser.add_argument("run_id", metavar="RUN_ID", help="the run's id (planrun runs lists them)")
    _db_flag(parser)
    parser.add_argument("--watch", action="store_true", help="refresh until the run ends")
    parser.add_argument("--interval", type=_interval, default=2.0, metavar="S",
                        help="seconds between refreshes with --watch (0.1 to 3600; default 2)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(func=_cmd_status)


def _cmd_status(args: argparse.Namespace) -> int:
    import time

    from planrun.cli._read import read_status

    _check_db(args.db, must_exist=True)

    async def get(store: Any) -> Any:
        return await read_status(store, await store.load(args.run_id), time.time())

    while True:
        status = _with_store(args.db, get)
        if args.json:
            print(json.dumps(status.to_dict()))
        else:
            print(status.render())
        if not args.watch or status.finished:
            return EXIT_OK
        time.sleep(args.interval)



def _add_approve(subparsers: _Subparsers) -> None:
    parser = subparsers.add_parser(
        "approve", help="approve a task waiting for approval (the run's process carries it out)")
    parser.add_argument("run_id", metavar="RUN_ID", help="the run's id (planrun runs lists them)")
    parser.add_argument("task_id", metavar="TASK_ID", help="the waiting task's id")
    _db_flag(parser)
    parser.add_argument("--note", default=None, help="recorded with the approval")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(func=_cmd_decide, approve=True)
    parser = subparsers.add_parser(
        "reject", help="reject a task waiting for approval: it is dead, cause 'rejected'")
    parser.add_argument("run_id", metavar="RUN_ID", help="the run's id (planrun runs lists them)")
    parser.add_argument("task_id", metavar="TASK_ID", help="the waiting task's id")
    _db_flag(parser)
    parser.add_argument("--reason", required=True, help="why (recorded as the task's error)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(func=_cmd_decide, approve=False)


def _cmd_decide(args: argparse.Namespace) -> int:
    from planrun.runtime import approve_task, reject_task

    _check_db(args.db, must_exist=True)

    async def go(store: Any) -> Any:
        if args.approve:
            return await approve_task(store, args.run_id, args.task_id, args.note)
        return await reject_task(store, args.run_id, args.task_id, args.reason)

    task = _with_store(args.db, go)
    decision = "approved" if args.approve else "rejected"
    if args.json:
        print(json.dumps({"run": args.run_id, "task": task.id, "decision": decision,
                          "note": task.error, "status": task.status.value}))
    else:
        print(f"{task.id}: {decision}; the run's process carries it out "
              f"(or 'planrun resume {args.run_id}' if none runs)")
    return EXIT_OK


def _add_worker(subparsers: _Subparsers) -> None:
    parser = subparsers.add_parser(
        "worker", help="a worker process: does the attempts of runs started with --workers "
        "external",
        description="Serve the DBOS queues of the app's kinds in the database: take each "
        "attempt put there by a run, do it, send back its outcome; heartbeat while holding "
        "any. The run decides what an outcome means.",
    )
    _db_flag(parser)
    parser.add_argument("--app", required=True, metavar="module:attr",
                        help="the App whose kinds this worker does")
    parser.add_argument("--kinds", type=_kind_list, metavar="a,b", help="default: all")
    parser.add_argument("--concurrency", type=_positive_int, default=4, metavar="N",
                        help="attempts this worker runs at once")
    parser.add_argument("--name", help="unique worker name (default host-pid)")
    parser.add_argument("--lease", type=_seconds, default=30.0, metavar="S",
                        help="seconds a taken task is held between heartbeats (default 30)")
    parser.add_argument("--idle-exit", type=_seconds, metavar="S",
                        help="exit after S seconds with no running run")
    parser.add_argument("--timeout", type=_seconds, metavar="S",
                        help="seconds one attempt may take (a kind's timeout_s wins); "
                        "then it fails as transient and retries")
    _limit_flags(parser, worker=True)
    parser.add_argument("--model", help="model name (default $PLANRUN_MODEL or gpt-4o-mini); "
                        "'test': the offline test model, which plans over the app's kinds")
    parser.set_defaults(func=_cmd_worker)


def _cmd_worker(args: argparse.Namespace) -> int:
    import signal

    from planrun._facade import load_app
    from planrun.runtime import DBOSWorker, import_dbos

    _check_db(args.db)
    import_dbos()  # the [dbos] extra, before anything else is looked at
    app = load_app(args.app)
    model = _model(args, app) if app.needs_model() else None

    async def go(store: Any) -> DBOSWorker:
        import asyncio

        worker = DBOSWorker(app.registry, store, args.db, name=args.name, kinds=args.kinds,
                            concurrency=args.concurrency, lease_s=args.lease,
                            idle_exit=args.idle_exit, timeout=args.timeout,
                            extras_for=_run_extras(store, model, args), app_name=args.app)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        print(f"worker {worker.name}: kinds {', '.join(worker.kinds)}, "
              f"concurrency {worker.concurrency}", file=sys.stderr)
        for line in await worker.lacking():
            print(f"worker {worker.name}: {line}", file=sys.stderr)
        await worker.arun()
        return worker

    worker = _with_store(args.db, go)
    print(f"worker {worker.name}: {worker.done} completed, {worker.failed} failed",
          file=sys.stderr)
    return EXIT_OK


def _run_extras(store: Any, model: Any, args: argparse.Namespace) -> Any:
    """Per run: a model limited by the run's shared rate limit, a meter on its budget."""
    import asyncio
    import copy
    import logging

    from planrun.model import RunLimits, SharedBudget, SharedRateLimiter, Usage

    log = logging.getLogger("planrun.cli")
    cache: dict[str, dict[str, Any]] = {}
    lock = asyncio.Lock()

    async def extras_for(run_id: str) -> dict[str, Any]:
        async with lock:
            if run_id in cache:
                return cache[run_id]
            state = await store.load_tasks(run_id)
            recorded = RunLimits.from_meta(state.run.meta)
            mine = _run_limits(args, budget=False)
            if recorded.rated and mine.rated and (recorded.rpm, recorded.tpm) != (
                    mine.rpm, mine.tpm):
                log.warning("run %s records its own rate limit (rpm %s, tpm %s); this "
                            "worker's --rpm/--tpm apply to runs that record none",
                            run_id, recorded.rpm, recorded.tpm)
            limits = recorded if recorded.rated else mine
            shared = SharedBudget(store, run_id, enforce=recorded.budgeted)
            await shared.open()  # keeps the run's limits and what it spent
            extras: dict[str, Any] = {"usage": Usage(shared=shared)}
            if model is not None:
                own = copy.copy(model)  # one HTTP client; this run's limiter
                own.limiter = None
                if limits.rated:
                    own.limiter = SharedRateLimiter(
                        store, limits.key or _limit_key(args), limits.rpm, limits.tpm,
                        request_burst=limits.request_burst or 1.0)
                extras["model"] = own
            cache[run_id] = extras
            return extras

    return extras_for


# ---------------------------------------------------------------------------------- demo


def _add_demo(subparsers: _Subparsers) -> None:
    from planrun.dev.demo import DEMOS

    parser = subparsers.add_parser(
        "demo", help="the worked examples end to end, offline from their fixtures",
        description="Replay a worked example through the real decomposer, supervisor and "
        "model client: the goal, the validated plan, live progress, the final report. "
        "--live runs it against the configured endpoint instead (OPENAI_API_KEY).",
    )
    parser.add_argument("name", nargs="?", default="brief", choices=DEMOS,
                        help="brief (default), tickets (200 tickets) or release")
    parser.add_argument("--live", action="store_true", help="call the real endpoint")
    parser.add_argument("--model", help="model name for --live")
    _timeout_flag(parser)
    parser.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    from planrun.dev.demo import run_demo

    report = run_demo(args.name, live=args.live, model_name=args.model, timeout=args.timeout)
    return EXIT_OK if report.audit.clean else 1

# -------------------------------------------------------------------------------- parser


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="planrun",
        description="Turn a goal into a validated task plan and run it under a supervisor.",
    )
    parser.add_argument("--version", action="version", version=f"planrun {_version()}")
    subparsers = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, title="commands"
    )
    _add_validate(subparsers)
    _add_simulate(subparsers)
    _add_compare(subparsers)
    _add_plan(subparsers)
    _add_estimate(subparsers)
    _add_run(subparsers)
    _add_resume(subparsers)
    _add_runs(subparsers)
    _add_status(subparsers)
    _add_approve(subparsers)
    _add_worker(subparsers)
    _add_demo(subparsers)
    from planrun.cli.ui import add_ui_parser

    add_ui_parser(subparsers, _db_flag, _check_db)
    from planrun.cli._eval import add_eval_parser

    add_eval_parser(subparsers)
    module = _fixtures_cli()
    if module is not None:
        module.add_fixtures_parser(subparsers)
    return parser


def _cwd_importable() -> None:
    """Let ``--app myapp:app`` find ``myapp.py`` in the current directory, as uvicorn does."""
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.insert(0, cwd)


def _exit_code(code: object) -> int:
    if code is None:
        return EXIT_OK
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    try:
        status = _main(argv)
        sys.stdout.flush()  # a reader that went away is found here, not at exit
        return status
    except BrokenPipeError:
        return _closed_pipe()
    except KeyboardInterrupt:  # before a verb started (while importing, say)
        print("planrun: interrupted", file=sys.stderr)
        return 130


EXIT_CLOSED_PIPE = 141
"""The status of a command whose reader closed the pipe (``planrun runs | head -3``): what
a shell reports for a process that SIGPIPE ended, without a word on stderr."""


def _closed_pipe() -> int:
    """The reader of stdout went away: say nothing, and let nothing more be written there
    (Python flushes stdout once more at exit, which would complain)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is not a file (captured)
        pass
    return EXIT_CLOSED_PIPE


def _main(argv: Sequence[str] | None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = _build_parser()
    _cwd_importable()
    tracing.configure_from_env(os.environ)  # PLANRUN_TRACE_FILE: spans to a file
    try:
        args = parser.parse_args(words)
    except SystemExit as exc:  # argparse: --help or --version
        return _exit_code(exc.code)
    except _ArgumentsError as exc:
        return _fail(f"{exc.prog}: error", str(exc), json_wanted="--json" in words)
    args.argv = words  # what a recording names as the command that made it
    as_json = bool(getattr(args, "json", False))
    try:
        status: int = args.func(args)
    except InvalidPlan as exc:
        return _fail("planrun: error", _invalid_plan_line(exc), as_json, EXIT_INVALID,
                     [p.to_dict() for p in exc.problems])
    except (_CliError, PlanrunError) as exc:
        from planrun.dev.fixtures import FixtureMiss

        if isinstance(exc, FixtureMiss):  # the one error that is more than a line: its diff
            return _fail("planrun: error", _fixture_miss_text(exc, argv), as_json)
        return _fail("planrun: error", _error_line(exc), as_json)
    except KeyboardInterrupt:
        print(f"planrun: interrupted{getattr(args, 'on_interrupt', '')}", file=sys.stderr)
        return 130
    except BrokenPipeError:
        raise  # the reader went away: main() exits quietly
    except Exception as exc:  # a defect: still one line; PLANRUN_TRACEBACK=1 shows it all
        if os.environ.get("PLANRUN_TRACEBACK"):
            raise
        return _fail("planrun: internal error",
                     f"{type(exc).__name__}: {_one_line(str(exc))} (set PLANRUN_TRACEBACK=1 "
                     "to see where)", as_json, 1)
    return status


def _fail(prefix: str, message: str, json_wanted: bool, code: int = EXIT_USAGE,
          problems: Sequence[dict[str, Any]] = ()) -> int:
    """Report an error and return ``code``: ``PREFIX: MESSAGE`` on stderr, or with
    ``--json`` the object ``{"error": MESSAGE, "problems": [...]}`` on stdout (the problems
    of an invalid plan, as ``planrun validate --json`` lists them; else none)."""
    if json_wanted:
        print(json.dumps({"error": message, "problems": list(problems)}, ensure_ascii=False))
    else:
        print(f"{prefix}: {message}", file=sys.stderr)
    return code


_LISTED_PROBLEMS = 5


def _one_line(text: str, limit: int = 500) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _invalid_plan_line(exc: Any) -> str:
    """Every problem of an invalid plan (the first few), on one line."""
    problems = list(exc.problems)
    shown = "; ".join(_one_line(str(p), 300) for p in problems[:_LISTED_PROBLEMS])
    more = len(problems) - _LISTED_PROBLEMS
    tail = f"; and {more} more (planrun validate lists them all)" if more > 0 else ""
    count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
    return f"invalid plan, {count}: {shown}{tail}"


def _error_line(exc: BaseException) -> str:
    """One line for an error: the whole message (a server's error often says what is wrong
    on its later lines), its lines joined, any key redacted."""
    text = " ".join(line.strip() for line in redact(str(exc)).splitlines() if line.strip())
    return _one_line(text) if text else type(exc).__name__


def _fixture_miss_text(exc: Any, argv: Sequence[str] | None) -> str:
    """The miss with its diff (as the README promises) and a re-record command that works
    here: a shipped cassette's tool is not in a wheel, so the user's command is offered."""
    module = _fixtures_cli()
    text = str(exc)
    if module is not None and exc.command:
        fix = module.rerecord_command(exc.command, argv)
        if fix != exc.command:
            text = text.replace(exc.command, fix)
    return text


if __name__ == "__main__":
    sys.exit(main())
