"""The ``planrun`` command line.

    planrun validate PLAN.json --kinds a,b,c [--json] [--min-tasks N] [--max-tasks N]
    planrun --version

Each verb has an ``_add_<verb>(subparsers)`` that declares its arguments and sets
``func=_cmd_<verb>``; ``_cmd_<verb>(args)`` returns the exit status. To add a verb, write
both and call ``_add_<verb>`` from :func:`_build_parser`.

Exit status: 0 success, 2 an invalid plan or a usage error (bad arguments, an unreadable
file); errors are one line on stderr, ``planrun: error: ...``, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from planrun.errors import PlanrunError
from planrun.plan import Plan, validate_plan

__all__ = ["main"]

EXIT_OK = 0
EXIT_INVALID = 2
EXIT_USAGE = 2

_Subparsers = Any  # argparse._SubParsersAction is private; keep it out of signatures


class _CliError(Exception):
    """A usage problem found while running a verb; printed as one line, exit 2."""


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


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _positive_int(text: str) -> int:
    value = _non_negative_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _read_input(path: str) -> bytes | str:
    """The bytes of ``path``, or of stdin for ``-``."""
    if path == "-":
        buffer = getattr(sys.stdin, "buffer", None)
        data: bytes | str = buffer.read() if buffer is not None else sys.stdin.read()
        return data
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise _CliError(f"cannot read {path!r}: {reason}") from exc


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
    parser.add_argument(
        "--kinds",
        required=True,
        type=_kind_list,
        metavar="a,b,c",
        help="comma-separated names of the kinds that exist",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='print {"valid": bool, "problems": [{"code", "task", "message"}]}',
    )
    parser.add_argument("--min-tasks", type=_non_negative_int, default=1, metavar="N")
    parser.add_argument("--max-tasks", type=_positive_int, default=50, metavar="N")
    parser.set_defaults(func=_cmd_validate)


def _cmd_validate(args: argparse.Namespace) -> int:
    if args.min_tasks > args.max_tasks:
        raise _CliError(
            f"--min-tasks ({args.min_tasks}) is greater than --max-tasks ({args.max_tasks})"
        )
    raw = _read_input(args.plan)
    bounds = {"min_tasks": args.min_tasks, "max_tasks": args.max_tasks}
    problems = validate_plan(raw, args.kinds, **bounds)
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
    plan = Plan.parse(raw, args.kinds, **bounds)
    n = len(plan.tasks)
    print(f"valid: {n} task{'s' if n != 1 else ''}")
    order = plan.topological_order()
    print("order: " + (" -> ".join(str(i) for i in order) if order else "(no tasks)"))
    return EXIT_OK


# -------------------------------------------------------------------------------- parser


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="planrun",
        description="Turn a goal into a validated task plan and run it under a supervisor.",
    )
    parser.add_argument("--version", action="version", version=f"planrun {_version()}")
    subparsers = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, title="commands"
    )
    _add_validate(subparsers)
    return parser


def _exit_code(code: object) -> int:
    if code is None:
        return EXIT_OK
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help, --version, or a usage error (2)
        return _exit_code(exc.code)
    try:
        status: int = args.func(args)
    except (_CliError, PlanrunError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"planrun: error: {message}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("planrun: interrupted", file=sys.stderr)
        return 130
    return status


if __name__ == "__main__":
    sys.exit(main())
