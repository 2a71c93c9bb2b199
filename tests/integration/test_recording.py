"""Recording for real over HTTP: the stand-in server on 127.0.0.1, secrets, the tools."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import openai
import pytest
from conftest import REPO

import planrun.model._prompts
from planrun._facade import RunReport, aplan_and_run, plan_and_run
from planrun.dev.fixtures import Cassette, FixtureMiss, record, replay
from planrun.dev.scenarios import SCENARIOS
from planrun.dev.testing import FakeOpenAI
from planrun.examples import brief, release
from planrun.examples.answers import answers
from planrun.model import Model, RetryPolicy
from planrun.model._prompts import PromptLibrary
from planrun.runtime._clock import VirtualClock

sys.path.insert(0, str(REPO / "tools"))
import make_fixtures
from standin import StandIn, for_scenario

FIXTURES = REPO / "fixtures"
REAL_LOOKING_KEY = "sk-proj-Rk4Lw9Qz2Xv7Tn1Bm8Hc3Jd6Fs0Gp5Ya2Ue9Io4Wr7Et1Zx3Cv6Bn8Mq0Lk2Jh5Gf"
ORG = "org-Q3kT9vLm2XpR7wYz"


@pytest.fixture
def standin() -> Iterator[StandIn]:
    """The stand-in with every example's answers, sending an org id and a cookie too."""
    server = StandIn(FakeOpenAI(answers()), extra_headers={
        "openai-organization": ORG, "set-cookie": "__cf_bm=Zk3TlQ9vW2; path=/; HttpOnly",
    })
    with server:
        yield server


def _release_through(base_url: str, key: str, **model_options: Any) -> RunReport:
    """Run the release against ``base_url`` with a model that is closed afterwards."""

    async def run() -> RunReport:
        async with Model("gpt-4o-mini", api_key=key, base_url=base_url, **model_options) as m:
            return await aplan_and_run(release.RELEASE_PLAN, release.make_app(), model=m,
                                       on_dead="abort_run")

    return asyncio.run(run())


def test_recording_goes_over_the_wire_and_never_writes_the_key(
    standin: StandIn, tmp_path: Path
) -> None:
    target = tmp_path / "release.json"
    with record(target, command="pytest tests/integration/test_recording.py") as recorder:
        report = _release_through(standin.base_url, REAL_LOOKING_KEY)
    assert report.ok
    assert standin.requests == 3 and len(recorder.cassette.interactions) == 3  # really sent
    text = target.read_text(encoding="utf-8")
    assert REAL_LOOKING_KEY not in text and REAL_LOOKING_KEY[:12] not in text
    lowered = text.lower()
    for secret in ("authorization", "bearer", "cookie", "__cf_bm", "openai-organization", ORG):
        assert secret.lower() not in lowered
    cassette = Cassette.load(target)
    assert cassette.about["made"] == "recorded" and cassette.about["model"] == "gpt-4o-mini"
    assert cassette.about["base_url"] == "http://127.0.0.1/v1"  # the loopback port dropped
    assert [i.request.prompt.name for i in cassette.interactions if i.request.prompt] == [
        "deploy", "migrate", "smoke_test"
    ]
    assert all("x-request-id" in i.response.headers for i in cassette.interactions)
    with replay(target) as replayed:
        again = plan_and_run(release.RELEASE_PLAN, release.make_app(), model=replayed.model(),
                             clock=VirtualClock())
    assert again.ok and not replayed.unused() and standin.requests == 3


@pytest.mark.parametrize(
    ("key", "placeholder"),
    [(REAL_LOOKING_KEY, "sk-***"), ("corp-gateway-token-7f3a9c", "***")],
    ids=["openai-shaped", "any-bearer-token"],
)
def test_a_key_echoed_by_the_server_is_scrubbed(
    standin: StandIn, tmp_path: Path, key: str, placeholder: str
) -> None:
    standin.reject_keys = frozenset({key})  # a 401 that quotes the key, as the API does
    target = tmp_path / "rejected.json"
    with record(target):
        report = _release_through(standin.base_url, key)
    assert {t.id: t.status for t in report.tasks}["t0"] == "dead"
    text = target.read_text(encoding="utf-8")
    assert key not in text
    (interaction,) = Cassette.load(target).interactions
    assert interaction.response.status == 401
    message = interaction.response.body["error"]["message"]
    assert message.startswith(f"Incorrect API key provided: {placeholder}.")


def test_replay_reaches_no_server_even_on_a_miss(standin: StandIn, tmp_path: Path) -> None:
    folder = tmp_path / "prompts"
    shutil.copytree(str(planrun.model._prompts.default_prompt_dir()), folder)
    template = folder / "decompose.md"
    template.write_text(template.read_text(encoding="utf-8") + "\nBe brief.\n", encoding="utf-8")
    model = Model("gpt-4o-mini", api_key=REAL_LOOKING_KEY, base_url=standin.base_url)
    with replay(FIXTURES / "brief.json"):
        report = plan_and_run(brief.GOAL, brief.make_app(), model=model, clock=VirtualClock())
    assert report.ok
    with pytest.raises(FixtureMiss, match=r"decompose changed(.|\n)*re-record"), replay(
        FIXTURES / "brief.json"
    ):
        plan_and_run(brief.GOAL, brief.make_app(), model=model, prompts=PromptLibrary(folder),
                     clock=VirtualClock())
    assert standin.requests == 0  # neither the replay nor the miss went out


