"""The facade's keywords are typed: a misspelt one is a type error and, at run time, a
TypeError naming the function the user called, not the Supervisor underneath."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from mypy import api as mypy_api

from planrun import Registry, TaskContext, aplan_and_run, aresume_run, plan_and_run, resume_run

PLAN = [{"kind": "one", "payload": {}, "depends_on": []}]


def _registry() -> Registry:
    registry = Registry()

    @registry.kind("one")
    def one(payload: dict[str, object], ctx: TaskContext) -> int:
        return 1

    return registry


def test_a_misspelt_keyword_names_the_function_called_and_the_right_spelling(
        tmp_path: Path) -> None:
    registry = _registry()
    with pytest.raises(TypeError, match=r"^plan_and_run\(\) got an unexpected keyword "
                       r"argument 'stratgy'; did you mean 'strategy'\?$"):
        plan_and_run(PLAN, registry, stratgy="balanced")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"^aplan_and_run\(\) .* 'max_atempts'; did you mean "
                       r"'max_attempts'"):
        asyncio.run(aplan_and_run(PLAN, registry, max_atempts=2))  # type: ignore[call-arg]
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    with pytest.raises(TypeError, match=r"^resume_run\(\) .* 'on_ded'"):
        resume_run("r", registry, db, on_ded="abort_run")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"^aresume_run\(\) .* 'deadline'; did you mean "
                       r"'deadline_s'"):
        asyncio.run(aresume_run("r", registry, db, deadline=5))  # type: ignore[call-arg]
    assert not (tmp_path / "runs.db").exists()  # refused before anything was opened
    # The right spellings go through to the Supervisor.
    report = plan_and_run(PLAN, registry, max_attempts=2, on_dead="abort_run", deadline_s=60)
    assert report.ok


def test_the_type_checker_catches_a_misspelt_keyword(tmp_path: Path) -> None:
    source = tmp_path / "user_code.py"
    source.write_text(
        "from planrun import Registry, plan_and_run\n"
        "plan_and_run([], Registry(), stratgy='balanced')\n"
        "plan_and_run([], Registry(), strategy='balanced', max_attempts=2)\n")
    out, _, status = mypy_api.run([str(source), "--no-incremental", "--follow-imports=silent",
                                   "--ignore-missing-imports"])
    assert status == 1
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert len(errors) == 1 and ":2:" in errors[0] and "stratgy" in errors[0]
