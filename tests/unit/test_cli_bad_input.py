"""Bad files and flags at the command line: one line on stderr, exit 2, nothing written.

Every case here is something a new user typed. The verbs run in process
(``planrun.cli.main``) so that the generated cases stay fast.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planrun._facade import App, load_app
from planrun.cli import main
from planrun.core._errors import UsageError
from planrun.core._registry import Registry
from planrun.examples.release import RELEASE_PLAN

RELEASE_APP = "planrun.examples.release:app"
NESTED_PLAN_IN_BROKEN_DOC = (
    '{"goal":"g","tasks":[{"kind":"noop","payload":{"n":1},"depends_on":[]},'
    '{"kind":"noop","payload":{"n":2,"tasks":[{"kind":"work","payload":{"n":99},'
    '"depends_on":[]}]},"depends_on":[0,]}]}'
)
NOT_UTF8 = b'{"goal": "caf\xe9", "tasks": []}'


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(("planrun", "invalid: ")), err  # validate: its count line


# ------------------------------------------------------------------------- plan files


def test_validate_does_not_take_a_nested_plan_for_the_document(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "b.json"
    path.write_text(NESTED_PLAN_IN_BROKEN_DOC)
    code, out, _ = run_cli(capsys, "validate", str(path), "--kinds", "noop,work", "--json")
    report = json.loads(out)
    assert code == 2 and report["valid"] is False
    assert [p["code"] for p in report["problems"]] == ["not_json"]


def test_validate_truncated_json_says_not_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(RELEASE_PLAN)[:-30])
    code, out, err = run_cli(capsys, "validate", str(path), "--kinds", "migrate_db")
    assert code == 2 and out.startswith("not_json: the text is not valid JSON")
    assert "single task" not in out and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "content",
    [
        json.dumps(RELEASE_PLAN)[:-30].encode(),  # truncated
        NESTED_PLAN_IN_BROKEN_DOC.encode(),  # a syntax error
        b"Here is the plan: " + json.dumps(RELEASE_PLAN).encode(),  # prose, not a document
        NOT_UTF8,
        b"[" * 5_000 + b"]" * 5_000,
    ],
    ids=["truncated", "syntax-error", "prose", "not-utf8", "deep"],
)
def test_run_refuses_a_bad_plan_file_and_never_asks_the_model(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    code, out, err = run_cli(capsys, "run", str(path), "--app", RELEASE_APP, "--db",
                             f"sqlite:///{tmp_path / 'runs.db'}")
    assert_one_line_error(code, err)
    assert "OPENAI_API_KEY" not in err and out == ""
    assert not (tmp_path / "runs.db").exists()


def test_run_refuses_a_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "run", str(tmp_path), "--app", RELEASE_APP)
    assert_one_line_error(code, err)
    assert "is a directory" in err and "OPENAI_API_KEY" not in err


def test_run_a_file_without_json_suffix_is_a_plan_file_too(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "plan.txt"
    path.write_text("migrate the database then deploy")
    code, _, err = run_cli(capsys, "run", str(path), "--app", RELEASE_APP)
    assert_one_line_error(code, err)
    assert "not_json" in err


def test_an_explicit_goal_goes_to_the_model_even_when_it_names_a_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "release").write_text("not a plan")
    code, _, err = run_cli(capsys, "run", "--goal", "release", "--app", RELEASE_APP)
    assert_one_line_error(code, err)
    assert "OPENAI_API_KEY" in err  # it went to the model, which needs a key


def test_an_invalid_plan_file_is_one_line_with_every_problem(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "bad.json"
    tasks = [{"kind": "nope", "payload": {}, "depends_on": [3]}] * 8
    path.write_text(json.dumps({"tasks": tasks}))
    code, _, err = run_cli(capsys, "run", str(path), "--app", RELEASE_APP)
    assert_one_line_error(code, err)
    assert "12 problems" in err and "and 7 more" in err


# --------------------------------------------------------------------------- argparse


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["compare", "--nope"], "unrecognized arguments"),
        (["validate"], "required"),
        (["nosuchverb"], "invalid choice"),
        (["simulate", "--durations", "inf,1"], "finite"),
        (["simulate", "--durations", "nan,1"], "finite"),
        (["simulate", "--durations", "1,2", "--workers", "0"], "must be >= 1, got 0"),
        (["validate", "p.json", "--kinds", "a", "--max-tasks", "-1"], "must be >= 1, got -1"),
        (["validate", "p.json", "--kinds", "a", "--max-tasks", "99999999999"], "at most"),
        (["validate", "p.json", "--kinds", "a", "--max-tasks", "9" * 5000], "integer"),
        (["worker", "--db", "memory://", "--app", RELEASE_APP, "--lease", "-5"], "> 0"),
        (["worker", "--db", "memory://", "--app", RELEASE_APP, "--lease", "0"], "> 0"),
        (["worker", "--db", "memory://", "--app", RELEASE_APP, "--lease", "inf"], "finite"),
        (["worker", "--db", "memory://", "--app", RELEASE_APP, "--idle-exit", "-1"], "> 0"),
        (["run", "p.json", "--app", RELEASE_APP, "--stale-after", "-1"], "> 0"),
        (["run", "p.json", "--app", RELEASE_APP, "--budget-usd", "nan"], "finite"),
        (["status", "r", "--db", "memory://", "--watch", "--interval", "-1"], "> 0"),
        (["status", "r", "--db", "memory://", "--watch", "--interval", "0"], "> 0"),
        (["status", "r", "--db", "memory://", "--watch", "--interval", "0.001"], "between"),
    ],
)
def test_argument_errors_are_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    code, out, err = run_cli(capsys, *argv)
    assert_one_line_error(code, err)
    assert needle in err and out == ""


def test_help_still_prints_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "run", "--help")
    assert code == 0 and "--goal" in out


# ------------------------------------------------------------------ flags refused, not ignored


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--db", ""], "--db is empty"),
        (["--stale-after", "5"], "--stale-after applies to --workers external"),
        (["--batch-poll", "5"], "--batch-size, --batch-wait and --batch-poll need --batch"),
        (["--batch", "--batch-size", "0"], "--batch-size"),
        (["--batch", "--workers", "external", "--db", "sqlite:///x.db"],
         "--batch runs with local workers"),
    ],
)
def test_flags_a_mode_cannot_use_are_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, extra: list[str], needle: str
) -> None:
    path = tmp_path / "release.json"
    path.write_text(json.dumps(RELEASE_PLAN))
    code, _, err = run_cli(capsys, "run", str(path), "--app", RELEASE_APP, *extra)
    assert_one_line_error(code, err)
    assert needle in err


@pytest.mark.parametrize("verb", [["runs"], ["status", "r1"], ["resume", "r1"]])
def test_read_only_verbs_do_not_create_a_database(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    verb: list[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, *verb, "--db", "sqlite:///typo.db")
    assert_one_line_error(code, err)
    assert "no database file 'typo.db'" in err
    assert list(tmp_path.iterdir()) == []


async def test_reusing_a_run_id_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """In Python: a RunExists (a UsageError) raised by plan_and_run itself, not by the
    store from deep inside the run, and before the goal goes to the model."""
    import traceback

    from planrun._facade import aplan_and_run
    from planrun.core import RunExists

    async def noop(payload: object, ctx: object) -> dict[str, bool]:
        return {"ok": True}

    registry = Registry()
    registry.register("noop", noop)
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    plan = {"goal": "g", "tasks": [{"kind": "noop", "payload": {}, "depends_on": []}]}
    assert (await aplan_and_run(plan, registry, store=store, run_id="r1")).ok
    with pytest.raises(RunExists) as info:  # a goal: no model is asked (none is configured)
        await aplan_and_run("a goal", registry, store=store, run_id="r1",
                            model=_unreachable_model())
    assert isinstance(info.value, UsageError) and info.value.run_id == "r1"
    assert str(info.value) == (f"run 'r1' already exists in {store}; choose another run id, "
                               "or resume it")
    frames = [f.filename for f in traceback.extract_tb(info.value.__traceback__)]
    assert not any("/stores/" in f or "/runtime/" in f for f in frames), frames


def _unreachable_model() -> object:
    from planrun import Model

    return Model("gpt-4o-mini", api_key="sk-test", base_url="http://127.0.0.1:9/v1")


def test_run_id_names_the_run_and_a_second_run_of_it_is_one_line(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(RELEASE_PLAN))
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    argv = ["run", str(plan), "--app", "planrun.examples.release:app", "--db", db,
            "--run-id", "release-1", "--quiet", "--replay", str(REPO / "fixtures" / "release.json")]
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    code, out, _ = run_cli(capsys, "runs", "--db", db, "--json")
    assert [r["id"] for r in json.loads(out)] == ["release-1"]
    code, out, err = run_cli(capsys, *argv)
    assert (code, out) == (2, "")
    assert err == (f"planrun: error: run 'release-1' already exists in {db}; choose another "
                   "run id, or resume it\n")
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 2 and json.loads(out)["error"].startswith("run 'release-1' already exists")
    for bad in ("", "has space", "-dash-first", "x" * 101):
        code, _, err = run_cli(capsys, "run", str(plan), "--app", RELEASE_APP, f"--run-id={bad}")
        assert code == 2 and err.count("\n") == 1 and "--run-id" in err, (bad, err)


# -------------------------------------------------------------------------- scenario files


@pytest.mark.parametrize(
    ("scenario", "needle"),
    [
        ({"tasks": [{"kind": "x", "estimate": "abc"}]}, "'estimate' must be a finite number"),
        ({"tasks": [{"kind": "x", "estimate": -3}]}, "'estimate' must be a finite number"),
        ({"tasks": [{"kind": "x"}], "workers": [{"name": "a", "capacity": "two"}]},
         "'capacity' must be an integer"),
        ({"tasks": [{"kind": "x", "depends_on": ["ghost"]}]}, "depends on 'ghost'"),
        ({"tasks": [{"kind": "x", "depends_on": [7]}]}, "depends on 7"),
        ({"tasks": [{"kind": "x"}], "options": {"speed": 2}}, "unknown option(s) ['speed']"),
        ({"tasks": [{"kind": "x"}], "options": {"max_attempts": "3"}}, "'max_attempts'"),
        ({"tasks": [{"kind": "x"}], "strategy": "fastest"}, "'strategy' must be one of"),
    ],
)
def test_bad_scenario_fields_are_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, scenario: dict[str, object],
    needle: str,
) -> None:
    scenario.setdefault("workers", [{"name": "a", "kinds": ["x"]}])
    path = tmp_path / "s.json"
    path.write_text(json.dumps(scenario))
    code, _, err = run_cli(capsys, "simulate", "--scenario", str(path))
    assert_one_line_error(code, err)
    assert needle in err


# ------------------------------------------------------------------------- non-UTF-8 files


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--scenario", "{path}"],
        ["fixtures", "show", "{path}"],
        ["fixtures", "check", "{path}"],
        ["run", "plan.json", "--app", RELEASE_APP, "--replay", "{path}"],
        ["run", "{path}", "--app", RELEASE_APP],
        ["validate", "{path}", "--kinds", "a"],
    ],
)
def test_a_file_that_is_not_utf8_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plan.json").write_text(json.dumps(RELEASE_PLAN))
    path = tmp_path / "latin1.json"
    path.write_bytes(NOT_UTF8)
    code, _, err = run_cli(capsys, *[a.replace("{path}", str(path)) for a in argv])
    assert_one_line_error(code, err)


# --------------------------------------------------------------------------------- --app


def write_module(folder: Path, name: str, source: str) -> None:
    (folder / f"{name}.py").write_text(source)


@pytest.mark.parametrize(
    ("source", "ref", "needle"),
    [
        ("def broken(:\n", "m_syntax:app", "syntax error in"),
        ("raise RuntimeError('no config')\n", "m_raises:app", "raised RuntimeError: no config"),
        ("x = 1\n", "m_attr:nosuch", "has no attribute 'nosuch'"),
        ("def make(n):\n    return n\n", "m_args:make", "needs arguments"),
        ("def make():\n    raise ValueError('bad')\n", "m_call:make", "raised ValueError: bad"),
        ("app = 3\n", "m_type:app", "is a int, not a planrun App"),
    ],
)
def test_app_errors_say_what_is_wrong(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    source: str, ref: str, needle: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    write_module(tmp_path, ref.split(":")[0], source)
    (tmp_path / "plan.json").write_text(json.dumps(RELEASE_PLAN))
    code, _, err = run_cli(capsys, "run", "plan.json", "--app", ref)
    assert_one_line_error(code, err)
    assert needle in err


def test_a_callable_needing_arguments_from_the_stdlib() -> None:
    with pytest.raises(UsageError, match="json:dumps needs arguments"):
        load_app("json:dumps")


def test_a_missing_attribute_lists_the_apps_the_module_has() -> None:
    with pytest.raises(UsageError, match="has no attribute 'nosuch'; it has app"):
        load_app("planrun.examples.release:nosuch")


def test_a_factory_returning_a_tuple_works() -> None:
    assert isinstance(load_app("planrun.examples.tickets:make_app"), App)


def test_the_current_directory_is_importable_for_app(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    write_module(tmp_path, "myapp_cwd", (
        "from planrun import Registry\n"
        "async def noop(payload, ctx):\n    return {'ok': True}\n"
        "app = Registry()\napp.register('noop', noop)\n"
    ))
    plan = {"goal": "g", "tasks": [{"kind": "noop", "payload": {}, "depends_on": []}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    code, out, err = run_cli(capsys, "run", "plan.json", "--app", "myapp_cwd:app", "--json",
                             "--quiet")
    assert code == 0, err
    assert json.loads(out)["counts"]["completed"] == 1


# ------------------------------------------------------------------- python -m entry points


def test_python_m_planrun_works() -> None:
    done = subprocess.run([sys.executable, "-m", "planrun", "--version"], capture_output=True,
                          text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0 and done.stdout.startswith("planrun ")


def test_python_m_brief_without_a_key_is_one_line() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    done = subprocess.run([sys.executable, "-m", "planrun.examples.brief"], capture_output=True,
                          text=True, timeout=60, env=env, cwd=REPO)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert done.stderr.startswith("brief: error: OPENAI_API_KEY is not set")
    assert "Traceback" not in done.stderr


# ---------------------------------------------------------------------------- cassettes


def test_a_miss_at_the_cli_shows_its_diff_and_a_command_that_works_here(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no tools/ here, as with an installed wheel
    plan = json.loads(json.dumps(RELEASE_PLAN))
    plan["tasks"][0]["payload"]["database"] = "ledger"
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    cassette = REPO / "fixtures" / "release.json"
    argv = ["run", "plan.json", "--app", RELEASE_APP, "--replay", str(cassette), "--quiet"]
    code, _, err = run_cli(capsys, *argv)
    assert code != 0
    if "no recording" not in err:  # the payload reached no request: nothing to show
        pytest.fail(f"expected a FixtureMiss, got: {err}")
    assert "closest recording" in err and "request:" in err  # the diff, not its first line
    assert "python tools/make_fixtures.py" not in err
    assert f"--record {cassette}" in err


def test_fixtures_check_on_a_cassette_the_user_recorded(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recorded by planrun run: re-run as its command says, and fresh. Recorded by a test:
    not re-run here (replaying it is its check)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plan.json").write_text(json.dumps(RELEASE_PLAN))
    data = json.loads((REPO / "fixtures" / "release.json").read_text())
    data["about"].pop("scenario", None)
    data["about"]["command"] = f"planrun run plan.json --app {RELEASE_APP} --record mine.json"
    (tmp_path / "mine.json").write_text(json.dumps(data))
    code, out, err = run_cli(capsys, "fixtures", "check", "mine.json")
    assert (code, out, err) == (0, "fresh: 1 cassette\n", "")
    data["about"]["command"] = "pytest tests/test_release.py --planrun-record"
    (tmp_path / "theirs.json").write_text(json.dumps(data))
    code, out, err = run_cli(capsys, "fixtures", "check", "theirs.json")
    assert code == 0 and "not re-run (made by pytest tests/test_release.py" in out
    data["about"]["command"] = "planrun run plan.json --app no_such_app:app --record x.json"
    (tmp_path / "lost.json").write_text(json.dumps(data))
    code, out, err = run_cli(capsys, "fixtures", "check", "lost.json")
    assert code == 2 and err.count("\n") == 1 and "no_such_app" in err


def test_fixtures_check_outside_the_repository_finds_the_shipped_cassettes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from planrun.cli._fixtures import _cassette_files

    monkeypatch.chdir(tmp_path)
    names = {p.name for p in _cassette_files([])}
    assert {"brief.json", "release.json", "tickets.json"} <= names


# --------------------------------------------------------------- generated files and flags

_VALID = json.dumps(RELEASE_PLAN)
_bad_files = st.one_of(
    st.binary(max_size=200),
    st.integers(min_value=1, max_value=len(_VALID) - 1).map(lambda n: _VALID[:n].encode()),
    st.sampled_from([
        NOT_UTF8,
        b"\xff\xfe\x00{",
        b"[" * 3_000,
        b'{"goal": "g", "tasks": [{"kind": "migrate_db", "payload": {"x": NaN}}]}',
        b'{"goal": "g", "tasks": [{"kind": "migrate_db", "payload": "\\ud800"}]}',
        b'[{"kind": "migrate_db", "payload": {}, "depends_on": [' + b"9" * 5_000 + b"]}]",
        NESTED_PLAN_IN_BROKEN_DOC.encode(),
    ]),
)
_file_verbs = st.sampled_from([
    ["validate", "{f}", "--kinds", "migrate_db,deploy_app"],
    ["run", "{f}", "--app", RELEASE_APP, "--db", "{db}"],
    ["simulate", "--scenario", "{f}"],
    ["fixtures", "show", "{f}"],
    ["fixtures", "check", "{f}"],
    ["run", "plan.json", "--app", RELEASE_APP, "--db", "{db}", "--replay", "{f}"],
])
_BAD_SECONDS = ["-1", "0", "nan", "inf", "-inf", "abc", "1e309", "", "1e9"]
_BAD_COUNTS = ["-1", "0", "1.5", "abc", "", "99999999999", "nan"]
_bad_flags = st.one_of(
    st.tuples(st.sampled_from([["worker", "--db", "{db}", "--app", RELEASE_APP, "--lease"],
                               ["worker", "--db", "{db}", "--app", RELEASE_APP, "--idle-exit"],
                               ["worker", "--db", "{db}", "--app", RELEASE_APP, "--timeout"],
                               ["run", "plan.json", "--app", RELEASE_APP, "--db", "{db}",
                                "--workers", "external", "--stale-after"],
                               ["status", "r1", "--db", "{db}", "--watch", "--interval"]]),
              st.sampled_from(_BAD_SECONDS)),
    st.tuples(st.sampled_from([["worker", "--db", "{db}", "--app", RELEASE_APP,
                                "--concurrency"],
                               ["validate", "plan.json", "--kinds", "a", "--max-tasks"],
                               ["run", "plan.json", "--app", RELEASE_APP, "--budget-tokens"],
                               ["simulate", "--durations", "1", "--workers"]]),
              st.sampled_from(_BAD_COUNTS)),
    st.tuples(st.just(["simulate", "--durations"]),
              st.sampled_from(["inf,1", "nan,1", "-1,2", "a,b", ",", "1e400"])),
)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=_bad_files, verb=_file_verbs)
def test_generated_bad_files_are_one_line_exit_2_and_write_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path_factory: pytest.TempPathFactory,
    content: bytes, verb: list[str],
) -> None:
    folder = tmp_path_factory.mktemp("bad")
    (folder / "plan.json").write_text(_VALID)
    bad = folder / "bad.json"
    bad.write_bytes(content)
    db = folder / "runs.db"
    argv = [a.replace("{f}", str(bad)).replace("{db}", f"sqlite:///{db}") for a in verb]
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        code = main(argv)
    finally:
        os.chdir(cwd)
    out, err = capsys.readouterr()
    assert code == 2, (argv, out, err)
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert not db.exists()


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flag=_bad_flags)
def test_generated_bad_flags_are_one_line_exit_2_and_write_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path_factory: pytest.TempPathFactory,
    flag: tuple[list[str], str],
) -> None:
    folder = tmp_path_factory.mktemp("flags")
    (folder / "plan.json").write_text(_VALID)
    db = folder / "runs.db"
    words, value = flag
    argv = [a.replace("{db}", f"sqlite:///{db}") for a in words] + [value]
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        code = main(argv)
    finally:
        os.chdir(cwd)
    out, err = capsys.readouterr()
    assert code == 2, (argv, out, err)
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert not db.exists()


# ------------------------------------------------------------------ --json: errors are JSON


def _verbs_with_json() -> list[str]:
    import argparse

    from planrun.cli._main import _build_parser

    found: list[str] = []

    def walk(parser: argparse.ArgumentParser, name: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for verb, sub in action.choices.items():
                    walk(sub, f"{name} {verb}".strip())
            elif "--json" in action.option_strings:
                found.append(name)

    walk(_build_parser(), "")
    return found


MISSING_DB = "sqlite:///no-such-runs.db"
JSON_ERRORS: dict[str, list[str]] = {
    # verb -> arguments failing inside the verb (after argparse accepted them)
    "validate": ["validate", "no-such-plan.json", "--kinds", "a"],
    "simulate": ["simulate", "--scenario", "no-such-scenario.json"],
    "compare": ["compare", "--rules", "no_such_rule"],
    "plan": ["plan", "a goal", "--app", "no.such.module:app"],
    "estimate": ["estimate", "no-such-plan.json", "--app", "no.such.module:app"],
    "run": ["run", "a goal", "--app", "no.such.module:app"],
    "resume": ["resume", "r1", "--db", MISSING_DB],
    "runs": ["runs", "--db", MISSING_DB],
    "status": ["status", "r1", "--db", MISSING_DB],
    "approve": ["approve", "r1", "t1", "--db", MISSING_DB],
    "reject": ["reject", "r1", "t1", "--db", MISSING_DB, "--reason", "no"],
    "eval": ["eval", "no-such-goals.jsonl", "--prompts", "default"],
}


def test_every_verb_with_json_has_its_error_case_here() -> None:
    assert sorted(_verbs_with_json()) == sorted(JSON_ERRORS)


def _json_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, object]:
    code, out, err = run_cli(capsys, *argv)
    assert code == 2, (code, out, err)
    assert err == "" and out.count("\n") == 1, (out, err)
    data = json.loads(out)
    assert set(data) == {"error", "problems"} and isinstance(data["problems"], list)
    assert isinstance(data["error"], str) and data["error"] and "\n" not in data["error"]
    return dict(data)


@pytest.mark.parametrize("verb", sorted(JSON_ERRORS))
def test_with_json_an_error_in_the_verb_is_json(
        verb: str, capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    data = _json_error(capsys, [*JSON_ERRORS[verb], "--json"])
    assert data["problems"] == []
    # Without --json the same error is the usual line on stderr.
    code, out, err = run_cli(capsys, *JSON_ERRORS[verb])
    assert code == 2 and out == "" and err.startswith("planrun: error: ")
    assert err.strip() == f"planrun: error: {data['error']}"


@pytest.mark.parametrize("verb", sorted(JSON_ERRORS))
def test_with_json_a_flag_argparse_refuses_is_json(
        verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    data = _json_error(capsys, [*JSON_ERRORS[verb], "--json", "--no-such-flag"])
    assert "unrecognized arguments: --no-such-flag" in str(data["error"])
    assert data["problems"] == []


def test_with_json_an_invalid_plan_lists_its_problems(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"goal": "g", "tasks": [
        {"kind": "no_such_kind", "payload": {}, "depends_on": [3]}]}))
    data = _json_error(capsys, ["run", str(plan), "--app", RELEASE_APP, "--json"])
    problems = data["problems"]
    assert isinstance(problems, list)
    assert {p["code"] for p in problems} == {"unknown_kind", "unknown_dependency"}
    assert all(set(p) == {"code", "task", "message"} for p in problems)
    assert str(data["error"]).startswith("invalid plan, 2 problems")
