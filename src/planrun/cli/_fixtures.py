"""Command-line glue for cassettes: ``planrun fixtures check|show`` and ``--record/--replay``.

:mod:`planrun.cli._main` wires these in; nothing here parses ``sys.argv`` by itself.

    planrun fixtures check [PATH ...] [--app module:attr]   # exit 1 when one is stale
    planrun fixtures show PATH            # what a cassette holds and how it was made
    planrun run ... --replay fixtures/brief.json
    planrun run ... --record fixtures/mine.json
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from planrun.core import UsageError
from planrun.dev.fixtures import Cassette, Recorder, Stale, check, record, replay

if TYPE_CHECKING:
    from planrun.model import Model

__all__ = [
    "DEFAULT_FIXTURES",
    "add_cassette_flags",
    "add_fixtures_parser",
    "cassette_context",
    "cmd_fixtures_check",
    "cmd_fixtures_show",
    "replay_model",
    "rerecord_command",
]

DEFAULT_FIXTURES = Path("fixtures")
"""Where ``planrun fixtures check`` looks when given no paths (relative to the cwd)."""

EXIT_OK = 0
EXIT_STALE = 1
_SHOWN = 20


def add_fixtures_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``fixtures`` verb (``check`` and ``show``) on ``subparsers``.

    Each sub-verb sets ``func`` to a function of the parsed arguments returning the exit
    status, as the other verbs of :mod:`planrun.cli._main` do.
    """
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "fixtures",
        help="check or inspect recorded cassettes",
        description="Recorded model traffic (cassettes) used by tests, demo and notebooks.",
    )
    verbs = parser.add_subparsers(dest="fixtures_command", metavar="VERB", required=True)
    check_parser = verbs.add_parser(
        "check",
        help="list cassettes the current prompts and schemas no longer match",
        description=(
            "Re-run each cassette against it (a shipped scenario, or the planrun plan or "
            "run command that recorded it), rendering every request again from the current "
            "prompts and schemas, and list every request that has no recording any more (a "
            "template, a result schema or a parameter changed), the first one with its diff, "
            "and every recording no longer requested. Exit 0 when all are fresh, 1 when not."
        ),
    )
    check_parser.add_argument(
        "paths", nargs="*", metavar="PATH",
        help=f"cassette files or folders (default: every *.json in {DEFAULT_FIXTURES}/)",
    )
    check_parser.add_argument(
        "--app", metavar="module:attr",
        help="the app to re-run a cassette recorded with planrun plan or run (default: the "
        "--app its recording command names)",
    )
    check_parser.set_defaults(func=cmd_fixtures_check)
    show_parser = verbs.add_parser(
        "show",
        help="summarise a cassette",
        description="Interactions, statuses, tokens, models, and how and when it was made.",
    )
    show_parser.add_argument("path", metavar="PATH", help="the cassette file")
    show_parser.set_defaults(func=cmd_fixtures_show)
    return parser


def _shipped_fixtures() -> Path | None:
    """The cassettes shipped with planrun: in the wheel, else the source tree's ``fixtures/``."""
    from importlib import resources

    packaged = Path(str(resources.files("planrun") / "fixtures_data"))
    if packaged.is_dir():
        return packaged
    repo = Path(__file__).resolve().parents[3] / "fixtures"
    return repo if repo.is_dir() else None


def _cassette_files(paths: Sequence[str]) -> list[Path]:
    default = DEFAULT_FIXTURES if DEFAULT_FIXTURES.is_dir() else _shipped_fixtures()
    targets = [Path(p) for p in paths] or ([default] if default is not None else [])
    if not targets:
        raise UsageError(f"no {DEFAULT_FIXTURES}/ folder here; name the cassettes to check")
    files: list[Path] = []
    for target in targets:
        if target.is_dir():
            files += sorted(target.glob("*.json"))
        elif target.is_file():
            files.append(target)
        else:
            raise UsageError(f"no cassette or folder {str(target)!r}")
    if not files:
        raise UsageError(f"no cassettes (*.json) in {', '.join(map(str, targets))}")
    return files


def cmd_fixtures_check(args: argparse.Namespace) -> int:
    """``planrun fixtures check``: print what is stale; 0 when nothing is, else 1."""
    files = _cassette_files(getattr(args, "paths", []) or [])
    found = check(files, rerun=lambda cassette: rerun_entry(cassette, getattr(args, "app", None)))
    # A cassette made by something other than planrun plan or run (a test, a script) cannot
    # be re-run here: that makes it unchecked, not stale (it loaded, so its interactions are
    # well formed); what made it checks it when it replays.
    unnamed = [s for s in found if s.kind == "unchecked" and not _names_scenario(s.path)]
    stale = [s for s in found if s not in unnamed]
    for item in unnamed:
        made = Cassette.load(item.path).command
        print(f"{item.path}: loaded, {_count(item.path)} interaction(s); not re-run (made "
              f"by {made or 'no command it names'}: replaying it checks it)")
    if not stale:
        print(f"fresh: {len(files) - len(unnamed)} cassette"
              f"{'s' if len(files) - len(unnamed) != 1 else ''}"
              + (f", {len(unnamed)} not re-run" if unnamed else ""))
        return EXIT_OK
    by_file: dict[str, list[Stale]] = {}
    for item in stale:
        by_file.setdefault(item.path, []).append(item)
    for path, items in by_file.items():
        _print_stale(path, items)
    print(f"stale: {len(stale)} finding(s) in {len(by_file)} of {len(files)} cassette(s)",
          file=sys.stderr)
    return EXIT_STALE


