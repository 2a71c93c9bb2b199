"""Testing helpers for code that uses planrun: replays, fake models, in-memory stores.

:func:`replay` answers every model call from a cassette: a file, or the name of one that
planrun ships (:func:`shipped_names` lists them), so every documented model example runs
offline::

    with replay("brief") as cassette:
        report = plan_and_run(brief.GOAL, brief.make_app(), model=cassette.model())

:class:`FakeOpenAI`, :class:`FakeBatchAPI` and :class:`InMemoryStore` are the doubles of
:mod:`planrun.dev.testing`.
"""

from planrun.dev.fixtures import Cassette, replay, shipped_cassette, shipped_names
from planrun.dev.testing import *  # noqa: F403
from planrun.dev.testing import __all__ as _doubles

__all__ = ["Cassette", "replay", "shipped_cassette", "shipped_names", *_doubles]
