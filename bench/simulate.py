"""Capacity planning at scale: ``planrun simulate``'s cost per task from 5,000 to 50,000 tasks.

A scenario of chains (each task depends on the one before it, named by id or by index),
eight workers, read from its JSON form (:meth:`Scenario.from_dict`, which checks every
field) and run in virtual time. The sizes run in turn, round by round, and the best round of
each is kept, so the ratio is not one size's bad minute.

    python bench/simulate.py            # 5k and 50k tasks, best of 3 rounds
    python bench/simulate.py --quick    # one round
"""

from __future__ import annotations

import argparse
import gc
import time

from planrun.dev.sim import Scenario, simulate

SIZES = (5_000, 50_000)


def scenario(n: int) -> dict[str, object]:
    tasks: list[dict[str, object]] = []
    for i in range(n):
        task: dict[str, object] = {"id": f"task-{i}", "kind": "work", "estimate": 1 + i % 7}
        if i % 10:  # chains of ten: every other one names its dependency by id
            task["depends_on"] = [f"task-{i - 1}"] if i % 2 else [i - 1]
        tasks.append(task)
    return {"workers": [{"name": f"w{i}", "capacity": 4} for i in range(8)], "tasks": tasks}


def per_task(n: int) -> float:
    data = scenario(n)
    gc.collect()
    started = time.perf_counter()
    result = simulate(Scenario.from_dict(data))
    took = time.perf_counter() - started
    assert result.run.counts["completed"] == n
    return took / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round")
    rounds = 1 if parser.parse_args().quick else 3
    best = {n: float("inf") for n in SIZES}
    for _ in range(rounds):
        for n in SIZES:
            best[n] = min(best[n], per_task(n))
    for n in SIZES:
        print(f"{n:>7,} tasks: {best[n]:6.1f} us per task")
    print(f"cost per task at {SIZES[-1]:,} over {SIZES[0]:,}: "
          f"{best[SIZES[-1]] / best[SIZES[0]]:.2f}x (flat: <= 1.3x)")


if __name__ == "__main__":
    main()
