"""The run viewer (``planrun ui``) in a real browser, over real runs in SQLite and PostgreSQL.

Debian's Chromium is driven by Playwright (``executable_path``: Playwright's own browser
download is not used). Without Chromium the browser tests skip, except under
``PLANRUN_REQUIRE_CHROMIUM=1`` (CI), where a missing browser fails them. The runs are real:
a supervised run waiting for approval in another process (``ui_job.py``), and a run whose
attempts ``planrun worker`` processes do through DBOS queues.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.cookiejar
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from pgtest import fresh_schema
from ui_job import LEAKED

from planrun.cli.ui import UIServer
from planrun.core import FINAL, Status
from planrun.stores import RunState, open_store

HERE = Path(__file__).resolve().parent
SRC = str(HERE.parents[1] / "src")
JOB = HERE / "ui_job.py"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), SRC])}
T = TypeVar("T")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if CHROMIUM is None:
        if os.environ.get("PLANRUN_REQUIRE_CHROMIUM"):
            pytest.fail("PLANRUN_REQUIRE_CHROMIUM is set and no chromium is installed")
        pytest.skip("no chromium on this machine (Debian: apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    opened = context.new_page()
    opened.set_default_timeout(30_000)
    try:
        yield opened
    finally:
        context.close()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'runs.db'}"
        return
    yield from fresh_schema("planrun_ui")


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


def _sync(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` on a loop of its own, on another thread (Playwright's synchronous API
    runs a loop on this one)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, work).result()


def _load(url: str, run_id: str) -> RunState:
    async def go() -> RunState:
        store = open_store(url)
        await store.open()
        try:
            return await store.load(run_id)
        finally:
            await store.close()

    return _sync(go())


_WAITING = {("pay", Status.WAITING), ("after", Status.PENDING)}


def _start_job(url: str, run_id: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(JOB), url, run_id], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _until_waiting(url: str, run_id: str, job: subprocess.Popen[str]) -> RunState:
    """The job's run once its task ``pay`` waits for approval and every task that does not
    wait for ``pay`` has ended (8 tasks: two were spawned)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert job.poll() is None, job.communicate()[1][-2000:]
        try:
            state = _load(url, run_id)
        except Exception:  # the run or the file is not there yet
            state = None
        if state is not None and len(state.tasks) == 8 and all(
                t.status in FINAL or (t.id, t.status) in _WAITING for t in state.tasks):
            return state
        time.sleep(0.1)
    raise TimeoutError("the run never waited for approval")


def _left_waiting(url: str, run_id: str) -> None:
    """A run left waiting for approval of ``pay``: its process killed once it waits (a
    decision then stays written on the row; the run shows as interrupted)."""
    job = _start_job(url, run_id)
    try:
        _until_waiting(url, run_id, job)
    finally:
        job.kill()
        job.communicate()


def _finish(job: subprocess.Popen[str]) -> dict[str, str]:
    out, err = job.communicate(timeout=60)
    assert job.returncode == 0, err[-2000:]
    line = next(line for line in out.splitlines() if line.startswith("done "))
    statuses: dict[str, str] = json.loads(line[5:])
    return statuses


