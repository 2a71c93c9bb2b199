"""The command-line reference, written from the parser itself so it cannot drift.

The docs site's ``reference/cli.md`` is this module's :func:`cli_reference` (a MkDocs hook,
``docs/hooks/cli_reference.py``, puts it in the page at build time).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from planrun.cli._main import _build_parser

__all__ = ["cli_reference"]


def _subcommands(
    parser: argparse.ArgumentParser,
) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each verb of ``parser``, in declaration order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def _flags(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    metavar = ""
    if action.nargs != 0:
        metavar = f" {action.metavar or action.dest.upper()}"
        if action.choices is not None and action.metavar is None:
            metavar = " {" + ",".join(map(str, action.choices)) + "}"
    return ", ".join(f"`{flag}{metavar}`" for flag in action.option_strings)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _arguments(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction,
                               argparse._VersionAction)):
            continue
        text = action.help or ""
        if text == argparse.SUPPRESS:
            continue
        if "%(" in text:
            text = text % {**vars(action), "prog": parser.prog}
        default = action.default
        shown = (action.option_strings and action.nargs != 0 and default not in (None, False)
                 and default != argparse.SUPPRESS and "default" not in text)
        if shown:
            text = f"{text}; default `{default}`"
        rows.append(f"| {_cell(_flags(action))} | {_cell(text)} |")
    if not rows:
        return []
    return ["| argument | meaning |", "| --- | --- |", *rows, ""]


def _section(name: str, summary: str, parser: argparse.ArgumentParser, level: int) -> list[str]:
    lines = [f"{'#' * level} `{name}`", ""]
    if summary:
        lines += [_cell(summary[:1].upper() + summary[1:]) + ".", ""]
    usage = parser.format_usage().removeprefix("usage: ").strip()
    lines += ["```", " ".join(usage.split()), "```", ""]
    if parser.description and parser.description != summary:
        lines += [_cell(parser.description), ""]
    lines += _arguments(parser)
    for sub_name, sub_help, sub in _subcommands(parser):
        lines += _section(f"{name} {sub_name}", sub_help, sub, level + 1)
    return lines


def cli_reference() -> str:
    """The reference of every ``planrun`` verb as Markdown: usage, description, arguments."""
    parser = _build_parser()
    lines = [_cell(parser.description or ""), ""]
    for name, summary, sub in _subcommands(parser):
        lines += _section(f"planrun {name}", summary, sub, level=2)
    return "\n".join(lines).rstrip() + "\n"
