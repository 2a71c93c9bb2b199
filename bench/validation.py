"""Plan validation on hostile shapes: seconds for each, and the ratio to parsing the input.

    python bench/validation.py            # every case once (each must stay under a second)
    python bench/validation.py --repeat 3 # best of three

Cases: 4,000 two-task cycles (8,000 tasks naming each other by id), 200 tasks each
depending on all the others, a 100,000-task chain, a payload nested 100,000 levels, and
5 MB of model prose holding arrays nested 900 and 50 levels deep that never parse.
The baseline, measured in the same run, is one C-speed JSON pass over input of the same
size: ``json.loads`` of the plan's text; for the deep payload ``json.dumps`` of as many
empty objects side by side; for prose ``json.dumps`` of the 5 MB string. The ratio says how
many such passes validation costs. Both sides run with the cyclic collector paused, as
validation pauses it for large input itself.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import time
from collections.abc import Callable
from typing import Any

from planrun.core._plan import validate_plan

KINDS = ["noop"]
PROSE_BYTES = 5_000_000


def task(deps: list[Any], **extra: Any) -> dict[str, Any]:
    return {"kind": "noop", "payload": {}, "depends_on": deps, **extra}


def two_task_cycles(n: int = 4_000) -> list[dict[str, Any]]:
    tasks = []
    for k in range(n):
        tasks.append(task([f"b{k}"], id=f"a{k}"))
        tasks.append(task([f"a{k}"], id=f"b{k}"))
    return tasks


def all_to_all(n: int = 200) -> list[dict[str, Any]]:
    return [task([f"t{j}" for j in range(n) if j != i], id=f"t{i}") for i in range(n)]


def chain(n: int = 100_000) -> list[dict[str, Any]]:
    return [task([i - 1] if i else []) for i in range(n)]


def deep_payload(depth: int = 100_000) -> list[dict[str, Any]]:
    value: Any = {}
    for _ in range(depth):
        value = {"a": value}
    return [{"kind": "noop", "payload": value, "depends_on": []}]


def nested_prose(depth: int, size: int = PROSE_BYTES) -> str:
    """Prose around arrays ``depth`` deep full of numbers, broken at the very end."""
    head = "Here is the plan you asked for: " + "[" * depth
    tail = ", oops" + "]" * depth + " Let me know if it helps."
    numbers = []
    length = len(head) + len(tail)
    i = 0
    while length < size:
        word = f"{i}, "
        numbers.append(word)
        length += len(word)
        i += 1
    return head + "".join(numbers) + "0" + tail


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        paused = gc.isenabled()
        gc.disable()
        try:
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        finally:
            if paused:
                gc.enable()
    return min(times)


def case(name: str, raw: object, baseline: Callable[[], object], repeat: int,
         max_tasks: int) -> None:
    problems: list[Any] = []

    def validate() -> None:
        problems[:] = validate_plan(raw, KINDS, max_tasks=max_tasks)

    seconds = best(validate, repeat)
    base = best(baseline, repeat)
    codes = sorted({p.code for p in problems}) or ["valid"]
    print(f"{name:<34} {seconds:8.3f} s   baseline {base:7.3f} s   {seconds / base:6.1f}x"
          f"   -> {len(problems)} problem(s) {', '.join(codes)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="the same cases (they are quick)")
    args = parser.parse_args()
    print(f"{'case':<34} {'validate':>10}   {'baseline':>16}   ratio")
    for name, tasks in (("4,000 two-task cycles", two_task_cycles()),
                        ("200 tasks all-to-all", all_to_all()),
                        ("100,000-task chain", chain())):
        text = json.dumps({"goal": "g", "tasks": tasks})
        case(name, text, functools.partial(json.loads, text), args.repeat, 100_000)
    # The same number of containers, side by side instead of nested: one JSON pass.
    flat = [{} for _ in range(100_000)]
    case("payload nested 100,000 levels", deep_payload(), functools.partial(json.dumps, flat),
         args.repeat, 50)
    for depth in (900, 50):
        prose = nested_prose(depth)
        case(f"5 MB prose, arrays {depth} deep", prose, functools.partial(json.dumps, prose),
             args.repeat, 50)

if __name__ == "__main__":
    main()
