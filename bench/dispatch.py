"""Per-task cost of in-process dispatch against plain asyncio, and a DAG's makespan.

    python bench/dispatch.py --quick      # every workload once, sizes 1k / 10k / 100k
    python bench/dispatch.py              # the same, best of three rounds
    python bench/dispatch.py --otel       # also with OpenTelemetry spans and metrics on

Workloads, all with ``C = 32`` concurrent slots and interleaved in one run with their
baseline (plain ``asyncio.gather`` over the same no-op coroutine under a semaphore of the
same size, measured just before):

* ``Supervisor`` direct on no-op tasks (flat, and chained: every 10th task depends on the
  one before it, so readiness tracking is exercised); wall time per task, its ratio to the
  baseline, and ``D``, the supervisor's CPU per task: the run's process CPU time minus the
  baseline's (what the no-op handlers and the event loop cost anyway), over the tasks;
* ``plan_and_run`` on a ready plan of no-op tasks (validation, the run, the report);
* the same ``plan_and_run`` with a SQLite store (every transition written), against the
  in-memory run of the same size;
* memory: peak RSS of a fresh process running the flat ``Supervisor`` workload, less the
  RSS it had before the tasks were built, per task;
* a DAG of 20 layers x 100 tasks of 10 ms (``asyncio.sleep``), each task depending on 1-3
  tasks of the layer before (a fixed pseudo-random draw). Its lower bound is the larger of
  the critical path (20 x 10 ms) and the total work over ``C``. Against it: ``Supervisor``
  (``balanced``: longest critical path first), plain asyncio (each task awaits its
  dependencies' futures, then the semaphore) and a greedy critical-path list schedule
  computed offline (what a scheduler with no overhead would reach).

The figures that matter are the ratios, each against a baseline of the same run, and how
the per-task cost moves with size: a flat cost means dispatch does not scan the task set.
The last table prints each ratio next to its target.

``--otel`` adds a column: the same flat run observed by :class:`planrun.tracing.RunTracer`
(one span per attempt, the task and worker metrics) with the OpenTelemetry SDK configured,
spans going through a ``SimpleSpanProcessor`` to an exporter that drops them. Its ratio is
against the untraced run of the same size.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import heapq
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from typing import Any

from planrun import tracing
from planrun.registry import KindSpec, Registry, TaskContext, WorkerSpec
from planrun.supervisor import Supervisor
from planrun.task import Task

CONCURRENCY = 32
LAYERS, WIDTH, TASK_S = 20, 100, 0.010

Timed = tuple[float, float]
"""(wall seconds, process CPU seconds)."""


async def noop(payload: Any, ctx: TaskContext) -> None:
    return None


async def sleeper(payload: Any, ctx: TaskContext) -> None:
    await asyncio.sleep(TASK_S)


def timed(fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> Timed:
    gc.collect()
    cpu, wall = time.process_time(), time.perf_counter()
    asyncio.run(fn(*args))
    return time.perf_counter() - wall, time.process_time() - cpu


def best(fn: Callable[..., Coroutine[Any, Any, Any]], rounds: int, *args: Any) -> Timed:
    runs = [timed(fn, *args) for _ in range(rounds)]
    return min(r[0] for r in runs), min(r[1] for r in runs)


# ---- no-op workloads ---------------------------------------------------------------------


async def baseline(n: int) -> None:
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one(i: int) -> None:
        async with sem:
            await noop({}, None)  # type: ignore[arg-type]

    await asyncio.gather(*(one(i) for i in range(n)))


def noop_tasks(n: int, chained: bool) -> list[Task]:
    # Chained: every 10th task depends on the one before it (readiness tracking exercised).
    return [Task(id=f"t{i}", kind="noop", depends_on=(f"t{i - 1}",) if chained and i % 10 else ())
            for i in range(n)]


async def supervised(n: int, chained: bool, traced: bool = False) -> None:
    registry = Registry([KindSpec("noop", handler=noop)])
    observer = tracing.RunTracer(f"bench-{n}") if traced else None
    sup = Supervisor(registry, [WorkerSpec("w", None, CONCURRENCY)], strategy="least_loaded",
                     on_event=observer.on_event if observer else None)
    sup.add_tasks(noop_tasks(n, chained))
    if observer is not None:
        observer.start()
        result = await observer.run(sup.arun())
        observer.finish("finished")
    else:
        result = await sup.arun()
    assert result.ok, result.counts
    repr(result)


def noop_plan(n: int) -> list[dict[str, Any]]:
    return [{"kind": "noop", "payload": {}, "depends_on": []} for _ in range(n)]


async def planned(n: int, store: str | None = None) -> None:
    from planrun.runner import App, aplan_and_run

    app = App(Registry([KindSpec("noop", handler=noop)]), concurrency=CONCURRENCY)
    report = await aplan_and_run(noop_plan(n), app, store=store, strategy="least_loaded")
    assert report.ok, report.counts
    repr(report.result)


async def planned_sqlite(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        await planned(n, f"sqlite:///{os.path.join(tmp, 'bench.db')}")


def memory_per_task(n: int) -> float:
    """Bytes of peak RSS per task of a flat Supervisor run, in a fresh process."""
    out = subprocess.run([sys.executable, __file__, "--memory-child", str(n)], check=True,
                         capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def _memory_child(n: int) -> None:
    import resource

    def rss() -> int:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    gc.collect()
    before = rss()
    asyncio.run(supervised(n, False))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print((peak - before) / n)


# ---- the DAG -----------------------------------------------------------------------------


def dag() -> dict[str, tuple[str, ...]]:
    """Task id -> the ids it depends on: 20 layers x 100, 1-3 parents from the layer above."""
    rng = random.Random(20)
    graph: dict[str, tuple[str, ...]] = {}
    for layer in range(LAYERS):
        for i in range(WIDTH):
            parents: tuple[str, ...] = ()
            if layer:
                picks = rng.sample(range(WIDTH), rng.randint(1, 3))
                parents = tuple(f"L{layer - 1}.{p}" for p in sorted(picks))
            graph[f"L{layer}.{i}"] = parents
    return graph


def dag_bound(graph: dict[str, tuple[str, ...]]) -> float:
    depth: dict[str, int] = {}
    for tid, deps in graph.items():  # layer order: parents first
        depth[tid] = 1 + max((depth[d] for d in deps), default=0)
    return max(max(depth.values()) * TASK_S, len(graph) * TASK_S / CONCURRENCY)


def dag_greedy(graph: dict[str, tuple[str, ...]]) -> float:
    """Makespan of a greedy list schedule, longest path to the end first, zero overhead."""
    children: dict[str, list[str]] = {t: [] for t in graph}
    for tid, deps in graph.items():
        for d in deps:
            children[d].append(tid)
    below: dict[str, float] = {}
    for tid in reversed(list(graph)):
        below[tid] = TASK_S + max((below[c] for c in children[tid]), default=0.0)
    waiting = {t: len(d) for t, d in graph.items()}
    order = {t: i for i, t in enumerate(graph)}
    ready = [(-below[t], order[t], t) for t, w in waiting.items() if not w]
    heapq.heapify(ready)
    running: list[tuple[float, str]] = []
    now = 0.0
    while ready or running:
        while ready and len(running) < CONCURRENCY:
            _, _, tid = heapq.heappop(ready)
            heapq.heappush(running, (now + TASK_S, tid))
        now, tid = heapq.heappop(running)
        for c in children[tid]:
            waiting[c] -= 1
            if not waiting[c]:
                heapq.heappush(ready, (-below[c], order[c], c))
    return now


async def dag_asyncio(graph: dict[str, tuple[str, ...]]) -> None:
    sem = asyncio.Semaphore(CONCURRENCY)
    loop = asyncio.get_running_loop()
    done = {t: loop.create_future() for t in graph}

    async def one(tid: str) -> None:
        for d in graph[tid]:
            await done[d]
        async with sem:
            await sleeper({}, None)  # type: ignore[arg-type]
        done[tid].set_result(None)

    await asyncio.gather(*(one(t) for t in graph))


async def dag_planrun(graph: dict[str, tuple[str, ...]]) -> None:
    registry = Registry([KindSpec("sleep", handler=sleeper)])
    sup = Supervisor(registry, [WorkerSpec("w", None, CONCURRENCY)], strategy="balanced")
    sup.add_tasks(Task(id=t, kind="sleep", depends_on=d, estimate_s=TASK_S)
                  for t, d in graph.items())
    result = await sup.arun()
    assert result.ok, result.counts


# ---- the report --------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one round per workload")
    parser.add_argument("--sizes", default="1000,10000,100000",
                        help="task counts of the no-op Supervisor workloads")
    parser.add_argument("--plan-sizes", default="1000,10000",
                        help="task counts of the plan_and_run workloads")
    parser.add_argument("--sqlite-size", type=int, default=2000,
                        help="task count of the SQLite-durable run")
    parser.add_argument("--otel", action="store_true",
                        help="also run with OpenTelemetry tracing and metrics configured")
    parser.add_argument("--memory-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    if args.memory_child:
        _memory_child(args.memory_child)
        return
    rounds = 1 if args.quick else 3
    sizes = [int(s) for s in args.sizes.split(",") if s]
    plan_sizes = [int(s) for s in args.plan_sizes.split(",") if s]
    if args.otel:
        _configure_otel()
    figures: dict[str, Any] = {"concurrency": CONCURRENCY, "rounds": rounds}

    print(f"no-op tasks, C = {CONCURRENCY}, best of {rounds}; us per task "
          "(D: supervisor CPU per task, the run's CPU less the baseline's)")
    header = (f"{'tasks':>8} {'asyncio':>8} {'Supervisor':>11} {'ratio':>6} {'D':>6}"
              f" {'chained':>8} {'ratio':>6} {'D':>6}")
    print(header + (f" {'traced':>8} {'vs flat':>8}" if args.otel else ""))
    rows = figures["supervisor"] = []
    for n in sizes:
        base = best(baseline, rounds, n)
        flat = best(supervised, rounds, n, False)
        chain = best(supervised, rounds, n, True)
        row = {"tasks": n, "asyncio_us": base[0] / n * 1e6, "flat_us": flat[0] / n * 1e6,
               "asyncio_cpu_us": base[1] / n * 1e6, "flat_cpu_us": flat[1] / n * 1e6,
               "flat_d_us": (flat[1] - base[1]) / n * 1e6, "chained_us": chain[0] / n * 1e6,
               "chained_d_us": (chain[1] - base[1]) / n * 1e6}
        line = (f"{n:>8} {row['asyncio_us']:>8.1f} {row['flat_us']:>11.1f}"
                f" {row['flat_us'] / row['asyncio_us']:>6.2f} {row['flat_d_us']:>6.1f}"
                f" {row['chained_us']:>8.1f} {row['chained_us'] / row['asyncio_us']:>6.2f}"
                f" {row['chained_d_us']:>6.1f}")
        if args.otel:
            traced = best(supervised, rounds, n, False, True)
            row["traced_us"] = traced[0] / n * 1e6
            line += f" {row['traced_us']:>8.1f} {row['traced_us'] / row['flat_us']:>8.2f}"
        rows.append(row)
        print(line)

    print(f"\nplan_and_run on a ready plan of no-op tasks, C = {CONCURRENCY}; us per task")
    print(f"{'tasks':>8} {'asyncio':>8} {'plan_and_run':>13} {'ratio':>6}")
    prow = figures["plan_and_run"] = []
    for n in plan_sizes:
        base = best(baseline, rounds, n)
        plan = best(planned, rounds, n)
        prow.append({"tasks": n, "asyncio_us": base[0] / n * 1e6, "plan_us": plan[0] / n * 1e6})
        print(f"{n:>8} {base[0] / n * 1e6:>8.1f} {plan[0] / n * 1e6:>13.1f}"
              f" {plan[0] / base[0]:>6.2f}")

    n = args.sqlite_size
    print(f"\nplan_and_run with a SQLite store, {n} tasks; us per task")
    mem_run = best(planned, rounds, n)
    sql_run = best(planned_sqlite, rounds, n)
    figures["sqlite"] = {"tasks": n, "memory_us": mem_run[0] / n * 1e6,
                         "sqlite_us": sql_run[0] / n * 1e6}
    print(f"{'in-memory':>10} {mem_run[0] / n * 1e6:>8.1f} {'SQLite':>8}"
          f" {sql_run[0] / n * 1e6:>8.1f} {'ratio':>6} {sql_run[0] / mem_run[0]:>6.2f}")

    mem_n = max(sizes)
    per_task = memory_per_task(mem_n)
    figures["memory"] = {"tasks": mem_n, "bytes_per_task": per_task}
    print(f"\nmemory: {per_task / 1024:.2f} KiB peak RSS per task at {mem_n} tasks"
          f" ({per_task * mem_n / 1e6:.0f} MB)")

    graph = dag()
    bound = dag_bound(graph)
    greedy = dag_greedy(graph)
    dag_async, dag_async_cpu = best(dag_asyncio, rounds, graph)
    dag_run, dag_run_cpu = best(dag_planrun, rounds, graph)
    figures["dag"] = {"bound_s": bound, "greedy_s": greedy, "asyncio_s": dag_async,
                      "planrun_s": dag_run, "asyncio_cpu_s": dag_async_cpu,
                      "planrun_cpu_s": dag_run_cpu}
    print(f"\nDAG {LAYERS} x {WIDTH} tasks of {TASK_S * 1e3:.0f} ms, C = {CONCURRENCY}:"
          f" lower bound {bound:.3f} s")
    for name, took in (("greedy critical path (offline)", greedy),
                       ("plain asyncio", dag_async), ("Supervisor (balanced)", dag_run)):
        print(f"  {name:<32} {took:>7.3f} s {took / bound:>6.2f}x bound")
    # The loop waits ~10 ms a wave whatever runs in it; what a run adds to the bound is
    # the CPU its loop spends, so this is the figure the makespan follows.
    print(f"  CPU of the loop: plain asyncio {dag_async_cpu * 1e3:.0f} ms, Supervisor"
          f" {dag_run_cpu * 1e3:.0f} ms ({dag_run_cpu / dag_async_cpu:.2f}x)")

    first = rows[0]
    flat_costs = [r["flat_us"] for r in rows]
    targets = [
        ("Supervisor / asyncio (no-op)", max(r["flat_us"] / r["asyncio_us"] for r in rows),
         "<= 2.5"),
        ("the same in CPU time (less load-bound)",
         max(r["flat_cpu_us"] / r["asyncio_cpu_us"] for r in rows), "(reference)"),
        ("D, us per task (flat, worst size)", max(r["flat_d_us"] for r in rows), "<= 20"),
        ("plan_and_run / asyncio", max(p["plan_us"] / p["asyncio_us"] for p in prow)
         if prow else float("nan"), "<= 3.5"),
        ("SQLite-durable / in-memory", sql_run[0] / mem_run[0], "<= 2"),
        ("DAG Supervisor / bound", dag_run / bound, "<= 1.10"),
        ("DAG plain asyncio / bound", dag_async / bound, "(reference)"),
        (f"cost per task {sizes[-1]} / {sizes[0]} tasks", flat_costs[-1] / first["flat_us"],
         "flat (~1)"),
        ("  the same for asyncio (the machine's own)", rows[-1]["asyncio_us"]
         / first["asyncio_us"], "(reference)"),
        (f"  D {sizes[-1]} / {sizes[0]} tasks (supervisor CPU)",
         rows[-1]["flat_d_us"] / first["flat_d_us"], "flat (~1)"),
        ("memory, MB per 100k tasks", per_task * 1e5 / 1e6, "<= 285"),
    ]
    print("\nratios (worst size where there are several) and their targets")
    for name, value, target in targets:
        print(f"  {name:<38} {value:>8.2f}   target {target}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(figures, fh, indent=1)


def _configure_otel() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Drop(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Drop()))
    tracing.instrument(tracer_provider=provider, meter_provider=MeterProvider())


if __name__ == "__main__":
    main()
