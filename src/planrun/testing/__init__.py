"""Testing helpers for code that uses planrun: an offline model, replays, recordings, fakes.

:class:`TestModel` is the model to try your own app with: no key, no server, no network. It
plans over your app's kinds (keeping their payload schemas and contracts) and answers every
other request with a valid instance of its schema, through the real client over HTTP on
127.0.0.1, so its traffic can be recorded and replayed::

    report = plan_and_run("a goal", app, model=TestModel(app))

:func:`replay` answers every model call from a cassette: a file, or the name of one that
planrun ships (:func:`shipped_names` lists them), so every documented model example runs
offline; a request with no recording raises :class:`FixtureMiss`. :func:`record` writes
one from real traffic::

    with replay("brief") as cassette:
        report = plan_and_run(brief.GOAL, brief.make_app(), model=cassette.model())

:class:`FakeOpenAI`, :class:`FakeBatchAPI` and :class:`InMemoryStore` are the doubles of
:mod:`planrun.dev.testing`; :func:`answered_by` serves a fake (any function from an
``httpx2.Request`` to an ``httpx2.Response``) to every model call made in a block, the way
a replay serves a cassette. None of this needs a test library.

The pytest plugin (the ``planrun_cassette`` fixture and ``--planrun-record``) is
:mod:`planrun.testing.pytest_plugin`, loaded only by the test suites that ask for it
(``pytest -p planrun.testing.pytest_plugin``).
"""

from planrun.dev.fixtures import (
    Cassette,
    FixtureMiss,
    answered_by,
    record,
    replay,
    shipped_cassette,
    shipped_names,
)
from planrun.dev.testing import *  # noqa: F403
from planrun.dev.testing import __all__ as _doubles
from planrun.dev.testmodel import TestModel

__all__ = ["Cassette", "FixtureMiss", "TestModel", "answered_by", "record", "replay",
           "shipped_cassette", "shipped_names", *_doubles]
