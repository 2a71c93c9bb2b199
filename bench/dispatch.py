"""Per-task cost of in-process dispatch against plain asyncio, and a DAG's makespan.

    python bench/dispatch.py --quick      # every workload once, sizes 1k / 10k / 100k
    python bench/dispatch.py              # the same, best of three rounds
    python bench/dispatch.py --otel       # also with OpenTelemetry spans and metrics on
    python bench/dispatch.py --first-call # first calls only, each in a fresh process

Workloads, all with ``C = 32`` concurrent slots and interleaved in one run with their
baseline (plain ``asyncio.gather`` over the same no-op coroutine under a semaphore of the
same size, measured just before):

* ``Supervisor`` direct on no-op tasks (flat, and chained: every 10th task depends on the
  one before it, so readiness tracking is exercised); wall time per task, its ratio to the
  baseline, and ``D``, the supervisor's CPU per task: the run's process CPU time minus the
  baseline's (what the no-op handlers and the event loop cost anyway), over the tasks;
* ``plan_and_run`` on a ready plan of no-op tasks (validation, the run, the report);
* the same ``plan_and_run`` with a SQLite store (every transition written), against the
  in-memory run of the same size (the two in turn, best of at least three each, in a
  fresh process);
* memory: peak RSS of a fresh process running the flat ``Supervisor`` workload, less the
  RSS it had before the tasks were built, per task;
* a DAG of 20 layers x 100 tasks of 10 ms (``asyncio.sleep``), each task depending on 1-3
  tasks of the layer before (a fixed pseudo-random draw). Its lower bound is the larger of
  the critical path (20 x 10 ms) and the total work over ``C``. Against it: ``Supervisor``
  (``balanced``: longest critical path first), plain asyncio (each task awaits its
  dependencies' futures, then the semaphore), a dispatcher that keeps nothing (``C``
  coroutines taking the longest-path ready task from a heap: what the event loop itself
  allows), and a greedy critical-path list schedule computed offline (what a scheduler
  with no overhead on a perfect timer would reach). Each runs on the default loop and on a
  loop whose timers are exact to the microsecond (``select()``): on Linux the default loop
  waits in ``epoll_wait``, whose timeout is rounded up to a whole millisecond, so every
  10 ms sleep ends up to 1 ms late whatever schedules it.

The figures that matter are the ratios, each against a baseline of the same run, and how
the per-task cost moves with size: a flat cost means dispatch does not scan the task set.
The last table prints each ratio next to its target.

``--first-call`` measures what a script that runs once sees: in a fresh process with the
project imported (the import is not timed) and nothing run before, the first call of plain
asyncio on ``N`` no-op tasks (the same run's baseline), then the first call of the
``Supervisor`` on them, or of ``plan_and_run`` on a ready plan of them; a new process for
each workload and each of ``--processes`` repetitions, the median of each printed (wall
time, and the median ratio of CPU time, steadier on a shared machine) with the garbage
collector's passes during the call (a full pass walks every object the imports
left, so its cost grows with the extras installed).

``--otel`` adds a column: the same flat run observed by :class:`planrun.obs._tracing.RunTracer`
(one span per attempt, the task and worker metrics) with the OpenTelemetry SDK configured,
spans going through a ``SimpleSpanProcessor`` to an exporter that drops them. Its ratio is
against the untraced run of the same size.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import heapq
import json
import os
import random
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from planrun.core._registry import KindSpec, Registry, TaskContext, WorkerSpec
from planrun.core._task import Task
from planrun.obs import tracing
from planrun.runtime._supervisor import Supervisor

CONCURRENCY = 32
LAYERS, WIDTH, TASK_S = 20, 100, 0.010

Timed = tuple[float, float]
"""(wall seconds, process CPU seconds)."""


async def noop(payload: Any, ctx: TaskContext) -> None:
    return None


async def sleeper(payload: Any, ctx: TaskContext) -> None:
    await asyncio.sleep(TASK_S)


def fine_timer_loop() -> asyncio.AbstractEventLoop:
    """An event loop whose waits for a timer end on time to the microsecond.

    The default loop on Linux waits in ``epoll_wait``, whose timeout is in whole
    milliseconds, rounded up: a task sleeping 10 ms resumes up to 1 ms late, every time.
    ``select()`` takes microseconds; on this loop the DAG's makespan shows what the
    scheduler adds, apart from the timer's granularity."""
    return asyncio.SelectorEventLoop(selectors.SelectSelector())


def timed(fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any,
          loop: Callable[[], asyncio.AbstractEventLoop] | None = None) -> Timed:
    gc.collect()
    cpu, wall = time.process_time(), time.perf_counter()
    if loop is None:
        asyncio.run(fn(*args))
    else:
        running = loop()
        try:
            running.run_until_complete(fn(*args))
        finally:
            running.close()
    return time.perf_counter() - wall, time.process_time() - cpu


