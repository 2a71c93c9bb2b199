"""The run viewer's page for a large finished run, in Debian's Chromium (Playwright).

    python bench/ui.py [--quick] [--sizes 2000,10000] [--repeat 3]

Writes a finished run of N tasks to a SQLite file (a layered plan: 8 kinds, each task
depending on one or two of the layer before; every task completed with its ledger events),
serves it with :class:`planrun.cli.ui.UIServer`, and loads its page in the browser: the time to
DOMContentLoaded and to every status shown (the page's ``planrun-ready`` mark: the graph
drawn, by task up to 3,000 tasks and by kind above, and the task list filled), then to a
task's details after a click in the list, and, for a graph collapsed by kind, to every task
drawn after a click on the button that shows them. The first load reads the run from the store
(cold); a finished run is then kept by the viewer, and the median of ``--repeat`` more loads
is the warm figure. The target is every status shown within 1.5 s for 2,000 tasks, printed
as a ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from planrun.cli.ui import UIServer
from planrun.core import Event, Status, Task
from planrun.stores import RunInfo, open_store

TARGET_S = 1.5
KINDS = ("fetch", "parse", "classify", "score", "draft", "review", "reply", "archive")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def plan(n: int, t0: float) -> tuple[list[Task], list[Event]]:
    """A finished run of ``n`` tasks in layers of ``n / 8``, with four events each."""
    width = max(1, n // len(KINDS))
    tasks, events = [], []
    for i in range(n):
        layer = min(i // width, len(KINDS) - 1)
        deps: tuple[str, ...] = ()
        if layer:
            base = (layer - 1) * width
            deps = tuple(sorted({f"t{base + (i * 7) % width}", f"t{base + (i * 13) % width}"}))
        at = t0 + i * 0.001
        tasks.append(Task(id=f"t{i}", kind=KINDS[layer], payload={"n": i}, depends_on=deps,
                          status=Status.COMPLETED, attempts=1, result={"answer": i},
                          created_at=t0, started_at=at, finished_at=at + 0.5,
                          assigned_to="w1"))
        for k, name in enumerate(("created", "assigned", "started", "completed")):
            events.append(Event(4 * i + k, at + k * 0.1, f"t{i}", name,
                                None if k == 0 else "w1", 0 if k < 2 else 1))
    return tasks, events


async def write(url: str, run_id: str, n: int) -> None:
    store = open_store(url)
    await store.open()
    try:
        t0 = time.time() - 3600
        await store.create_run(RunInfo(run_id, t0, status="finished", goal=f"{n} tasks"))
        tasks, events = plan(n, t0)
        await store.add_tasks(run_id, tasks, events)
    finally:
        await store.close()


def measure(page: Any, address: str, n: int) -> dict[str, float]:
    started = time.perf_counter()
    page.goto(address)
    page.wait_for_selector("html[data-ready]")
    wall = time.perf_counter() - started
    timing = page.evaluate("""() => {
        const nav = performance.getEntriesByType('navigation')[0];
        const ready = performance.getEntriesByName('planrun-ready')[0];
        return {dcl: nav.domContentLoadedEventEnd, ready: ready.startTime,
                nodes: document.querySelectorAll('#graph rect.n').length,
                rows: document.querySelectorAll('#list .row').length}; }""")
    clicked = time.perf_counter()
    page.click("#list .row >> nth=3")
    page.wait_for_selector("#detail h2 .mono")
    detail = time.perf_counter() - clicked
    every = float("nan")
    if timing["nodes"] < n:  # collapsed by kind: how long drawing every task takes
        clicked = time.perf_counter()
        page.click("#mode")
        page.wait_for_function(f"document.querySelectorAll('#graph rect.n').length === {n}")
        every = time.perf_counter() - clicked
    return {"dcl_s": timing["dcl"] / 1000, "ready_s": timing["ready"] / 1000, "wall_s": wall,
            "detail_s": detail, "every_s": every, "nodes": timing["nodes"],
            "rows": timing["rows"]}


DAGRE = """(() => {
    const d = JSON.parse(document.getElementById('data').textContent);
    const g = new dagre.graphlib.Graph();
    g.setGraph({rankdir: 'LR'}); g.setDefaultEdgeLabel(() => ({}));
    d.tasks.forEach((t) => g.setNode(t[0], {width: 14, height: 14}));
    d.tasks.forEach((t) => t[4].forEach((p) => g.setEdge(d.tasks[p][0], t[0])));
    const began = performance.now(); dagre.layout(g); return performance.now() - began; })()"""


def compare_layout(page: Any, address: str, dagre: Path) -> None:
    """The viewer's own layout against dagre's on the same graph, in the same page."""
    page.goto(address)
    page.wait_for_selector("html[data-ready]")
    own = page.evaluate("performance.getEntriesByName('planrun-layout')[0].duration")
    page.add_script_tag(path=str(dagre))
    theirs = page.evaluate(DAGRE)
    print(f"layout of the same graph: the viewer's {own:.0f} ms, dagre's {theirs:.0f} ms "
          f"({theirs / max(own, 0.001):.0f}x)")


def _seconds(value: float, width: int) -> str:
    """``value`` in seconds, right-aligned; ``-`` for a figure not measured (NaN)."""
    return f"{value:>{width - 2}.3f} s" if not math.isnan(value) else f"{'-':>{width}}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 tasks, one load")
    parser.add_argument("--sizes", default="2000,10000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dagre", type=Path, metavar="dagre.min.js",
                        help="also time @dagrejs/dagre's layout of the 2,000-task graph "
                        "(npm install @dagrejs/dagre; its dist/dagre.min.js)")
    args = parser.parse_args()
    sizes = [2000] if args.quick else [int(s) for s in args.sizes.split(",")]
    repeat = 1 if args.quick else args.repeat
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("no chromium (Debian: apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    folder = Path(tempfile.mkdtemp(prefix="planrun-bench-ui-"))
    url = f"sqlite:///{folder / 'runs.db'}"
    for n in sizes:
        asyncio.run(write(url, f"run-{n}", n))
    with UIServer(url, port=0) as ui, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(ui.url)
        print(f"{'tasks':>6} {'load':>5} {'graph nodes':>11} {'DOMContentLoaded':>17} "
              f"{'every status':>13} {'vs 1.5 s':>9} {'details':>8} {'every task drawn':>17}")
        for n in sizes:
            runs = [measure(page, f"{ui.base}/runs/run-{n}", n) for _ in range(repeat + 1)]
            warm = {k: statistics.median(r[k] for r in runs[1:]) for k in runs[0]}
            for name, figures in (("cold", runs[0]), ("warm", warm)):
                print(f"{n:>6} {name:>5} {int(figures['nodes']):>11} "
                      f"{figures['dcl_s']:>15.3f} s {figures['ready_s']:>11.3f} s "
                      f"{figures['ready_s'] / TARGET_S:>8.2f}x {figures['detail_s']:>6.3f} s "
                      + _seconds(figures["every_s"], 17))
        if args.dagre is not None and 2000 in sizes:
            compare_layout(page, f"{ui.base}/runs/run-2000", args.dagre)
        browser.close()
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
