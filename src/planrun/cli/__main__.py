"""``python -m planrun.cli``: the ``planrun`` command."""

import sys

from planrun.cli._main import main

sys.exit(main())
