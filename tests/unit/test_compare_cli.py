"""``planrun compare`` from the command line: the article's table, its rules and failure cases."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from planrun.cli import main

ARTICLE_TABLE = [
    "system             order violations duplicates  missing",
    "peer (naive)                      1          1  ['migrate_db']",
    "peer (protocol)                   0          0  []",
    "supervisor                        0          0  []",
]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def compare_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code, out, err = run_cli(capsys, "compare", *argv, "--json")
    assert code == 0 and err == ""
    data: dict[str, Any] = json.loads(out)
    return data


def by_system(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["system"]: row for row in data["rows"]}


def test_without_options_the_table_and_json_are_the_articles(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run_cli(capsys, "compare")
    assert code == 0 and out.splitlines() == ARTICLE_TABLE
    data = compare_json(capsys)
    assert set(data) == {"rows"}
    assert all(set(row) == {"system", "order_violations", "duplicates", "missing"}
               for row in data["rows"])


def test_one_agent_without_check_deps_from_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "compare", "--agent-rules", "deploy-2=claims,retry")
    lines = out.splitlines()
    assert code == 0
    assert lines[0] == "peer rules: check_deps,claims,retry for the others; deploy-2 claims,retry"
    assert lines[3] == "peer (naive)                      1          1  ['migrate_db']"
    assert lines[4] == "peer (mixed)                      1          0  []"
    assert lines[5] == "supervisor                        0          0  []"
    data = compare_json(capsys, "--agent-rules", "deploy-2=claims,retry")
    assert data["settings"] == {
        "rules": {"deploy-1": ["check_deps", "claims", "retry"],
                  "deploy-2": ["claims", "retry"],
                  "qa-1": ["check_deps", "claims", "retry"],
                  "db-1": ["check_deps", "claims", "retry"]},
        "db_failures": 1, "deploy1_failures": 0, "max_retries": 2,
    }
    assert by_system(data)["peer (mixed)"]["order_violations"] == 1


def test_rules_for_all_then_one_agent(capsys: pytest.CaptureFixture[str]) -> None:
    data = compare_json(capsys, "--rules", "check_deps,retry")
    assert by_system(data)["peer (check_deps,retry)"]["duplicates"] == 1
    data = compare_json(capsys, "--rules", "none", "--agent-rules", "db-1=retry")
    rules = data["settings"]["rules"]
    assert rules["db-1"] == ["retry"] and rules["qa-1"] == []
    assert by_system(data)["peer (mixed)"]["missing"] == []  # db-1 retried the migration
    data = compare_json(capsys, "--agent-rules", "db-1=check_deps,claims")
    assert "migrate_db" in by_system(data)["peer (mixed)"]["missing"]


def test_failover_case_matches_the_article(capsys: pytest.CaptureFixture[str]) -> None:
    # deploy-1 fails the deploy once: the supervisor gives the retry to deploy-2
    data = compare_json(capsys, "--db-failures", "0", "--deploy1-failures", "1", "--ledger")
    supervisor = by_system(data)["supervisor"]
    assert "fail:deploy_app:deploy-1" in supervisor["ledger"]
    assert "run:deploy_app:deploy-2" in supervisor["ledger"]
    assert (supervisor["order_violations"], supervisor["duplicates"],
            supervisor["missing"]) == (0, 0, [])
    assert data["settings"]["deploy1_failures"] == 1 and data["settings"]["db_failures"] == 0
    code, out, _ = run_cli(capsys, "compare", "--db-failures", "0", "--deploy1-failures", "1",
                           "--ledger")
    assert code == 0
    assert ("supervisor: run:migrate_db:db-1 fail:deploy_app:deploy-1 "
            "run:deploy_app:deploy-2 run:smoke_test:qa-1") in out.splitlines()


def test_retries_exhausted_case_matches_the_article(capsys: pytest.CaptureFixture[str]) -> None:
    # the migration fails more often than the retries allow: nothing depending on it runs
    data = compare_json(capsys, "--db-failures", "5", "--max-retries", "2", "--ledger")
    supervisor = by_system(data)["supervisor"]
    ledger = supervisor["ledger"]
    assert ledger.count("fail:migrate_db:db-1") == 3
    assert "abort:migrate_db" in ledger
    assert not [line for line in ledger if line.startswith("run:")]
    assert supervisor["order_violations"] == 0 and supervisor["duplicates"] == 0
    assert supervisor["missing"] == ["deploy_app", "smoke_test", "migrate_db"]
    # the peers with the protocol obey the same retry budget
    assert by_system(data)["peer (protocol)"]["ledger"].count("fail:migrate_db:db-1") == 3


def test_sweep_json(capsys: pytest.CaptureFixture[str]) -> None:
    data = compare_json(capsys, "--sweep")
    assert data["settings"] == {"db_failures": 1, "deploy1_failures": 0, "max_retries": 2}
    combos = {c["name"]: c for c in data["combinations"]}
    assert len(combos) == 20
    clean = {"order_violations": 0, "duplicates": 0, "missing": []}
    assert all(c["supervisor"] == clean for c in combos.values())
    assert combos["all: check_deps,claims,retry"]["peer"] == clean
    assert combos["all: none"]["peer"] == {"order_violations": 1, "duplicates": 1,
                                           "missing": ["migrate_db"]}
    assert combos["qa-1 without check_deps"]["without"] == {"agent": "qa-1",
                                                            "rule": "check_deps"}
    assert combos["qa-1 without check_deps"]["rules"]["qa-1"] == ["claims", "retry"]
    assert combos["qa-1 without check_deps"]["peer"]["order_violations"] == 1
    assert combos["deploy-2 without claims"]["peer"]["duplicates"] == 1
    assert "migrate_db" in combos["db-1 without retry"]["peer"]["missing"]


def test_sweep_text_has_a_line_per_combination(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "compare", "--sweep")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 3 + 20
    assert lines[0].startswith("failures: db-1 fails migrate_db 1 time,")
    rows = {line.split("  ")[0].strip(): line for line in lines[3:]}
    for line in rows.values():
        assert line.endswith("|     0    0  -")  # the supervisor
    assert rows["all: none"].split()[2:5] == ["1", "1", "migrate_db"]
    assert rows["deploy-1 without check_deps"].split()[3:6] == ["1", "0", "-"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rules", "check_deps,lock"], "unknown rule 'lock'"),
        (["--agent-rules", "deploy-3=claims"], "unknown agent 'deploy-3'"),
        (["--agent-rules", "deploy-2"], "expected AGENT=RULES"),
        (["--agent-rules", "deploy-2="], "expected AGENT=RULES"),
        (["--agent-rules", "qa-1=retry", "--agent-rules", "qa-1=claims"], "given twice"),
        (["--db-failures", "-1"], "--db-failures: must be between 0 and 1000"),
        (["--deploy1-failures", "1.5"], "--deploy1-failures: expected an integer"),
        (["--max-retries", "-2"], "--max-retries: must be between 0 and 1000"),
        (["--max-retries", "100000"], "--max-retries: must be between 0 and 1000"),
        (["--sweep", "--rules", "claims"], "--sweep runs every set of rules"),
        (["--sweep", "--json", "--agent-rules", "db-1=retry"], "--sweep runs every set"),
    ],
)
def test_bad_options_are_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run_cli(capsys, "compare", *argv)
    assert code == 2
    if "--json" in argv:  # the error is JSON on stdout
        assert err == "" and message in json.loads(out)["error"]
        return
    assert out == ""
    assert len(err.splitlines()) == 1
    assert err.startswith("planrun: error: ") and message in err


def test_a_bad_option_in_a_real_process() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "planrun.cli", "compare", "--agent-rules", "deploy-9=retry"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "planrun: error: unknown agent 'deploy-9' (agents: deploy-1, deploy-2, qa-1, db-1)"
    ]


ARTICLES = Path(__file__).resolve().parents[2] / "docs" / "guides" / "articles.md"


def docs_runs(verb: str) -> list[tuple[list[str], str]]:
    """Each ``$ planrun VERB ...`` in the articles guide's code blocks, with the output shown."""
    readme = ARTICLES.read_text(encoding="utf-8")
    runs: list[tuple[list[str], list[str]]] = []
    fenced = False
    current: list[str] | None = None
    for line in readme.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            current = None
        elif fenced and line.startswith("$ "):
            current = [] if line.startswith(f"$ planrun {verb}") else None
            if current is not None:
                runs.append((shlex.split(line)[3:], current))
        elif fenced and current is not None:
            current.append(line)
    return [(argv, "\n".join(lines).rstrip("\n") + "\n") for argv, lines in runs]


def test_the_docs_show_the_real_output(capsys: pytest.CaptureFixture[str]) -> None:
    runs = docs_runs("compare")
    assert [argv for argv, _ in runs][:2] == [[], ["--agent-rules", "deploy-2=claims,retry"]]
    assert ["--sweep"] in [argv for argv, _ in runs]
    for argv, expected in runs:
        code, out, _ = run_cli(capsys, "compare", *argv)
        assert code == 0 and out == expected, argv


def test_the_docs_show_the_real_simulate_output(capsys: pytest.CaptureFixture[str]) -> None:
    runs = docs_runs("simulate")
    assert len(runs) == 2
    for argv, expected in runs:
        code, out, _ = run_cli(capsys, "simulate", *argv)
        assert code == 0 and out == expected, argv
