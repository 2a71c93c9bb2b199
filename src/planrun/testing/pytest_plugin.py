"""pytest plugin: the ``planrun_cassette`` fixture, its marker and ``--planrun-record``.

Loaded only where a test suite asks for it: ``pytest -p planrun.testing.pytest_plugin``, or
``pytest_plugins = ["planrun.testing.pytest_plugin"]`` in the suite's top ``conftest.py``
(installing planrun adds nothing to other test runs). A test names its cassette with the
marker and builds its model from the fixture; by default the cassette is replayed (nothing leaves
the machine, a request with no recording fails the test with :class:`FixtureMiss`, and an
interaction left unplayed fails it at teardown)::

    @pytest.mark.planrun_cassette("release.json")
    def test_release(planrun_cassette: CassetteFixture) -> None:
        report = plan_and_run(RELEASE_PLAN, release.make_app(),
                              model=planrun_cassette.model(), on_dead="abort_run")
        assert report.ok

``pytest --planrun-record`` records instead: the same tests run against the live endpoint
(``OPENAI_API_KEY``, ``OPENAI_BASE_URL``, read when pytest starts, before any fixture
clears them) and rewrite their cassettes. Cassettes live in ``fixtures/`` under the root
directory, or in the folder the ``planrun_fixtures`` ini option names.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pytest

from planrun.dev.fixtures import Cassette, record, replay

if TYPE_CHECKING:
    from planrun.model import Model

__all__ = ["CassetteFixture", "planrun_cassette"]

_ENV = pytest.StashKey[dict[str, str]]()


@dataclass
class CassetteFixture:
    """What the ``planrun_cassette`` fixture gives a test."""

    mode: Literal["replay", "record"]
    path: Path
    cassette: Cassette
    """Replay: the loaded cassette (``unused()``, ``stats``, ``log``). Record: the one being
    filled, written at teardown."""
    env: dict[str, str] = field(default_factory=dict, repr=False)

    def model(self, **options: Any) -> Model:
        """The model to run with: replaying, the cassette's; recording, the live one."""
        if self.mode == "replay":
            return self.cassette.model(**options)
        from planrun.model import Model

        options.setdefault("api_key", self.env["OPENAI_API_KEY"])
        options.setdefault("base_url", self.env.get("OPENAI_BASE_URL") or None)
        return Model(self.env.get("PLANRUN_MODEL") or None, **options)


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--planrun-record`` and the ``planrun_fixtures`` ini option."""
    group = parser.getgroup("planrun", "planrun cassettes")
    group.addoption(
        "--planrun-record",
        action="store_true",
        default=False,
        help="record planrun_cassette fixtures against the live API (needs OPENAI_API_KEY) "
        "instead of replaying them",
    )
    parser.addini("planrun_fixtures", "folder of planrun cassettes (default: fixtures)",
                  default="fixtures")


def pytest_configure(config: pytest.Config) -> None:
    """Declare the marker; when recording, keep the live credentials before tests hide them."""
    config.addinivalue_line(
        "markers",
        "planrun_cassette(name, *, allow_unused=False): the cassette (a file in the "
        "planrun_fixtures folder) that the planrun_cassette fixture replays or records",
    )
    env = {k: os.environ[k] for k in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "PLANRUN_MODEL")
           if os.environ.get(k)}
    config.stash[_ENV] = env
    if config.getoption("--planrun-record") and "OPENAI_API_KEY" not in env:
        raise pytest.UsageError("--planrun-record needs OPENAI_API_KEY in the environment")


def _cassette_path(request: pytest.FixtureRequest) -> tuple[Path, bool]:
    marker = request.node.get_closest_marker("planrun_cassette")
    name = str(marker.args[0]) if marker is not None and marker.args else (
        re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name) + ".json"
    )
    allow_unused = bool(marker.kwargs.get("allow_unused", False)) if marker else False
    folder = Path(str(request.config.getini("planrun_fixtures")))
    if not folder.is_absolute():
        folder = Path(request.config.rootpath) / folder
    return folder / name, allow_unused


@pytest.fixture
def planrun_cassette(request: pytest.FixtureRequest) -> Iterator[CassetteFixture]:
    """Replay (default) or, with ``--planrun-record``, record this test's cassette."""
    path, allow_unused = _cassette_path(request)
    rerecord = f"pytest {request.node.nodeid} --planrun-record"
    if request.config.getoption("--planrun-record"):
        env = request.config.stash[_ENV]
        with record(path, base_url=env.get("OPENAI_BASE_URL"), command=rerecord) as recorder:
            yield CassetteFixture("record", path, recorder.cassette, env)
        return
    if not path.is_file():
        pytest.fail(f"no cassette {path}; record it with: {rerecord}", pytrace=False)
    with replay(path) as cassette:
        yield CassetteFixture("replay", path, cassette)
    unused = cassette.unused_indices()
    if unused and not allow_unused:
        shown = ", ".join(f"#{n}" for n in unused[:10])
        pytest.fail(
            f"{len(unused)} interaction(s) of {path.name} were never played ({shown}); the "
            f"code no longer makes them. Re-record with: {cassette.command or rerecord}",
            pytrace=False,
        )
