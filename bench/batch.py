"""Batch mode on the nightly triage: what it costs, and how long it takes, against live.

    python bench/batch.py                  # 2,000 tickets (4,000 model calls)
    python bench/batch.py --quick          # 200 tickets

The triage (classify each ticket, then draft its reply: two model calls per ticket, 8
workers x 4 slots) runs three ways against the stand-in server on loopback (the real openai
SDK over HTTP), each answer taking ``--latency`` seconds live as a model server's would:

- **live**: every call a request of its own (the baseline, in the same run);
- **batched**: every call a Batch API line; a batch completes ``--batch-s`` seconds after it
  is submitted;
- **deadline**: batched, with a deadline twice what the run needs live, and batches whose
  lines complete steadily over twice the time to the fallback: half-way through the first
  batch the core takes its calls back; the lines done are kept, the rest go live, and the
  drafts that follow go live at once.

Printed: makespan, model cost (at the list prices of gpt-4o-mini; batched lines at half),
calls answered by a batch and calls sent live, and the cost and makespan ratios to live.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planrun import Batching, Model, plan_and_run
from planrun.dev.testing import FakeBatchAPI, FakeOpenAI
from planrun.examples.answers import answers
from planrun.examples.ticket_data import generate_tickets
from planrun.examples.tickets import make_app, ticket_plan

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tools"))
from standin import StandIn  # noqa: E402


@dataclass
class Row:
    name: str
    makespan_s: float
    cost_usd: float
    batched: int
    live: int
    ok: bool
    note: str = ""


def run(name: str, tickets: int, latency: float, batch: Batching | None,
        deadline_s: float | None = None, **fake_batch: Any) -> Row:
    fake = FakeOpenAI(answers(tickets))
    api = FakeBatchAPI(fake, **fake_batch)
    with StandIn(fake, batch_api=api, slots=32, latency=latency) as server:
        model = Model("gpt-4o-mini", api_key="sk-bench-batch-0000000000",
                      base_url=server.base_url)
        app, _, _ = make_app(workers=8, capacity=4)
        plan = ticket_plan(generate_tickets(tickets, 0), app.registry)
        started = time.perf_counter()
        report = plan_and_run(plan, app, model=model, batch=batch, deadline_s=deadline_s)
        took = time.perf_counter() - started
        lines = sum(b["request_counts"]["completed"] for b in api.batches.values())
        live = len(fake.requests) - lines
    cancelled = f"{api.cancelled} batch(es) cancelled" if api.cancelled else ""
    return Row(name, took, report.usage.total.cost_usd, lines, live, report.ok, cancelled)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tickets", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="200 tickets, 3 s batches")
    parser.add_argument("--latency", type=float, default=0.05,
                        help="seconds a live answer takes (32 at once)")
    parser.add_argument("--batch-s", type=float, default=10.0,
                        help="seconds a batch takes to complete")
    args = parser.parse_args(argv)
    if args.quick:
        args.tickets, args.batch_s = 200, 3.0
    calls = 2 * args.tickets
    base = run("live", args.tickets, args.latency, None)
    # What the run is told a live call takes: a round of 32 in the live run, with a margin.
    live_s = 1.5 * base.makespan_s / math.ceil(calls / 32)
    fast = Batching(size=50_000, wait_s=0.5, poll_s=0.5, live_s=live_s, cancel_s=1.0)
    rows = [base, run("batched", args.tickets, args.latency, fast,
                      complete_after=args.batch_s)]
    # The deadline: what the rest of the run needs live, twice over, plus the cancel margin;
    # the slow batches' lines complete steadily over twice the time to the fallback, so
    # about half of the first batch is done when it is taken back.
    live_needed = math.ceil(calls / 32) * live_s + fast.cancel_s
    deadline = 2 * live_needed
    rows.append(run("deadline", args.tickets, args.latency, fast, deadline_s=deadline,
                    complete_after=2 * (deadline - live_needed), progress=True))
    print(f"{args.tickets:,} tickets, {calls:,} model calls; live answers take "
          f"{args.latency * 1000:.0f} ms, 32 at once; live_s {live_s:.3f} s; deadline run: "
          f"{deadline:.1f} s")
    print(f"{'run':<10}{'makespan':>11}{'cost':>12}{'x live':>8}{'batched':>9}{'live':>7}"
          f"{'ok':>5}  note")
    for r in rows:
        ratio = r.cost_usd / base.cost_usd
        print(f"{r.name:<10}{r.makespan_s:>10.2f}s{r.cost_usd:>11.5f}${ratio:>7.2f}"
              f"{r.batched:>9,}{r.live:>7,}{'yes' if r.ok else 'NO':>5}  {r.note}")
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
