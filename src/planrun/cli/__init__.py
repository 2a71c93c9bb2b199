"""The ``planrun`` command: argument parsing and printing over the public API."""

from planrun.cli._main import main

__all__ = ["main"]