@pytest.fixture
def waiting_run(db_url: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """A run waiting for approval of ``pay``, its process still running."""
    job = _start_job(db_url, "r-wait")
    try:
        _until_waiting(db_url, "r-wait", job)
        yield db_url, job
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()


def _post(url: str, cookie: str | None = None, body: Any = None,
          headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body if body is not None else {}).encode()
    request = urllib.request.Request(url, data=data, method="POST", headers={
        "Content-Type": "application/json", **({"Cookie": cookie} if cookie else {}),
        **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        with exc:  # its socket closed
            return exc.code, json.loads(exc.read() or b"{}")


def _cookie(ui: UIServer) -> str:
    return f"planrun_ui_{ui.port}={ui.token}"


# --------------------------------------------------------------------------- the page


def test_a_click_on_approve_lets_the_waiting_run_finish_without_a_reload(
        waiting_run: tuple[str, subprocess.Popen[str]], page: Any) -> None:
    url, job = waiting_run
    with UIServer(url, port=0) as ui:
        page.goto(ui.url)
        page.click("a[href='/runs/r-wait']")
        page.wait_for_selector("html[data-ready]")
        page.evaluate("window.sameDocument = true")
        approve = page.locator(".waiting-task[data-task='pay'] button.approve").first
        page.fill("#who", "ann")
        page.dispatch_event("#who", "change")
        page.locator(".waiting-task[data-task='pay'] .note").first.fill("paid by card")
        approve.click()
        page.wait_for_selector("#note-bar .ok")
        page.wait_for_function(
            "document.getElementById('run-status').textContent.trim() === 'finished'",
            timeout=60_000)
        assert page.evaluate("window.sameDocument") is True  # no reload happened
        graph_status = page.get_attribute("#graph rect.n[data-i='1']", "class")
        statuses = _finish(job)
    assert statuses["pay"] == "completed" and statuses["after"] == "completed"
    assert graph_status is not None and "completed" in graph_status
    state = _load(url, "r-wait")
    approved = next(e for e in state.events if e.event == "approved" and e.task == "pay")
    note = approved.detail["note"]
    assert note.startswith("by ann at ") and note.endswith(" in planrun ui: paid by card")
    assert approved.at >= state.run.created_at


def test_the_graph_shows_every_task_in_its_status_and_spawned_ones_where_they_joined(
        sqlite_url: str, page: Any) -> None:
    _left_waiting(sqlite_url, "r-graph")
    state = _load(sqlite_url, "r-graph")
    with UIServer(sqlite_url, port=0) as ui:
        page.goto(ui.url)
        page.goto(f"{ui.base}/runs/r-graph")
        page.wait_for_selector("html[data-ready]")
        shown = page.eval_on_selector_all(
            "#graph rect.n", "rs => rs.map(r => [r.querySelector('title').textContent, "
            "r.getAttribute('class')])")
        spawn_edges = page.get_attribute("#graph path.e.spawn", "d")
        run_status = page.text_content("#run-status")
        spawned = next(i for i, t in enumerate(state.tasks) if t.id == "fan/1")
        page.click(f"#graph rect.n[data-i='{spawned}']", force=True)
        page.wait_for_selector("#detail h2 .mono:text-is('fan/1')")
        detail = page.text_content("#detail")
    assert len(shown) == len(state.tasks) == 8
    for task, (title, klass) in zip(state.tasks, shown, strict=True):
        assert title.split()[0] == task.id
        assert task.status.value in klass.split()
    assert spawn_edges is not None and spawn_edges.count("M") == 2  # fan -> fan/0, fan/1
    assert run_status is not None and run_status.strip() == "interrupted"
    assert detail is not None and "spawned byfan" in detail and '"part": 1' in detail


def test_a_task_shows_its_result_and_ledger_events_and_no_secret(
        sqlite_url: str, page: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _left_waiting(sqlite_url, "r-leak")
    own_key = "sk-the-viewers-own-key-000000000000"
    monkeypatch.setenv("OPENAI_API_KEY", own_key)
    _write_result(sqlite_url, "r-leak", "a", {"echo": f"called with {own_key}"})
    with UIServer(sqlite_url, port=0) as ui:
        page.goto(ui.url)
        page.goto(f"{ui.base}/runs/r-leak")
        page.wait_for_selector("html[data-ready]")
        page.fill("#search", "leaky")
        page.click("#list .row[data-i='5']")
        page.wait_for_selector("#detail h2:has-text('leaky')")
        leaky = page.text_content("#detail")
        page.fill("#search", "")
        page.click("#list .row[data-i='0']")
        page.wait_for_selector("#detail h2 .mono:text-is('a')")
        page.click("#detail summary:text('result')")
        task_a = page.text_content("#detail")
        whole = page.content()
        with urllib.request.urlopen(urllib.request.Request(
                f"{ui.base}/api/task?run=r-leak&id=a", headers={"Cookie": _cookie(ui)})) as got:
            api = got.read()
    assert leaky is not None and "sk-[redacted]" in leaky and LEAKED not in leaky
    assert "Ledger events" in leaky and "dead" in leaky
    assert task_a is not None and "[redacted]" in task_a and own_key not in task_a
    assert "completed" in task_a and "started" in task_a  # its ledger events
    for text in (whole, api.decode()):
        assert LEAKED not in text and own_key not in text


def _write_result(url: str, run_id: str, task_id: str, result: Any) -> None:
    """Write a result on a completed task's row, as a driver would have."""
    async def go() -> None:
        store = open_store(url)
        await store.open()
        try:
            state = await store.load_tasks(run_id)
            task = next(t for t in state.tasks if t.id == task_id)
            await store.write_batch(run_id, [task.evolve(result=result)], [])
        finally:
            await store.close()

    _sync(go())


def test_the_runs_list_shows_newest_first_with_status_counts_and_spend(
        sqlite_url: str, page: Any) -> None:
    for run_id in ("r-one", "r-two"):
        _left_waiting(sqlite_url, run_id)
    with UIServer(sqlite_url, port=0) as ui:
        page.goto(ui.url)
        page.wait_for_selector("html[data-ready]")
        rows = page.eval_on_selector_all(
            "#runs tbody tr", "rs => rs.map(r => Array.from(r.cells, c => c.innerText))")
    assert [r[0] for r in rows] == ["r-two", "r-one"]
    assert rows[0][2] == "interrupted"  # killed: no live owner
    assert "completed 5" in rows[0][3] and "waiting 1" in rows[0][3] and "dead 1" in rows[0][3]


# --------------------------------------------------------------------------- the token


def test_a_request_without_the_token_is_refused_and_changes_nothing(
        sqlite_url: str) -> None:
    _left_waiting(sqlite_url, "r-token")
    before = _load(sqlite_url, "r-token")
    with UIServer(sqlite_url, port=0) as ui:
        target, body = f"{ui.base}/api/approve", {"run": "r-token", "task": "pay"}
        refused = [
            _post(target, body=body),                                   # no token at all
            _post(target, cookie=f"planrun_ui_{ui.port}=not-it", body=body),  # a wrong one
            _post(target + "?token=not-it", body=body),
            _post(target, cookie=_cookie(ui), body=body,                # another site's page
                  headers={"Origin": "http://evil.example"}),
        ]
        with pytest.raises(urllib.error.HTTPError) as read:
            urllib.request.urlopen(f"{ui.base}/runs/r-token")
        read.value.close()
    assert [code for code, _ in refused] == [401, 401, 403, 403]
    assert all(body["error"] for _, body in refused)
    assert read.value.code == 401
    after = _load(sqlite_url, "r-token")
    assert after.tasks == before.tasks and len(after.events) == len(before.events)
    assert next(t for t in after.tasks if t.id == "pay").cause == "approval:start"


# --------------------------------------------------------------------------- bad input


def test_a_second_decision_is_refused_in_one_line_and_changes_nothing(
        sqlite_url: str, page: Any) -> None:
    _left_waiting(sqlite_url, "r-twice")
    with UIServer(sqlite_url, port=0) as ui:
        page.goto(ui.url)
        page.goto(f"{ui.base}/runs/r-twice")
        page.wait_for_selector(".waiting-task[data-task='pay']")
        page.click(".waiting-task[data-task='pay'] button.approve")
        page.wait_for_selector("#note-bar .ok")
        decided = _load(sqlite_url, "r-twice")
        page.click(".waiting-task[data-task='pay'] button.reject")
        page.wait_for_selector("#note-bar .error")
        message = page.text_content("#note-bar")
        code, body = _post(f"{ui.base}/api/approve", cookie=_cookie(ui),
                           body={"run": "r-twice", "task": "pay"})
    assert message is not None and message.strip() == "task 'pay' was already approved"
    assert (code, body) == (409, {"error": "task 'pay' was already approved"})
    after = _load(sqlite_url, "r-twice")
    assert after.tasks == decided.tasks and len(after.events) == len(decided.events)
    pay = next(t for t in after.tasks if t.id == "pay")
    assert pay.cause == "approve:start" and "by ui at " in (pay.error or "")


def test_an_unknown_run_in_the_address_is_one_clear_message(sqlite_url: str,
                                                           page: Any) -> None:
    _left_waiting(sqlite_url, "r-known")
    with UIServer(sqlite_url, port=0) as ui:
        page.goto(ui.url)
        answer = page.goto(f"{ui.base}/runs/nope")
        text = page.text_content("main")
        code, body = _post(f"{ui.base}/api/approve", cookie=_cookie(ui),
                           body={"run": "nope", "task": "pay"})
    assert answer is not None and answer.status == 404
    assert text is not None and "holds no run 'nope'" in text
    assert code == 404 and "holds no run 'nope'" in body["error"]


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "planrun.cli", *args], env=env or ENV,
                          capture_output=True, text=True, timeout=60, check=False)


def test_a_database_that_does_not_answer_is_one_line_and_no_address() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    proc = _cli("ui", "--db", f"postgresql://nobody:secret@127.0.0.1:{port}/runs", "--port", "0")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("planrun: error: ") and "cannot" in lines[0]
    assert "secret" not in proc.stderr and proc.stdout == ""


def test_a_port_in_use_is_one_line(sqlite_url: str) -> None:
    _sync(_create(sqlite_url))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = _cli("ui", "--db", sqlite_url, "--port", str(port))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"planrun: error: port {port} on 127.0.0.1 is in use; choose "
                           "another with --port (0: any free port)\n")


async def _create(url: str) -> None:
    store = open_store(url)
    await store.open()
    await store.close()


def test_without_the_extra_planrun_ui_says_what_to_install(sqlite_url: str) -> None:
    _sync(_create(sqlite_url))
    code = ("import sys; sys.modules['starlette'] = None; sys.modules['uvicorn'] = None; "
            "from planrun.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", code, "ui", "--db", sqlite_url], env=ENV,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == ("planrun: error: the run viewer needs the [ui] extra: "
                           "pip install 'planrun[ui]'\n")


def test_planrun_ui_prints_one_address_with_its_token_and_binds_loopback(
        sqlite_url: str) -> None:
    _sync(_create(sqlite_url))
    proc = subprocess.Popen([sys.executable, "-m", "planrun.cli", "ui", "--db", sqlite_url,
                             "--port", "0"], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        address = line.removeprefix("planrun ui: open ")
        assert address.startswith("http://127.0.0.1:") and "/?token=" in address
        opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        with opener.open(address, timeout=30) as answer:  # the cookie, then the redirect
            assert answer.status == 200
            assert b"<title>planrun runs</title>" in answer.read()
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


# --------------------------------------------------------------------------- DBOS


def test_a_run_on_dbos_with_external_workers_shows_like_any_other(
        tmp_path: Path, page: Any) -> None:
    """Four model-backed tasks done by a ``planrun worker`` process against the stand-in:
    the run is listed and drawn as any other, and each task's tokens (priced in the worker
    process, sent back with its outcome) are in the ledger and on the page."""
    from dbos_support import spawn_worker, stop_workers
    from limits_app import plan_document

    from planrun.dev.testing import FakeOpenAI
    from planrun.examples.answers import answers

    sys.path.insert(0, str(HERE.parents[1] / "tools"))
    from standin import StandIn

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(plan_document(4)))
    for url in fresh_schema("planrun_uidbos"):
        with StandIn(FakeOpenAI(answers())) as server:
            env = {**ENV, "OPENAI_BASE_URL": server.base_url,
                   "OPENAI_API_KEY": "sk-standin-ui-00000000000000000000"}
            worker = spawn_worker(url, "w1", app="limits_app:app", env=env)
            try:
                worker.first_line()
                run = _cli("run", str(plan), "--app", "limits_app:app", "--db", url,
                           "--workers", "external", "--json", env=env)
            finally:
                stop_workers([worker])
        assert run.returncode == 0, run.stderr[-2000:]
        run_id = json.loads(run.stdout.strip().splitlines()[-1])["run_id"]
        state = _load(url, run_id)
        spend = _spend(url, run_id)
        with UIServer(url, port=0) as ui:
            page.goto(ui.url)
            page.wait_for_selector("html[data-ready]")
            listed = page.text_content("#runs")
            page.goto(f"{ui.base}/runs/{run_id}")
            page.wait_for_selector("html[data-ready]")
            nodes = page.eval_on_selector_all("#graph rect.n",
                                              "rs => rs.map(r => r.getAttribute('class'))")
            summary = page.text_content("#summary")
            tokens = page.eval_on_selector_all(
                "#list .row", "rs => rs.map(r => r.children[4].textContent.trim())")
        assert listed is not None and run_id in listed and "finished" in listed
        assert len(nodes) == 4 and all("completed" in n for n in nodes)
        assert summary is not None and "workers external" in summary
        used = [e for e in state.events if e.event == "usage"]
        assert sorted(e.task for e in used) == sorted(t.id for t in state.tasks)
        by_task = {e.task: e.detail["prompt_tokens"] + e.detail["completion_tokens"]
                   for e in used}
        assert sum(by_task.values()) == spend  # what the worker process settled in the store
        assert tokens == [str(by_task[t.id]) for t in state.tasks]


def _spend(url: str, run_id: str) -> int:
    async def go() -> int:
        store = open_store(url)
        await store.open()
        try:
            row = await store.spend(run_id)
            assert row is not None
            return row.total_tokens
        finally:
            await store.close()

    return _sync(go())
