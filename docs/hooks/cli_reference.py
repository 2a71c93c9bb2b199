"""MkDocs hook: the command-line reference page is written from ``planrun``'s own parser."""

from __future__ import annotations

from typing import Any

MARKER = "<!-- cli-reference -->"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Put :func:`planrun.cli._reference.cli_reference` where the page has the marker."""
    if MARKER not in markdown:
        return markdown
    from planrun.cli._reference import cli_reference

    return markdown.replace(MARKER, cli_reference())
