"""Instructions per task of the dispatch workloads, counted by valgrind (repeatable).

    python bench/instructions.py                    # asyncio, Supervisor, chained, plan_and_run
    python bench/instructions.py --modes sup,base   # some of them
    python bench/instructions.py --modes plan,sqlite  # the SQLite store's cost per task
    python bench/instructions.py --modes sup,loop   # the Supervisor against its work as one loop

Wall-time ratios on a shared 2-core machine swing from run to run; instruction counts do
not (the same code and inputs give the same count whatever else the machine does). Each
workload of ``bench/dispatch.py`` runs under ``valgrind --tool=callgrind`` at two sizes,
counting only the workload itself (not the interpreter's start or the imports), and the
difference over the difference in size is the marginal count per task. The ratios are
against plain ``asyncio.gather`` + semaphore over the same no-op coroutine, as in
``bench/dispatch.py``. It takes about ten minutes: valgrind runs Python some 50x slower,
and each of the eight runs starts the interpreter and imports the project under it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

MODES = {
    "base": "asyncio.run(dispatch.baseline(n))",
    "sup": "asyncio.run(dispatch.supervised(n, False))",
    "chain": "asyncio.run(dispatch.supervised(n, True))",
    "plan": "asyncio.run(dispatch.planned(n))",
    "sqlite": "asyncio.run(dispatch.planned_sqlite(n))",
    "loop": "asyncio.run(dispatch.one_loop(n))",
}
LABELS = {"base": "asyncio.gather + semaphore", "sup": "Supervisor (flat)",
          "chain": "Supervisor (chained)", "plan": "plan_and_run",
          "sqlite": "plan_and_run, SQLite store",
          "loop": "the same work as one loop"}


def _child(mode: str, n: int) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import dispatch

    asyncio.run(dispatch.supervised(10, False))  # lazy imports and first calls, not counted
    asyncio.run(dispatch.planned(10))
    if mode == "loop":
        asyncio.run(dispatch.one_loop(10))
    if mode == "sqlite":
        asyncio.run(dispatch.planned_sqlite(10))
    code = compile(MODES[mode], "<workload>", "exec")
    # Counted: only what runs under sorted() (valgrind's --toggle-collect=builtin_sorted).
    sorted([0], key=lambda _: exec(code, {"asyncio": asyncio, "dispatch": dispatch, "n": n}))


def count(mode: str, n: int) -> int:
    """Instructions the workload ``mode`` executes with ``n`` tasks."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg.out")
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
             "--collect-atstart=no", "--toggle-collect=builtin_sorted*",
             # and every thread the workload starts (the SQLite store's, whose statements
             # run on it), from its first instruction to its last
             "--toggle-collect=start_thread",
             sys.executable, __file__, "--child", mode, str(n)],
            check=True, capture_output=True)
        with open(out) as fh:
            totals = re.search(r"^totals:\s*(\d+)", fh.read(), re.MULTILINE)
        if totals is None:
            raise RuntimeError(f"no totals in callgrind's output for {mode}")
        return int(totals.group(1))


def per_task(mode: str, small: int, large: int) -> float:
    with ThreadPoolExecutor(2) as pool:  # the two sizes at once: one per core
        a, b = pool.map(lambda n: count(mode, n), (small, large))
    return (b - a) / (large - small)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--modes", default="base,sup,chain,plan")
    parser.add_argument("--sizes", default="1000,4000", help="the two task counts")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child[0], int(args.child[1]))
        return
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (Debian: apt-get install valgrind)")
    small, large = (int(s) for s in args.sizes.split(","))
    modes = args.modes.split(",")
    if "base" not in modes:
        modes.insert(0, "base")
    counts = {m: per_task(m, small, large) for m in modes}
    print(f"instructions per task (marginal, {small} -> {large} tasks, C = 32)")
    for m in modes:
        ratio = counts[m] / counts["base"]
        line = f"  {LABELS[m]:<28} {counts[m]:>10,.0f}   {ratio:5.2f}x asyncio"
        if m == "sqlite" and "plan" in counts:
            line += f"   {counts[m] / counts['plan']:5.2f}x plan_and_run in memory"
        print(line)


if __name__ == "__main__":
    main()