def best(fn: Callable[..., Coroutine[Any, Any, Any]], rounds: int, *args: Any) -> Timed:
    runs = [timed(fn, *args) for _ in range(rounds)]
    return min(r[0] for r in runs), min(r[1] for r in runs)


def best_of_each(workloads: Sequence[tuple[Callable[..., Coroutine[Any, Any, Any]],
                                           tuple[Any, ...]]], rounds: int,
                 loop: Callable[[], asyncio.AbstractEventLoop] | None = None) -> list[Timed]:
    """The best wall and CPU time of each workload, the workloads run in turn each round:
    a machine whose speed drifts over a minute then drifts for all of them alike."""
    runs: list[list[Timed]] = [[] for _ in workloads]
    for _ in range(rounds):
        for i, (fn, args) in enumerate(workloads):
            runs[i].append(timed(fn, *args, loop=loop))
    return [(min(r[0] for r in rs), min(r[1] for r in rs)) for rs in runs]


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


async def one_loop(n: int) -> None:
    """The work a ``Supervisor`` run of ``n`` no-op tasks leaves to see, written as one loop
    with no check and no part: each task's record copied at each of its four changes
    (created, assigned, started, completed) with an event logged for each, a ready heap, a
    worker queue, a lease heap, a context per attempt, ``C`` slots each carrying attempts
    one after another, the heap frozen as a run freezes it. Against ``supervised(n,
    False)``: what the scheduler's rules and parts cost on top of the work itself."""
    from planrun.core._registry import TaskContext
    from planrun.core._task import Status
    from planrun.runtime._heap import frozen_heap

    new, put = object.__new__, object.__setattr__

    def changed(task: Task, changes: dict[str, Any]) -> Task:
        state = task.__dict__.copy()
        state.update(changes)
        record = new(Task)
        put(record, "__dict__", state)
        return record

    with frozen_heap():
        book: dict[str, Task] = {}
        log: list[tuple[Any, ...]] = []
        ready: list[tuple[int, str]] = []
        at = time.time()
        for i, task in enumerate(noop_tasks(n, False)):
            book[task.id] = changed(task, {"created_at": at})
            log.append((at, task.id, "created", None, 0, None))
            heapq.heappush(ready, (i, task.id))
        queue: collections.deque[str] = collections.deque()
        while ready:
            tid = heapq.heappop(ready)[1]
            task = book[tid] = changed(book[tid], {"status": Status.ASSIGNED,
                                                   "assigned_to": "w", "token": 1})
            log.append((at, tid, "assigned", "w", 1, None))
            queue.append(tid)
        leases: list[tuple[float, str, int]] = []
        same = {"run_id": "r", "kind": "noop", "worker": "w", "skill": 1.0, "extras": {}}

        async def slot() -> None:
            while queue:
                tid = queue.popleft()
                now = time.time()
                task = book[tid] = changed(book[tid], {"status": Status.RUNNING,
                                                       "started_at": now, "lease": now + 90})
                heapq.heappush(leases, (now + 90, tid, 1))
                log.append((now, tid, "started", "w", 1, None))
                state = {**same, "task_id": tid, "attempt": 1, "payload": task.payload,
                         "estimate_s": task.estimate_s, "inputs": {}, "heartbeat": None,
                         "spawned": [], "tier": None}
                ctx = new(TaskContext)
                put(ctx, "__dict__", state)
                result = await noop(dict(task.payload), ctx)
                now = time.time()
                book[tid] = changed(task, {"status": Status.COMPLETED, "result": result,
                                           "finished_at": now, "attempts": 1, "lease": None})
                log.append((now, tid, "completed", "w", 1, None))

        await asyncio.gather(*(slot() for _ in range(CONCURRENCY)))


def noop_plan(n: int) -> list[dict[str, Any]]:
    return [{"kind": "noop", "payload": {}, "depends_on": []} for _ in range(n)]


async def planned(n: int, store: str | None = None) -> None:
    from planrun._facade import App, aplan_and_run

    app = App(Registry([KindSpec("noop", handler=noop)]), concurrency=CONCURRENCY)
    report = await aplan_and_run(noop_plan(n), app, store=store, strategy="least_loaded")
    assert report.ok, report.counts
    repr(report.result)


