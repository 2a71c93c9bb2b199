"""The run viewer's screenshot for the docs, taken by the tests' browser on a real run.

    python tools/ui_screenshot.py [--out docs/images/ui-run.png]

A supervised run over a SQLite file (a support triage: fetch the tickets, which spawns one
classification each; draft the replies; a reply that needs a person's approval before it
is sent; a ticket whose classification fails for good) runs on a thread of this process
until the reply waits for approval; the viewer serves it and Debian's Chromium (Playwright)
takes the page, with one task's details open. Then the run is approved from the page and
finishes.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from standin import StandIn

from planrun import Approval
from planrun.cli.ui import UIServer
from planrun.core import KindSpec, PermanentError, Registry, Task, TaskContext
from planrun.dev.testing import FakeOpenAI
from planrun.examples.answers import answers
from planrun.examples.ticket_data import generate_tickets
from planrun.examples.tickets import Classification, TicketPayload
from planrun.model import Model, ModelWorker, Usage
from planrun.runtime import Supervisor, hold_run
from planrun.stores import open_store

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


async def fetch(payload: Any, ctx: TaskContext) -> dict[str, int]:
    for ticket in generate_tickets(8):
        ctx.spawn("classify", {"ticket": ticket.model_dump()})
    return {"tickets": 8}


async def lookup(payload: Any, ctx: TaskContext) -> None:
    raise PermanentError("the CRM answered 404: no account for T-105")


async def draft(payload: Any, ctx: TaskContext) -> dict[str, str]:
    await asyncio.sleep(0.05)
    return {"reply": "Thank you for writing; a refund is on its way."}


async def run(url: str, model: Model, waiting: threading.Event) -> None:
    store = open_store(url)
    await store.open()
    registry = Registry([KindSpec("fetch", handler=fetch), KindSpec("draft_reply", handler=draft),
                         KindSpec("send_reply", handler=draft),
                         KindSpec("summarise", handler=draft),
                         KindSpec("lookup_account", handler=lookup)])
    registry.register("classify", ModelWorker("classify_ticket", result=Classification),
                      payload=TicketPayload)
    meter = Usage()
    sup = Supervisor(registry, store=store, run_id="triage-0412", approval_poll=0.1,
                     approvals={"send_reply": Approval("start")},
                     extras={"model": model, "usage": meter},
                     goal="Triage this morning's support tickets and answer the billing ones")
    meter.listen(sup.usage_journal().recorded)  # each request a usage event (as plan_and_run)
    sup.add_tasks([
        Task(id="fetch", kind="fetch"),
        Task(id="draft", kind="draft_reply", depends_on=("fetch",), joins=("fetch",)),
        Task(id="send", kind="send_reply", depends_on=("draft",)),
        Task(id="summary", kind="summarise", depends_on=("fetch",), joins=("fetch",)),
        Task(id="report", kind="summarise", depends_on=("summary", "send")),
        Task(id="crm", kind="lookup_account")])
    watcher = asyncio.ensure_future(_watch(sup, waiting))
    try:
        async with hold_run(store, sup.run_id, new_run=True):  # owned: shown as running
            await sup.arun()
    finally:
        watcher.cancel()
        await store.close()


async def _watch(sup: Supervisor, waiting: threading.Event) -> None:
    while "send" not in sup.waiting:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # its row written (the next batch)
    waiting.set()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "ui-run.png")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("no chromium (Debian: apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    folder = Path(tempfile.mkdtemp(prefix="planrun-shot-"))
    url = f"sqlite:///{folder / 'runs.db'}"
    waiting = threading.Event()
    server = StandIn(FakeOpenAI(answers())).__enter__()
    model = Model("gpt-4o-mini", base_url=server.base_url, api_key="sk-standin-screenshot-000")
    runner = threading.Thread(target=lambda: asyncio.run(run(url, model, waiting)), daemon=True)
    runner.start()
    if not waiting.wait(60):
        raise SystemExit("the run never waited for approval")
    with UIServer(url, port=0) as ui, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=ARGS)
        page = browser.new_page(viewport={"width": 1360, "height": 1040})
        page.goto(ui.url)
        page.goto(f"{ui.base}/runs/triage-0412")
        page.wait_for_selector("html[data-ready]")
        page.click("#graph rect.n[data-i='7']", force=True)
        page.wait_for_selector("#detail h2 .mono")
        page.click("#detail summary:text('result')")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(args.out))
        page.click(".waiting-task[data-task='send'] button.approve")
        page.wait_for_function(
            "document.getElementById('run-status').textContent.trim() === 'finished'",
            timeout=60_000)
        browser.close()
    runner.join(30)
    server.__exit__(None, None, None)
    shutil.rmtree(folder, ignore_errors=True)
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")


if __name__ == "__main__":
    main()