def test_make_fixtures_reproduces_the_committed_cassette(tmp_path: Path) -> None:
    path = make_fixtures.make(SCENARIOS["release"], tmp_path, live=False)
    made = json.loads(path.read_text(encoding="utf-8"))
    committed = json.loads((FIXTURES / "release.json").read_text(encoding="utf-8"))
    # When and with which SDK release a cassette was made are facts of that day's machine.
    assert made["about"].pop("openai") == openai.__version__
    assert committed["about"].pop("openai")
    made["about"].pop("date")
    committed["about"].pop("date")
    assert made == committed


def test_standin_serves_a_scenario_script_in_the_wire_format(tmp_path: Path) -> None:
    with for_scenario("server_error") as server, record(tmp_path / "errors.json") as recorder:
        report = _release_through(server.base_url, REAL_LOOKING_KEY,
                                  retry=RetryPolicy(attempts=4, base=0.01, jitter=0.0))
    assert report.ok and server.requests == 5
    errors = [i.response for i in recorder.cassette.interactions if i.response.status != 200]
    assert [e.status for e in errors] == [500, 500]
    assert errors[0].body["error"]["type"] == "server_error"


def test_the_pytest_plugin_is_inactive_until_a_suite_asks_for_it(tmp_path: Path) -> None:
    """Installing planrun adds nothing to a test run: no entry point, no option, no fixture;
    ``-p planrun.testing.pytest_plugin`` brings all three."""
    assert not [e for e in entry_points(group="pytest11") if e.value.startswith("planrun")]
    (tmp_path / "test_plain.py").write_text(
        "def test_fixture(planrun_cassette):\n    pass\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}

    def pytest_run(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
        return done.stdout + done.stderr

    plain = pytest_run("--help")
    assert "--planrun-record" not in plain and "planrun_fixtures" not in plain, plain
    assert "fixture 'planrun_cassette' not found" in pytest_run("test_plain.py")
    opted_in = pytest_run("-p", "planrun.testing.pytest_plugin", "--help")
    assert "--planrun-record" in opted_in and "planrun_fixtures" in opted_in, opted_in
    assert "no cassette" in pytest_run("-p", "planrun.testing.pytest_plugin", "test_plain.py")


def test_pytest_plugin_replays_and_fails_on_unplayed_interactions(tmp_path: Path) -> None:
    (tmp_path / "fixtures").mkdir()
    shutil.copy(FIXTURES / "release.json", tmp_path / "fixtures" / "release.json")
    (tmp_path / "test_cassettes.py").write_text(textwrap.dedent("""
        import dataclasses

        import pytest
        from planrun import App, Registry
        from planrun.examples import release
        from planrun._facade import RunReport, aplan_and_run, plan_and_run

        def migration_app():  # the release's kinds without their contracts: half is a plan
            app = release.make_app()
            return App(Registry(dataclasses.replace(s, needs=(), delivers=False)
                                for s in app.registry), app.workers)

        @pytest.mark.planrun_cassette("release.json")
        def test_release(planrun_cassette):
            report = plan_and_run(release.RELEASE_PLAN, release.make_app(),
                                  model=planrun_cassette.model(), on_dead="abort_run")
            assert report.ok and planrun_cassette.mode == "replay"

        @pytest.mark.planrun_cassette("release.json")
        def test_half_of_it(planrun_cassette):
            plan = {"goal": "g", "tasks": [release.RELEASE_PLAN["tasks"][0]]}
            assert plan_and_run(plan, migration_app(), model=planrun_cassette.model()).ok

        @pytest.mark.planrun_cassette("release.json", allow_unused=True)
        def test_half_of_it_allowed(planrun_cassette):
            plan = {"goal": "g", "tasks": [release.RELEASE_PLAN["tasks"][0]]}
            assert plan_and_run(plan, migration_app(), model=planrun_cassette.model()).ok

        @pytest.mark.planrun_cassette("absent.json")
        def test_absent(planrun_cassette):
            pass
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-p", "planrun.testing.pytest_plugin", "-rA", str(tmp_path / "test_cassettes.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    out = result.stdout + result.stderr
    assert "PASSED test_cassettes.py::test_release" in out, out
    assert "PASSED test_cassettes.py::test_half_of_it_allowed" in out, out
    assert "ERROR at teardown of test_half_of_it" in out and "never played (#0, #2)" in out, out
    assert "no cassette" in out and "--planrun-record" in out, out
    record_run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "planrun.testing.pytest_plugin",
         "--planrun-record",
         str(tmp_path / "test_cassettes.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert "--planrun-record needs OPENAI_API_KEY" in record_run.stdout + record_run.stderr