async def planned_sqlite(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        await planned(n, f"sqlite:///{os.path.join(tmp, 'bench.db')}")


def durable_pair(n: int, rounds: int) -> tuple[Timed, Timed]:
    """Best (wall, CPU) of ``plan_and_run`` in memory and with a SQLite store, ``n`` tasks,
    the two in turn, in a fresh process: one that ran 100k-task workloads before runs
    the in-memory one up to twice as slowly, which would flatter the ratio."""
    out = subprocess.run([sys.executable, __file__, "--sqlite-child", str(n), str(rounds)],
                         check=True, capture_output=True, text=True).stdout
    memory, sqlite = json.loads(out.strip().splitlines()[-1])
    return tuple(memory), tuple(sqlite)  # type: ignore[return-value]


def _sqlite_child(n: int, rounds: int) -> None:
    asyncio.run(planned_sqlite(10))  # first calls and lazy imports, not timed
    print(json.dumps(best_of_each(((planned, (n,)), (planned_sqlite, (n,))), rounds)))


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


FIRST_CALLS = {"sup": "Supervisor", "plan": "plan_and_run"}
"""The workloads ``--first-call`` times, each the first call of a fresh process."""


def first_calls(n: int, processes: int) -> dict[str, Any]:
    """The median first call of each workload against the same process's first plain
    asyncio call (each workload in its own fresh processes, ``processes`` of them)."""
    out: dict[str, Any] = {"tasks": n, "processes": processes}
    for mode in FIRST_CALLS:
        runs = [json.loads(subprocess.run(
            [sys.executable, __file__, "--first-child", mode, str(n)], check=True,
            capture_output=True, text=True).stdout.strip().splitlines()[-1])
            for _ in range(processes)]
        runs.sort(key=lambda r: r["call_s"] / r["asyncio_s"])
        median = runs[len(runs) // 2]
        cpu = sorted(r["call_cpu_s"] / r["asyncio_cpu_s"] for r in runs)
        out[mode] = {**median, "ratio": median["call_s"] / median["asyncio_s"],
                     "ratios": [r["call_s"] / r["asyncio_s"] for r in runs],
                     "cpu_ratio": cpu[len(cpu) // 2]}
    return out


def _first_child(mode: str, n: int) -> None:
    """In a fresh process: plain asyncio's first call, then ``mode``'s, each timed."""
    def first(work: Coroutine[Any, Any, Any]) -> Timed:
        cpu, wall = time.process_time(), time.perf_counter()  # no gc.collect() first:
        asyncio.run(work)  # what the imports left stays
        return time.perf_counter() - wall, time.process_time() - cpu

    asyncio_s, asyncio_cpu = first(baseline(n))
    before = [g["collections"] for g in gc.get_stats()]
    call_s, call_cpu = first(supervised(n, False) if mode == "sup" else planned(n))
    passes = [g["collections"] - b for g, b in zip(gc.get_stats(), before, strict=True)]
    print(json.dumps({"asyncio_s": asyncio_s, "call_s": call_s, "asyncio_cpu_s": asyncio_cpu,
                      "call_cpu_s": call_cpu, "gc_passes": passes}))


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


ListState = tuple[dict[str, list[str]], dict[str, float], dict[str, int], dict[str, int],
                  list[tuple[float, int, str]]]
"""children, longest path to the end, dependencies left, place, and the ready heap."""


def list_schedule(graph: dict[str, tuple[str, ...]]) -> ListState:
    """What a critical-path list schedule starts from: each task's dependents, its longest
    path to the end, the dependencies it waits for, its place, and the ready heap."""
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
    return children, below, waiting, order, ready


def dag_greedy(graph: dict[str, tuple[str, ...]]) -> float:
    """Makespan of a greedy list schedule, longest path to the end first, zero overhead."""
    children, below, waiting, order, ready = list_schedule(graph)
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


async def dag_minimal(graph: dict[str, tuple[str, ...]]) -> None:
    """A dispatcher that keeps nothing: ``C`` coroutines, each taking the ready task with
    the longest path to the end from a heap, running it, and counting down its
    dependents. No records, no ledger, no leases: what the loop itself allows."""
    children, below, waiting, order, ready = list_schedule(graph)
    left = len(graph)
    idle: list[asyncio.Future[None]] = []
    loop = asyncio.get_running_loop()

    async def slot() -> None:
        nonlocal left
        while left:
            if not ready:
                woken = loop.create_future()
                idle.append(woken)
                await woken
                continue
            tid = heapq.heappop(ready)[2]
            await sleeper({}, None)  # type: ignore[arg-type]
            left -= 1
            for c in children[tid]:
                waiting[c] -= 1
                if not waiting[c]:
                    heapq.heappush(ready, (-below[c], order[c], c))
            while idle and (ready or not left):
                idle.pop().set_result(None)

    await asyncio.gather(*(slot() for _ in range(CONCURRENCY)))


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
    parser.add_argument("--first-call", action="store_true",
                        help="only the first calls, each workload in fresh processes")
    parser.add_argument("--first-size", type=int, default=2000,
                        help="task count of the first calls")
    parser.add_argument("--processes", type=int, default=7,
                        help="fresh processes per first-call workload (the median is shown)")
    parser.add_argument("--first-child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--memory-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--sqlite-child", type=int, nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    if args.memory_child:
        _memory_child(args.memory_child)
        return
    if args.sqlite_child:
        _sqlite_child(*args.sqlite_child)
        return
    if args.first_child:
        _first_child(args.first_child[0], int(args.first_child[1]))
        return
    if args.first_call:
        _print_first_calls(first_calls(args.first_size, args.processes), args.json)
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
    mem_run, sql_run = durable_pair(n, max(rounds, 3))
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
    dag_rounds = max(rounds, 3)  # less than a second each; the machine's drift is not
    trio = ((dag_asyncio, (graph,)), (dag_minimal, (graph,)), (dag_planrun, (graph,)))
    on_epoll = best_of_each(trio, dag_rounds)
    on_select = best_of_each(trio, dag_rounds, loop=fine_timer_loop)
    names = ("plain asyncio", "no-bookkeeping dispatcher", "Supervisor (balanced)")
    figures["dag"] = {"bound_s": bound, "greedy_s": greedy, "rounds": dag_rounds, **{
        f"{key}_{where}_{what}": value
        for where, measured in (("default", on_epoll), ("select", on_select))
        for key, (wall, cpu) in zip(("asyncio", "minimal", "planrun"), measured, strict=True)
        for what, value in (("s", wall), ("cpu_s", cpu))}}
    print(f"\nDAG {LAYERS} x {WIDTH} tasks of {TASK_S * 1e3:.0f} ms, C = {CONCURRENCY}:"
          f" lower bound {bound:.3f} s; greedy critical path (offline) {greedy / bound:.2f}x;"
          f" best of {dag_rounds}, in turn")
    print(f"  {'':<28} {'default loop (epoll, ms timers)':>32} {'select loop (us timers)':>26}")
    for name, a, b in zip(names, on_epoll, on_select, strict=True):
        print(f"  {name:<28} {a[0]:>7.3f} s {a[0] / bound:>5.2f}x cpu {a[1] * 1e3:>4.0f} ms"
              f" {b[0]:>7.3f} s {b[0] / bound:>5.2f}x cpu {b[1] * 1e3:>4.0f} ms")
    dag_async, dag_run = on_epoll[0][0], on_epoll[2][0]

    first = rows[0]
    flat_costs = [r["flat_us"] for r in rows]
    targets = [
        ("Supervisor / asyncio (no-op)", max(r["flat_us"] / r["asyncio_us"] for r in rows),
         "<= 1.5"),
        ("the same in CPU time (less load-bound)",
         max(r["flat_cpu_us"] / r["asyncio_cpu_us"] for r in rows), "(reference)"),
        ("D, us per task (flat, worst size)", max(r["flat_d_us"] for r in rows), "<= 20"),
        ("plan_and_run / asyncio", max(p["plan_us"] / p["asyncio_us"] for p in prow)
         if prow else float("nan"), "<= 2.5"),
        ("SQLite-durable / in-memory", sql_run[0] / mem_run[0], "<= 2"),
        ("DAG Supervisor / bound", dag_run / bound, "<= 1.10"),
        ("DAG plain asyncio / bound", dag_async / bound, "(reference)"),
        ("DAG Supervisor / plain asyncio", dag_run / dag_async, "< 1 (ahead)"),
        ("  the same on the select loop (us timers)", on_select[2][0] / on_select[0][0],
         "< 1 (ahead)"),
        ("  DAG Supervisor / bound there", on_select[2][0] / bound, "<= 1.10"),
        ("  no-bookkeeping dispatcher / bound (default)", on_epoll[1][0] / bound,
         "(reference)"),
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


def _print_first_calls(figures: dict[str, Any], path: str | None) -> None:
    n = figures["tasks"]
    print(f"first call in a fresh process, {n} no-op tasks, C = {CONCURRENCY}; median of "
          f"{figures['processes']} processes each")
    print(f"  {'workload':<14} {'asyncio':>9} {'call':>9} {'ratio':>6} {'CPU':>6}   target   "
          "gc passes (gen 0, 1, 2)   ratios")
    targets = {"sup": "<= 1.5", "plan": "<= 2.5"}
    for mode, label in FIRST_CALLS.items():
        row = figures[mode]
        ratios = " ".join(f"{r:.2f}" for r in row["ratios"])
        print(f"  {label:<14} {row['asyncio_s'] * 1e3:>6.1f} ms {row['call_s'] * 1e3:>6.1f} ms"
              f" {row['ratio']:>6.2f} {row['cpu_ratio']:>6.2f}   {targets[mode]:<8}"
              f" {row['gc_passes']!s:<24} {ratios}")
    if path:
        with open(path, "w", encoding="utf-8") as fh:
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
