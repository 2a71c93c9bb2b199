"""A run's deadline from the command line, in real time, and in the simulation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from planrun.dev.sim import Scenario, simulate

APP = '''
import time
from planrun import App, Registry
from planrun.core import KindSpec

def nap(payload, ctx):
    time.sleep(float(payload["s"]))
    return "woke"

app = App(Registry([KindSpec("nap", handler=nap)]))
'''


def test_run_deadline_cancels_what_has_not_started(tmp_path: Path) -> None:
    (tmp_path / "napapp.py").write_text(APP, encoding="utf-8")
    plan = {"goal": "naps in a row", "tasks": [
        {"kind": "nap", "payload": {"s": 0.4}, "depends_on": [i - 1] if i else []}
        for i in range(8)]}
    (tmp_path / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "planrun", "run", "plan.json", "--app", "napapp:app",
         "--deadline", "1", "--json", "--db", f"sqlite:///{tmp_path / 'runs.db'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr  # not every task completed
    report = json.loads(done.stdout)
    assert report["deadline_reached"] is True
    tasks = {t["id"]: t for t in report["tasks"]}
    assert tasks["t0"]["status"] == "completed"
    cancelled = [t for t in tasks.values() if t["status"] == "cancelled"]
    assert cancelled and all(t["cause"] == "deadline" for t in cancelled)
    assert tasks["t7"]["status"] == "cancelled"
    assert report["duration_s"] < 5.0


def test_the_simulation_says_whether_a_plan_fits_its_window() -> None:
    scenario = Scenario.from_durations([10, 2, 2, 10, 2, 2, 10, 2, 2], 3)
    fits = simulate(scenario, "balanced", deadline_s=15)
    assert fits.fits is True and fits.makespan == 14
    tight = simulate(scenario, "round_robin", deadline_s=15)
    assert tight.fits is False and tight.run.deadline_reached
    cancelled = [t for t in tight.run.tasks.values() if t.status.value == "cancelled"]
    assert [t.cause for t in cancelled] == ["deadline"]
    assert simulate(scenario, "balanced").fits is None
