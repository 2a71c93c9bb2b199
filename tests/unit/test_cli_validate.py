"""``planrun validate`` and the command line's error handling."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from planrun.cli import _main as cli
from planrun.cli import main
from planrun.core import repair_plan
from planrun.core._plan import validate_plan

GOOD = {
    "goal": "ship",
    "tasks": [
        {"kind": "migrate_db", "payload": {}, "depends_on": []},
        {"kind": "deploy_app", "payload": {}, "depends_on": [0]},
        {"kind": "smoke_test", "payload": {}, "depends_on": [1]},
    ],
}
KINDS = "migrate_db,deploy_app,smoke_test"
BAD = {
    "goal": "ship",
    "tasks": [
        {"kind": "migrate_db", "payload": {}, "depends_on": [1]},
        {"kind": "deploy_ap", "payload": {}, "depends_on": [0]},
        {"kind": "smoke_test", "payload": [], "depends_on": [2]},
    ],
}


def write(tmp_path: Path, data: Any, name: str = "plan.json") -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return str(path)


def test_valid_plan_exits_0_with_count_and_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", write(tmp_path, GOOD), "--kinds", KINDS]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == ["valid: 3 tasks", "order: 0 -> 1 -> 2"]
    assert err == ""


def test_order_follows_id_dependencies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = [
        {"id": "deploy", "kind": "deploy_app", "depends_on": ["migrate"]},
        {"id": "migrate", "kind": "migrate_db"},
    ]
    assert main(["validate", write(tmp_path, plan), "--kinds", KINDS]) == 0
    assert capsys.readouterr().out.splitlines() == ["valid: 2 tasks", "order: 1 -> 0"]


def test_invalid_plan_exits_2_with_one_line_per_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", write(tmp_path, BAD), "--kinds", KINDS]) == 2
    out, err = capsys.readouterr()
    expected = validate_plan(BAD, KINDS.split(","))
    assert [(p.code, p.task) for p in expected] == [
        ("forward_dependency", 0),
        ("unknown_kind", 1),
        ("schema", 2),
        ("self_dependency", 2),
    ]
    assert out.splitlines() == [str(p) for p in expected]
    assert "did you mean 'deploy_app'?" in out
    assert err.strip() == "invalid: 4 problems"


def test_json_output_is_exactly_the_contract(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", write(tmp_path, BAD), "--kinds", KINDS, "--json"]) == 2
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"valid", "problems"}
    assert report["valid"] is False
    assert len(report["problems"]) == 4
    assert all(set(p) == {"code", "task", "message"} for p in report["problems"])
    assert report["problems"][0] == {
        "code": "forward_dependency",
        "task": 0,
        "message": "task 0 depends on task 1, which comes later; "
        "the first task can depend on no task; reorder the tasks",
    }
    assert main(["validate", write(tmp_path, GOOD), "--kinds", KINDS, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"valid": True, "problems": []}


def test_stdin_with_raw_model_text(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = "Sure! Here is the plan:\n```json\n" + json.dumps(GOOD, indent=2) + "\n```\nCheers."
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    assert main(["validate", "-", "--kinds", KINDS]) == 0
    assert capsys.readouterr().out.startswith("valid: 3 tasks")


def test_stdin_without_a_byte_buffer(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("no plan here"))
    assert main(["validate", "-", "--kinds", KINDS, "--json"]) == 2
    report = json.loads(capsys.readouterr().out)
    assert [p["code"] for p in report["problems"]] == ["not_json"]


def test_prose_file_and_empty_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prose = "I think we should do: " + json.dumps(GOOD["tasks"]) + " and then stop."
    assert main(["validate", write(tmp_path, prose, "p.txt"), "--kinds", KINDS]) == 0
    capsys.readouterr()
    assert main(["validate", write(tmp_path, "", "empty.json"), "--kinds", KINDS]) == 2
    assert capsys.readouterr().out.startswith("not_json: ")


def test_bounds_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, GOOD)
    assert main(["validate", path, "--kinds", KINDS, "--max-tasks", "2"]) == 2
    assert capsys.readouterr().out.startswith("too_many_tasks: the plan has 3 tasks")
    assert main(["validate", path, "--kinds", KINDS, "--min-tasks", "4", "--max-tasks", "9"]) == 2
    assert capsys.readouterr().out.startswith("too_few_tasks: ")
    empty = write(tmp_path, {"goal": "", "tasks": []}, "empty.json")
    assert main(["validate", empty, "--kinds", KINDS, "--min-tasks", "0"]) == 0
    assert capsys.readouterr().out.splitlines() == ["valid: 0 tasks", "order: (no tasks)"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["validate", "{path}/missing.json", "--kinds", "a"], "cannot read"),
        (["validate", "{path}", "--kinds", "a"], "cannot read"),
        (
            [
                "validate",
                "{path}/plan.json",
                "--kinds",
                "a",
                "--min-tasks",
                "3",
                "--max-tasks",
                "2",
            ],
            "greater than --max-tasks",
        ),
    ],
)
def test_file_and_bound_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    write(tmp_path, GOOD)
    assert main([a.replace("{path}", str(tmp_path)) for a in argv]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("planrun: error: ") and needle in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["validate"],
        ["validate", "plan.json"],
        ["validate", "plan.json", "--kinds", ","],
        ["validate", "plan.json", "--kinds", "a", "--max-tasks", "x"],
        ["validate", "plan.json", "--kinds", "a", "--max-tasks", "0"],
        ["validate", "plan.json", "--kinds", "a", "--min-tasks", "-1"],
        ["validate", "plan.json", "--kinds", "a", "--bogus"],
    ],
)
def test_bad_arguments_exit_2_without_traceback(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err


def test_version_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"planrun {cli._version()}"
    assert main(["validate", "--help"]) == 0
    assert "--kinds" in capsys.readouterr().out


def test_parser_is_built_from_one_adder_per_verb() -> None:
    parser = cli._build_parser()
    args = parser.parse_args(["validate", "p.json", "--kinds", "a,b,a"])
    assert args.func is cli._cmd_validate
    assert args.kinds == ["a", "b"]
    assert (args.min_tasks, args.max_tasks, args.json) == (1, 50, False)


def _planrun() -> list[str]:
    script = Path(sys.executable).parent / "planrun"
    return [str(script)] if script.exists() else [sys.executable, "-m", "planrun.cli"]


def test_real_process(tmp_path: Path) -> None:
    good = subprocess.run(
        [*_planrun(), "validate", write(tmp_path, GOOD), "--kinds", KINDS],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert good.returncode == 0, good.stderr
    assert good.stdout.splitlines() == ["valid: 3 tasks", "order: 0 -> 1 -> 2"]

    bad = subprocess.run(
        [sys.executable, "-m", "planrun.cli", "validate", "-", "--kinds", KINDS, "--json"],
        input=json.dumps(BAD),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2
    assert json.loads(bad.stdout)["valid"] is False

    missing = subprocess.run(
        [*_planrun(), "validate", str(tmp_path / "nope.json"), "--kinds", KINDS],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 2
    assert missing.stderr.startswith("planrun: error: cannot read")
    assert "Traceback" not in missing.stderr


def test_validate_with_an_app_checks_its_contracts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    from planrun.examples.answers import BRIEF_PLAN, PIX_FIRST_PLAN

    bad, good = tmp_path / "bad.json", tmp_path / "good.json"
    bad.write_text(json.dumps({"goal": "g", **PIX_FIRST_PLAN}))
    good.write_text(json.dumps({"goal": "g", **BRIEF_PLAN}))
    app = "planrun.examples.brief:app"
    assert main(["validate", str(bad), "--app", app, "--json"]) == 2
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] is False
    assert {p["code"] for p in report["problems"]} == {"duplicate_task", "no_deliverable"}
    assert main(["validate", str(good), "--app", app]) == 0
    assert capsys.readouterr().out.startswith("valid: 6 tasks")
    # --kinds checks the kinds alone: the same plan is well formed.
    assert main(["validate", str(bad), "--kinds", "research,analyse,write_brief"]) == 0
    capsys.readouterr()
    assert main(["validate", str(good), "--app", "no_such_module:app"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_validate_stays_strict_where_the_decomposer_would_repair_by_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = {"goal": "g", "tasks": [
        {"kind": "deploy_app", "payload": {}, "depends_on": [1]},
        {"kind": "migrate_db", "payload": {}, "depends_on": []},
    ]}
    assert repair_plan(plan, KINDS.split(",")).plan is not None  # code could order it
    assert main(["validate", write(tmp_path, plan), "--kinds", KINDS]) == 2
    assert capsys.readouterr().out.startswith("task 0: forward_dependency")
