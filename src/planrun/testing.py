"""Testing helpers for code that uses planrun: fake models, in-memory stores, replays.

The public face of :mod:`planrun.dev.testing`; see there for each helper.
"""

from planrun.dev.testing import *  # noqa: F403
from planrun.dev.testing import __all__ as __all__
