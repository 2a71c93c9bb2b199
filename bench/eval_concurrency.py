"""planrun eval: 20 goals decomposed one at a time, then at once up to a bound, in one run.

    python bench/eval_concurrency.py [--goals 20] [--concurrency 4] [--latency 0.5]
    python bench/eval_concurrency.py --base-url http://127.0.0.1:8080/v1 --model smollm2

By default the model server is the stand-in (``tools/standin.py``) answering like a server
with 4 parallel sequences (``slots=4``), each answer taking ``--latency`` seconds; with
``--base-url`` it is a real server (a llama.cpp or llama-cpp-python server started with 4
slots, say). The goal set is the shipped ``examples`` goals, repeated to ``--goals``. The
figure is the wall time of each, and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
from standin import StandIn, eval_planner  # noqa: E402

from planrun.dev.eval import EVALS_DIR, aevaluate  # noqa: E402
from planrun.dev.testing import FakeOpenAI  # noqa: E402
from planrun.model import Model  # noqa: E402

KEY = "sk-standin-eval-bench-000000000000000"


def goal_file(folder: Path, count: int) -> Path:
    """The shipped example goals, repeated (with new ids) to ``count`` lines."""
    lines = [json.loads(line) for line in
             (EVALS_DIR / "examples.jsonl").read_text(encoding="utf-8").splitlines() if line]
    out = folder / "goals.jsonl"
    rows = [{**lines[i % len(lines)], "id": f"g{i}"} for i in range(count)]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return out


def timed(goals: Path, base_url: str, model: str, concurrency: int) -> tuple[float, int]:
    """Wall seconds of one evaluation of the shipped prompt, and its error count."""

    async def go() -> int:
        async with Model(model, api_key=KEY, base_url=base_url) as client:
            report = await aevaluate(goals, {"default": None}, model=client,
                                     concurrency=concurrency)
        return int(report.summaries()["default"]["errors"])

    start = time.perf_counter()
    errors = asyncio.run(go())
    return time.perf_counter() - start, errors


def main(argv: list[str] | None = None) -> int:
    """Measure both and print them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--goals", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--latency", type=float, default=0.5,
                        help="seconds a stand-in answer takes")
    parser.add_argument("--base-url", help="a real model server instead of the stand-in")
    parser.add_argument("--model", default="gpt-4o-mini")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        goals = goal_file(Path(tmp), args.goals)
        if args.base_url:
            serial = timed(goals, args.base_url, args.model, 1)
            together = timed(goals, args.base_url, args.model, args.concurrency)
            where = args.base_url
        else:
            with StandIn(FakeOpenAI({"plan": eval_planner(goals)}), slots=4,
                         latency=args.latency) as server:
                serial = timed(goals, server.base_url, args.model, 1)
                together = timed(goals, server.base_url, args.model, args.concurrency)
            where = f"the stand-in (4 slots, {args.latency:g} s an answer)"
    print(f"{args.goals} goals against {where}:")
    print(f"  one at a time:        {serial[0]:7.1f} s ({serial[1]} errors)")
    print(f"  concurrency {args.concurrency}:        {together[0]:7.1f} s "
          f"({together[1]} errors)")
    print(f"  speed-up: {serial[0] / together[0]:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
