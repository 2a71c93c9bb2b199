"""Per-task cost of a run that grows at run time against the same tasks given up front.

    python bench/fanout.py --quick     # 2,000 tasks
    python bench/fanout.py             # 10,000 tasks

Both runs use the in-process supervisor with no store and no-op handlers under the real
clock. The baseline is N tasks given up front, then a reduce that depends on all of them;
the fan-out run is one task that spawns the same N tasks when it completes, and a reduce
that joins it. The spawned run validates its addition (the plan validator: kinds, payloads,
dependencies) and widens the join, so the ratio is what growing at run time costs per task.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from planrun.core._plan import validate_plan
from planrun.core._registry import KindSpec, Registry, TaskContext, WorkerSpec
from planrun.core._task import Task
from planrun.core.scheduling import SpawnLimits
from planrun.runtime._supervisor import Supervisor


async def noop(payload: Any, ctx: TaskContext) -> int:
    return 1


def fan(n: int) -> Any:
    async def fetch(payload: Any, ctx: TaskContext) -> int:
        for i in range(n):
            ctx.spawn("item", {"i": i})
        return n
    return fetch


def run(tasks: list[Task], registry: Registry, n: int) -> float:
    sup = Supervisor(registry, [WorkerSpec("w", None, 64)], seed=0,
                     spawn_limits=SpawnLimits(max_tasks=n + 10, max_per_task=n))
    sup.add_tasks(tasks)
    start = time.perf_counter()
    result = sup.run()
    elapsed = time.perf_counter() - start
    assert result.ok and len(result.tasks) == n + 2, result.counts
    return elapsed


def up_front(n: int, validated: bool) -> float:
    """The same tasks given up front; ``validated``: the plan document is validated first,
    as every plan is before it runs (``plan_and_run``, ``planrun run``)."""
    registry = Registry([KindSpec("item", handler=noop), KindSpec("root", handler=noop),
                         KindSpec("reduce", handler=noop)])
    start = time.perf_counter()
    if validated:
        doc = [{"kind": "root", "payload": {}, "depends_on": []},
               *({"kind": "item", "payload": {"i": i}, "depends_on": [0]} for i in range(n)),
               {"kind": "reduce", "payload": {}, "depends_on": list(range(1, n + 1))}]
        assert not validate_plan(doc, registry, max_tasks=n + 2)
    checked = time.perf_counter() - start
    items = [Task(f"root/{i}", "item", {"i": i}, depends_on=("root",)) for i in range(n)]
    tasks = [Task("root", "root"), *items,
             Task("sum", "reduce", depends_on=tuple(t.id for t in items))]
    return checked + run(tasks, registry, n)


def spawned(n: int) -> float:
    registry = Registry([KindSpec("item", handler=noop), KindSpec("root", handler=fan(n)),
                         KindSpec("reduce", handler=noop)])
    tasks = [Task("root", "root"), Task("sum", "reduce", joins=("root",))]
    return run(tasks, registry, n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tasks", type=int, default=None)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    n = args.tasks or (2_000 if args.quick else 10_000)
    bare, base, grow = [], [], []
    for _ in range(args.repeat):  # interleaved: a loaded machine slows all three alike
        bare.append(up_front(n, validated=False))
        base.append(up_front(n, validated=True))
        grow.append(spawned(n))
    bare_s, base_s, grow_s = (statistics.median(x) for x in (bare, base, grow))
    print(f"{n} tasks (median of {args.repeat}): up front {bare_s / n * 1e6:.1f} us/task, "
          f"up front with the plan validated {base_s / n * 1e6:.1f} us/task, spawned at run "
          f"time {grow_s / n * 1e6:.1f} us/task; ratio {grow_s / base_s:.2f}x against the "
          f"validated plan, {grow_s / bare_s:.2f}x against bare tasks")


if __name__ == "__main__":
    main()
