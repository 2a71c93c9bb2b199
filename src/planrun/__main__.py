"""``python -m planrun``: the same command line as ``planrun``."""

from __future__ import annotations

import sys

from planrun.cli import main

if __name__ == "__main__":
    sys.exit(main())
