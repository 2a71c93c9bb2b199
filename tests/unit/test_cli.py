"""The CLI verbs beyond validate: simulate, compare, plan, run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import FAKE_BASE_URL, FAKE_KEY

from planrun.cli import main
from planrun.dev.testing import FakeOpenAI
from planrun.examples import answers
from planrun.examples.release import RELEASE_PLAN


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_simulate_json_reproduces_the_article(capsys: pytest.CaptureFixture[str]) -> None:
    expected = {"round_robin": 30.0, "least_loaded": 16.0, "balanced": 14.0}
    for strategy, makespan in expected.items():
        code, out, _ = run_cli(capsys, "simulate", "--durations", "10,2,2,10,2,2,10,2,2",
                               "--workers", "3", "--strategy", strategy, "--json")
        data = json.loads(out)
        assert code == 0 and data["makespan"] == makespan and data["strategy"] == strategy
        assert set(data) == {"makespan", "mean_task_s", "strategy", "per_worker"}
        assert set(data["per_worker"]) == {"w1", "w2", "w3"}


def test_simulate_capability_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "simulate", "--scenario", "capability", "--strategy",
                           "all")
    assert code == 0
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert "mean task 10 s" in lines["round_robin"] and "mean task 4 s" in lines["capability"]


def test_simulate_scenario_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"workers": [{"name": "a", "kinds": ["x"]}],
                                "tasks": [{"kind": "x", "estimate": 3},
                                          {"kind": "x", "estimate": 4, "depends_on": [0]}]}))
    code, out, _ = run_cli(capsys, "simulate", "--scenario", str(path), "--json")
    assert code == 0 and json.loads(out)["makespan"] == 7.0


@pytest.mark.parametrize(
    "argv",
    [["simulate"], ["simulate", "--durations", "a,b"], ["simulate", "--scenario", "nope.json"],
     ["simulate", "--durations", "1,2", "--workers", "0"], ["run"], ["compare", "--nope"],
     ["run", "x", "--app", "nomodule"], ["plan", "goal", "--app", "no.such.module:app"]],
)
def test_bad_arguments_are_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert "Traceback" not in err and err.strip()


def test_compare_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "compare", "--json")
    rows = json.loads(out)["rows"]
    assert code == 0
    assert rows[0] == {"system": "peer (naive)", "order_violations": 1, "duplicates": 1,
                       "missing": ["migrate_db"]}
    assert [r["system"] for r in rows] == ["peer (naive)", "peer (protocol)", "supervisor"]


@pytest.fixture
def endpoint(fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> FakeOpenAI:
    monkeypatch.setenv("OPENAI_BASE_URL", FAKE_BASE_URL)
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    fake_openai.answers.update(answers.answers())
    return fake_openai


def test_plan_prints_the_validated_plan(
    capsys: pytest.CaptureFixture[str], endpoint: FakeOpenAI
) -> None:
    code, out, _ = run_cli(capsys, "plan", "a competitive brief", "--app",
                           "planrun.examples.brief:app", "--json")
    assert code == 0
    doc = json.loads(out)
    assert [t["kind"] for t in doc["tasks"]][-1] == "write_brief"
    assert len(endpoint.requests) == 2  # repaired once, by the model: an invented kind
    assert {r["by"] for r in doc["repairs"]} == {"model"}
    assert "unknown_kind" in {r["code"] for r in doc["repairs"]}
    code, out, _ = run_cli(capsys, "plan", "a competitive brief", "--app",
                           "planrun.examples.brief:app")
    assert code == 0 and "write_brief" in out and "research" in out
    assert FAKE_KEY not in out


def plans_a_self_waiting_analysis(endpoint: FakeOpenAI) -> list[int]:
    """The model plans the brief with an analysis that waits for itself, then (asked again)
    the brief as it is; the list returned grows by one per plan request."""
    tasks = json.loads(json.dumps(answers.BRIEF_PLAN["tasks"]))
    tasks[3]["depends_on"] = [0, 1, 3]  # an analysis that waits for itself
    sent: list[int] = []

    def planner(req: object) -> dict[str, object]:
        sent.append(1)
        return {"tasks": tasks} if len(sent) == 1 else answers.BRIEF_PLAN

    endpoint.answers["plan"] = planner
    return sent


def test_plan_json_shows_code_repairs_and_no_code_repair_turns_them_off(
    capsys: pytest.CaptureFixture[str], endpoint: FakeOpenAI
) -> None:
    sent = plans_a_self_waiting_analysis(endpoint)
    argv = ["plan", "a competitive brief", "--app", "planrun.examples.brief:app", "--json"]
    code, out, _ = run_cli(capsys, *argv)
    doc = json.loads(out)
    assert code == 0 and len(sent) == 1
    assert doc["repairs"] == [{"by": "code", "code": "self_dependency",
                               "rule": "drop_self_dependency", "task": 3,
                               "detail": "dropped task 3's dependency on itself",
                               "attempt": 1, "final_task": 3}]
    assert doc["tasks"][3]["depends_on"] == [0, 1]
    sent.clear()
    code, out, _ = run_cli(capsys, *argv, "--no-code-repair")
    doc = json.loads(out)
    assert code == 0 and len(sent) == 2
    assert [(r["by"], r["code"]) for r in doc["repairs"]] == [("model", "self_dependency")]
    code, out, _ = run_cli(capsys, *argv[:-1])  # the text form lists them too
    assert code == 0 and "repaired: " not in out  # the planner answered well this time
    sent.clear()
    code, out, _ = run_cli(capsys, *argv[:-1])
    assert code == 0 and "repaired: self_dependency (task 3) by code" in out


def test_run_a_plan_file(
    capsys: pytest.CaptureFixture[str], endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    path = tmp_path / "release.json"
    path.write_text(json.dumps(RELEASE_PLAN))
    code, out, _ = run_cli(capsys, "run", str(path), "--app", "planrun.examples.release:app",
                           "--json", "--on-dead", "abort_run")
    report = json.loads(out)
    assert code == 0
    assert report["counts"]["completed"] == 3 and report["audit"]["order_violations"] == 0
    assert report["usage"]["requests"] == 3


def test_run_a_goal_with_live_progress(
    capsys: pytest.CaptureFixture[str], endpoint: FakeOpenAI
) -> None:
    code, out, _ = run_cli(capsys, "run", "a competitive brief", "--app",
                           "planrun.examples.brief:app")
    assert code == 0
    assert "completed 6" in out and "audit: clean" in out


def test_run_an_invalid_plan_lists_every_problem(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"tasks": [{"kind": "nope", "payload": {}, "depends_on": [3]}]}))
    code, _, err = run_cli(capsys, "run", str(path), "--app", "planrun.examples.release:app")
    assert code == 2
    assert "unknown_kind" in err and "unknown_dependency" in err


def test_run_without_a_key_names_the_variable(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "run", "a goal", "--app", "planrun.examples.brief:app")
    assert code == 2 and "OPENAI_API_KEY" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv", [["runs"], ["status", "r1"], ["runs", "--json"]],
                         ids=" ".join)
def test_a_reader_that_closed_the_pipe_is_a_quiet_exit(argv: list[str], tmp_path: Path) -> None:
    """``planrun status RUN | head -3``: the reader goes away; planrun says nothing."""
    import os
    import subprocess
    import sys

    from planrun import plan_and_run
    from planrun.core import KindSpec, Registry

    db = f"sqlite:///{tmp_path / 'runs.db'}"
    plan = {"goal": "g", "tasks": [{"kind": "k"} for _ in range(30)]}
    app = Registry([KindSpec("k", handler=lambda payload, ctx: "ok")])
    for n in range(3):
        assert plan_and_run(plan, app, store=db, run_id=f"r{n}").ok
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line is written
    try:
        done = subprocess.run([sys.executable, "-m", "planrun.cli", *argv, "--db", db],
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write)
    assert done.stderr == ""
    assert done.returncode == 141  # as a shell reports a process that SIGPIPE ended


@pytest.mark.parametrize("columns", [80, 50])
def test_piped_run_output_is_never_wider_than_the_terminal_nor_glued(
        columns: int, capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Piped, the progress display's last line ends before the report's title starts."""
    from conftest import REPO

    monkeypatch.setenv("COLUMNS", str(columns))
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(RELEASE_PLAN))
    code, out, _ = run_cli(capsys, "run", str(plan), "--app", "planrun.examples.release:app",
                           "--replay", str(REPO / "fixtures" / "release.json"),
                           "--run-id", "r1")
    assert code == 0
    lines = out.splitlines()
    assert max(map(len, lines)) <= columns, [line for line in lines if len(line) > columns]
    assert "active: -" in [line.strip() for line in lines]
    assert "run r1" in [line.strip() for line in lines]  # the report's title, on its own


def test_run_no_code_repair_asks_the_model_for_every_repair_of_the_goals_plan(
    capsys: pytest.CaptureFixture[str], endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    sent = plans_a_self_waiting_analysis(endpoint)
    argv = ["run", "a competitive brief", "--app", "planrun.examples.brief:app", "--json"]
    code, out, _ = run_cli(capsys, *argv)
    assert code == 0 and len(sent) == 1  # code dropped the edge
    assert [(r["by"], r["code"]) for r in json.loads(out)["plan"]["repairs"]] == [
        ("code", "self_dependency")]
    sent.clear()
    code, out, _ = run_cli(capsys, *argv, "--no-code-repair")
    assert code == 0 and len(sent) == 2  # the model was asked again
    assert [(r["by"], r["code"]) for r in json.loads(out)["plan"]["repairs"]] == [
        ("model", "self_dependency")]
    # a plan file is not decomposed: the flag would be ignored, so it is refused
    path = tmp_path / "release.json"
    path.write_text(json.dumps(RELEASE_PLAN))
    code, _, err = run_cli(capsys, "run", str(path), "--app", "planrun.examples.release:app",
                           "--no-code-repair")
    assert code == 2 and "--no-code-repair" in err and len(err.strip().splitlines()) == 1
