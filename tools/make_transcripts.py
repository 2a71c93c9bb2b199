"""Write the ``planrun demo`` transcripts in the README and the docs from the demo itself.

A transcript sits between ``<!-- demo-transcript NAME [excerpt] -->`` and
``<!-- /demo-transcript -->`` in a Markdown file: the demo ``NAME`` run here, printed at
a fixed width as it prints when piped; ``excerpt`` keeps its first and last lines. So the
documents show what the demo prints, not what it once printed:

    python tools/make_transcripts.py            # rewrite every transcript
    python tools/make_transcripts.py --check    # exit 1 when one differs from the demo

``tests/unit/test_docs.py`` runs the check in CI. Run ids and durations differ from run to
run; they are compared masked.
"""

from __future__ import annotations

import argparse
import io
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = (REPO / "README.md", REPO / "docs" / "index.md")
WIDTH = 96
"""Columns the transcripts are printed at (a wide terminal's; the page shows them whole)."""
EXCERPT = 3
"""Lines kept at each end of an excerpt."""

_BLOCK = re.compile(
    r"(<!-- demo-transcript (?P<name>\w+)(?P<excerpt> excerpt)? -->\n)(?P<body>.*?)"
    r"(<!-- /demo-transcript -->)", re.S)
_MASKS = ((re.compile(r"\brun [0-9a-f]{12}\b"), "run <id>"),
          (re.compile(r"\bin \d+\.\d s\b"), "in <t> s"))


def demo_output(name: str) -> str:
    """What ``planrun demo NAME`` prints when piped, at :data:`WIDTH` columns."""
    from rich.console import Console

    from planrun.dev.demo import run_demo

    buffer = io.StringIO()
    run_demo(name, console=Console(file=buffer, width=WIDTH, color_system=None,
                                   force_terminal=False))
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines())


def block(name: str, excerpt: bool, output: str) -> str:
    """The fenced block for a transcript."""
    lines = output.splitlines()
    if excerpt and len(lines) > 2 * EXCERPT + 2:
        lines = [*lines[1:3], "...", *lines[-EXCERPT:]]  # the goal and the plan; the end
    command = "planrun demo" if name == "brief" else f"planrun demo {name}"
    return "```\n$ " + command + "\n" + "\n".join(lines) + "\n```\n"


def masked(text: str) -> str:
    for pattern, mask in _MASKS:
        text = pattern.sub(mask, text)
    return text


def rewritten(text: str, outputs: dict[str, str]) -> str:
    """``text`` with every transcript block written from ``outputs`` (demo name -> output)."""

    def fill(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in outputs:
            outputs[name] = demo_output(name)
        return match[1] + block(name, bool(match["excerpt"]), outputs[name]) + match[5]

    return _BLOCK.sub(fill, text)


def problems(outputs: dict[str, str] | None = None) -> list[str]:
    """The documents whose transcripts differ from the demo's output (masked)."""
    outputs = {} if outputs is None else outputs
    found = []
    for path in DOCUMENTS:
        text = path.read_text(encoding="utf-8")
        if not _BLOCK.search(text):
            found.append(f"{path.relative_to(REPO)}: no demo transcript block")
        elif masked(rewritten(text, outputs)) != masked(text):
            found.append(f"{path.relative_to(REPO)}: a demo transcript differs from the demo")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when a transcript differs from the demo's output")
    args = parser.parse_args(argv)
    outputs: dict[str, str] = {}
    if args.check:
        found = problems(outputs)
        for line in found:
            print(line, file=sys.stderr)
        if found:
            print("run python tools/make_transcripts.py to write them", file=sys.stderr)
        return 1 if found else 0
    for path in DOCUMENTS:
        text = path.read_text(encoding="utf-8")
        path.write_text(rewritten(text, outputs), encoding="utf-8")
        print(f"wrote the transcripts of {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
