"""The run viewer: a local web page over a run store, beside the command line.

    planrun ui --db sqlite:///runs.db          # prints the address to open, token in it

    from planrun.cli.ui import serve_ui
    serve_ui("postgresql://localhost/runs", port=8765)

It lists the store's runs and shows a run as a graph of its tasks, coloured by status and
updated while the run goes on; a task waiting for approval gets Approve and Reject buttons
that do what ``planrun approve`` and ``planrun reject`` do. It reads what ``planrun status``
reads, through the store's public methods, and needs the ``[ui]`` extra (Starlette and
uvicorn), imported only when a server starts.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from typing import Any

from planrun.cli.ui._serve import DEFAULT_PORT, UIServer, serve_ui

__all__ = ["DEFAULT_PORT", "UIServer", "add_ui_parser", "serve_ui"]


def add_ui_parser(subparsers: Any, db_flag: Callable[[argparse.ArgumentParser], None],
                  check_db: Callable[..., None]) -> None:
    """Declare ``planrun ui`` on the command line's sub-parsers, its ``--db`` flag declared
    and checked as every verb's (``db_flag``, ``check_db``)."""
    parser = subparsers.add_parser(
        "ui", help="a local web page over the store: runs, each run's graph, approvals",
        description="Serve the run viewer over the store and print the address to open (a "
        "one-time token in it). Needs the [ui] extra: pip install 'planrun[ui]'.")
    db_flag(parser)
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=_port, default=DEFAULT_PORT, metavar="N",
                        help=f"port to listen on (default {DEFAULT_PORT}; 0: any free port)")
    parser.set_defaults(func=functools.partial(_cmd_ui, check_db=check_db))


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text[:40]!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is between 0 and 65535, got {value}")
    return value


def _cmd_ui(args: argparse.Namespace, check_db: Callable[..., None]) -> int:
    check_db(args.db, must_exist=True)
    serve_ui(args.db, host=args.host, port=args.port)
    return 0