def rerun_entry(cassette: Cassette, app_ref: str | None = None) -> Any:
    """How to re-run a cassette recorded by ``planrun plan`` or ``planrun run`` (its
    ``about.command``): an async ``entry(model, clock)`` doing the same with the current
    code, over ``app_ref`` (default: the ``--app`` of the command); None for a cassette
    another command (or none) made."""
    words = shlex.split(cassette.command or "")
    if len(words) < 3 or words[0] != "planrun" or words[1] not in ("plan", "run"):
        return None
    from planrun.cli._main import _ArgumentsError, _build_parser

    try:
        args = _build_parser().parse_args(words[1:])
    except (_ArgumentsError, SystemExit):
        return None
    from planrun._facade import aplan_and_run, load_app
    from planrun.model import adecompose

    app = load_app(app_ref or args.app)
    if words[1] == "plan":
        repair: Literal["code", "model"] = "model" if args.no_code_repair else "code"

        async def plan(model: Any, clock: Any) -> Any:
            return await adecompose(args.goal, app.registry, model, min_tasks=args.min_tasks,
                                    max_tasks=args.max_tasks, repair=repair)

        return plan
    from planrun.cli._main import _plan_source

    async def run(model: Any, clock: Any) -> Any:
        return await aplan_and_run(
            _plan_source(args), app, model=model, clock=clock, min_tasks=args.min_tasks,
            max_tasks=args.max_tasks, on_dead=args.on_dead, strategy=args.strategy or "balanced",
            retry_budget=args.retry_budget)

    return run


def _names_scenario(path: str) -> bool:
    return bool(Cassette.load(path).about.get("scenario"))


def _count(path: str) -> int:
    return len(Cassette.load(path).interactions)


def rerecord_command(command: str | None, argv: Sequence[str] | None = None) -> str:
    """A command that re-records a cassette and works where the user is.

    The stored one when it can run here; for a cassette made by the repository's tool
    (absent from an installed wheel), the user's own command line with ``--replay``
    turned into ``--record``.
    """
    words = command.split() if command else []
    if words and not (words[0].startswith("python") and len(words) > 1
                      and words[1].endswith(".py") and not Path(words[1]).is_file()):
        return command or ""
    args = list(sys.argv[1:] if argv is None else argv)
    for i, word in enumerate(args):
        if word == "--replay":
            args[i] = "--record"
            return shlex.join(["planrun", *args])
        if word.startswith("--replay="):
            args[i] = "--record=" + word.split("=", 1)[1]
            return shlex.join(["planrun", *args])
    return "run the same command with --record PATH (and OPENAI_API_KEY set)"


def _print_stale(path: str, items: Sequence[Stale]) -> None:
    command = Cassette.load(path).command
    print(f"{path}: {len(items)} stale")
    first, *rest = items
    print("  " + str(first).replace("\n", "\n  "))
    for item in rest[: _SHOWN - 1]:
        print("  " + str(item).splitlines()[0])
    if len(rest) >= _SHOWN:
        print(f"  ... and {len(rest) - _SHOWN + 1} more")
    print(f"  re-record: {rerecord_command(command, []) if command else '(no command stored)'}")


def cmd_fixtures_show(args: argparse.Namespace) -> int:
    """``planrun fixtures show PATH``: print the cassette's summary."""
    print(Cassette.load(args.path).summary())
    return EXIT_OK


def add_cassette_flags(parser: argparse.ArgumentParser) -> None:
    """Add ``--record PATH`` and ``--replay PATH`` (mutually exclusive) to a verb."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--record", metavar="PATH",
        help="record the model traffic of this run to a cassette (secrets scrubbed)",
    )
    group.add_argument(
        "--replay", metavar="PATH",
        help="answer every model request from a cassette; nothing reaches the network",
    )


def cassette_context(
    args: argparse.Namespace, argv: Sequence[str] | None = None
) -> AbstractContextManager[Cassette | Recorder | None]:
    """The context the run goes in: :func:`record`, :func:`replay`, or nothing.

    Under ``--replay`` it yields the :class:`Cassette`; build the run's model with
    ``cassette.model()`` (no key needed). Under ``--record`` it yields the
    :class:`Recorder`, and the cassette names ``planrun <argv>`` as its re-record command
    (``argv`` defaults to ``sys.argv[1:]``).
    """
    record_path = getattr(args, "record", None)
    replay_path = getattr(args, "replay", None)
    if record_path and replay_path:
        raise UsageError("--record and --replay cannot be used together")
    if record_path:
        words = list(sys.argv[1:] if argv is None else argv)
        return record(record_path, command=shlex.join(["planrun", *words]))
    if replay_path:
        return replay(replay_path)
    return nullcontext()


def replay_model(args: argparse.Namespace) -> Model | None:
    """Under ``--replay``, the model to run with (no API key needed); otherwise None.

    It names ``--model`` when given (``args.model``), else the model the cassette was
    recorded with, and points at an address that never resolves, so only the replay can
    answer it.
    """
    replay_path = getattr(args, "replay", None)
    if not replay_path:
        return None
    return Cassette.load(replay_path).model(getattr(args, "model", None))
