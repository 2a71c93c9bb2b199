"""What a user meets first at the command line: a mistyped plan path, why a run failed,
output that fits the terminal, and the settings people look for."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import friction_app
import pytest

from planrun import App, Registry, TransientError, UsageError
from planrun.cli import main
from planrun.cli._main import looks_like_a_file
from planrun.core import KindSpec, WorkerSpec
from planrun.model import Model

HERE = Path(__file__).parent
APP = "friction_app:app"


@pytest.fixture(autouse=True)
def _importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


def plan(tmp_path: Path, *sources: str) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"goal": "fetch them", "tasks": [
        {"kind": "fetch", "payload": {"source": s}, "depends_on": [i - 1] if i else []}
        for i, s in enumerate(sources)]}))
    return path


def cli(*argv: str, columns: int = 80, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "COLUMNS"))}
    environ.update(PYTHONPATH=str(HERE), COLUMNS=str(columns), **env)
    return subprocess.run([sys.executable, "-m", "planrun.cli", *argv], capture_output=True,
                          text=True, timeout=120, env=environ, check=False)


# ---- a mistyped plan path ----------------------------------------------------------------


@pytest.mark.parametrize("text", ["plan_ok.jsn", "plans/next", "plan.json", "../p", "C:\\p"])
def test_a_missing_file_name_is_an_error_naming_it_not_a_goal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    text: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    code = main(["run", text, "--app", APP])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"no such plan file: {text}" in err and "--goal" in err
    assert "OPENAI_API_KEY" not in err  # it never got as far as a model


@pytest.mark.parametrize("text", ["write a brief on Node.js", "deploy", "ship v1.2 today.",
                                  "compare a/b testing tools"])
def test_prose_is_still_a_goal(text: str) -> None:
    assert not looks_like_a_file(text)


def test_an_existing_file_is_read_whatever_its_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "plan.jsn"
    path.write_text(plan(tmp_path, "a").read_text())
    assert main(["run", str(path), "--app", APP, "--quiet"]) == 0, capsys.readouterr().err


# ---- why did it fail ----------------------------------------------------------------------


def test_status_lists_what_did_not_complete_and_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    assert main(["run", str(plan(tmp_path, "broken", "b", "c")), "--app", APP, "--db", db,
                 "--quiet", "--json"]) == 1
    ran = json.loads(capsys.readouterr().out)
    assert ran["ok"] is False
    assert main(["status", ran["run_id"], "--db", db]) == 0
    shown = capsys.readouterr().out
    assert "did not complete:" in shown
    assert "t0 (fetch) dead, 1 attempt: PermanentError: source 'broken' does not exist" in shown
    assert "second line" not in shown  # the text view shows the error's first line
    assert "t1 (fetch) cancelled, cause t0, 0 attempts" in shown
    assert "spent:" not in shown  # no model was called and there is no budget
    assert main(["status", ran["run_id"], "--db", db, "--json"]) == 0
    rows = {r["task"]: r for r in json.loads(capsys.readouterr().out)["not_completed"]}
    assert set(rows) == {"t0", "t1", "t2"}
    assert rows["t0"]["error"].endswith("(the second line says which sources do)")
    assert (rows["t2"]["status"], rows["t2"]["cause"]) == ("cancelled", "t0")


def test_the_report_says_ok_leaves_out_usage_without_a_model_and_words_the_audit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["run", str(plan(tmp_path, "a")), "--app", APP, "--quiet", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    assert main(["run", str(plan(tmp_path, "broken", "b")), "--app", APP, "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "usage:" not in out
    assert "audit: no task completed twice or before its dependencies; 2 did not complete " \
        "(t0 dead; t1 cancelled)" in " ".join(out.split())
    assert "missing" not in out and "{" not in out


# ---- output that fits ---------------------------------------------------------------------


@pytest.mark.parametrize("columns", [80, 60])
def test_the_report_wraps_to_the_width_and_cuts_nothing(tmp_path: Path, columns: int) -> None:
    done = cli("run", str(plan(tmp_path, "broken")), "--app", APP, "--quiet", columns=columns)
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines and max(len(line) for line in lines) <= columns
    # The note column, cell by cell down the table, read back without the wrapping.
    notes = [line.split("│")[-2] for line in lines if line.count("│") >= 8]
    shown = "".join("".join(notes).split())
    error = "PermanentError: source 'broken' does not exist (the second line says which " \
        "sources do)"
    assert "".join(error.split()) in shown, done.stdout


# ---- settings people look for --------------------------------------------------------------


def test_concurrency_at_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         ) -> None:
    many = tmp_path / "many.json"
    many.write_text(json.dumps({"goal": "g", "tasks": [
        {"kind": "fetch", "payload": {"source": str(i)}, "depends_on": []} for i in range(12)]}))
    friction_app.running["most"] = 0
    assert main(["run", str(many), "--app", APP, "--quiet", "--concurrency", "3"]) == 0
    assert friction_app.running["most"] == 3
    code = main(["run", str(many), "--app", "planrun.examples.tickets:app", "--quiet",
                 "--concurrency", "3"])
    err = capsys.readouterr().err
    assert code == 2 and "declares its own" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(("options", "names"), [
    ({"concurrency": -1}, "App.concurrency"),
    ({"concurrency": True}, "App.concurrency"),
    ({"effects": {"nope": print}}, "App.effects names kind(s) ['nope']"),
    ({"effects": {"k": "send"}}, "App.effects['k'] must be a function"),
    ({"approvals": {"k": "later"}}, "an approval is 'start', 'effect'"),
    ({"workers": ["w1"]}, "App.workers must be a list of planrun.core.WorkerSpec"),
])
def test_an_app_refuses_bad_settings_when_built(options: dict[str, object], names: str) -> None:
    with pytest.raises(UsageError, match=re.escape(names)):
        App(Registry([KindSpec("k")]), **options)  # type: ignore[arg-type]
    App(Registry([KindSpec("k")]), workers=[WorkerSpec("w", None, 2)], concurrency=1)


def test_the_model_timeout_comes_from_the_environment_or_the_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PLANRUN_TIMEOUT", "240")
    assert Model(api_key="sk-test").timeout == 240.0
    assert Model(api_key="sk-test", timeout=5).timeout == 5
    monkeypatch.setenv("PLANRUN_TIMEOUT", "soon")
    with pytest.raises(UsageError, match="PLANRUN_TIMEOUT must be a positive number"):
        Model(api_key="sk-test")
    monkeypatch.delenv("PLANRUN_TIMEOUT")
    assert Model(api_key="sk-test").timeout == 60.0


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A loopback server that accepts connections and never answers."""
    sock = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    sock.close()


def test_a_timeout_says_how_to_raise_it(silent_server: str) -> None:
    import asyncio

    model = Model(api_key="sk-test", base_url=silent_server, timeout=0.3, retry=1)
    with pytest.raises(TransientError) as caught:
        asyncio.run(model.complete("hi"))
    text = str(caught.value)
    assert "timed out after 0.3 s" in text
    assert all(way in text for way in ("--timeout", "PLANRUN_TIMEOUT", "Model(timeout="))


def test_a_database_that_does_not_answer_is_one_line_and_nothing_else(tmp_path: Path) -> None:
    done = cli("run", str(plan(tmp_path, "a")), "--app", APP,
               "--db", "postgresql://nobody@127.0.0.1:1/nothing")
    assert done.returncode == 2
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "cannot connect" in done.stderr
