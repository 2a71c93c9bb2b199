"""Tiers against the all-standard bill: flex, priority and batch chosen per task by its slack.

    python bench/tiers.py                  # 2,000 classifications + a summary
    python bench/tiers.py --quick          # 400 classifications, times scaled by 0.2

Each run classifies N tickets (one model call each, 32 workers at once) and then counts the
labels in one summary task that depends on every classification, against the stand-in on
loopback (the real openai SDK over HTTP). Standard answers take ``--latency`` seconds (0.3);
flex answers ten times as long, with room for ``--flex-room`` at once (a flex request beyond
it is refused, 429 ``resource_unavailable``); priority answers half as long. Runs:

- **standard**: no tiers (the baseline, in the same run);
- **loose**: ``--tiers flex,priority`` with a deadline four times what all flex takes;
- **tight**: flex with room for 2, a deadline four times what the standard run took (flex
  alone would need N / 2 flex answers one after another: far more);
- **batch**: ``--tiers batch,flex`` with hours of slack (batches complete in a few seconds).

Printed: makespan, cost (gpt-4o-mini list prices), the ratio to the standard bill, calls
served per tier, whether the deadline was kept; and ``planrun estimate``'s expected cost of
the plan against the standard run's bill. Every tier starts from planrun's conservative
latencies and learns the stand-in's from its answers.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planrun import App, Batching, Model, ModelWorker, Registry, estimate, plan_and_run
from planrun.core import Plan, TaskContext
from planrun.dev.testing import FakeBatchAPI, FakeOpenAI
from planrun.examples.answers import answers
from planrun.examples.ticket_data import generate_tickets
from planrun.examples.tickets import Classification, TicketPayload

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tools"))
from standin import StandIn  # noqa: E402

KEY = "sk-bench-tiers-00000000000000"
SLOTS = 32


def summarize(payload: Any, ctx: TaskContext) -> dict[str, int]:
    """Count the labels of every classification (no model call)."""
    return dict(Counter(str(r.get("category")) for r in ctx.inputs.values()))


def make_app() -> App:
    registry = Registry()
    registry.register("classify_ticket", ModelWorker("classify_ticket", result=Classification),
                      payload=TicketPayload, description="Label one support ticket.")
    registry.register("summarize", summarize, description="Count the labels.")
    return App(registry, concurrency=SLOTS)


def make_plan(n: int, app: App) -> Plan:
    tasks: list[dict[str, Any]] = [
        {"kind": "classify_ticket", "payload": {"ticket": t.model_dump(mode="json")},
         "depends_on": []} for t in generate_tickets(n, 0)]
    tasks.append({"kind": "summarize", "payload": {}, "depends_on": list(range(n))})
    return Plan.parse({"goal": f"classify {n} tickets and sum them up", "tasks": tasks},
                      app.registry, max_tasks=n + 1)


@dataclass
class Row:
    name: str
    makespan_s: float
    cost_usd: float
    served: Counter[str]
    ok: bool
    deadline_s: float | None
    refused: int


def run(name: str, n: int, latency: float, *, tiers: tuple[str, ...] = (),
        deadline_s: float | None = None, flex_room: int = SLOTS,
        batch_s: float = 2.0) -> Row:
    app = make_app()
    plan = make_plan(n, app)
    fake = FakeOpenAI(answers(n), count_schema=True)  # prompt tokens as the API counts them
    api = FakeBatchAPI(fake, complete_after=batch_s)
    with StandIn(fake, batch_api=api, slots=SLOTS, latency=latency,
                 flex_slots=flex_room) as server:
        model = Model("gpt-4o-mini", api_key=KEY, base_url=server.base_url)
        batch = Batching(wait_s=0.5, poll_s=0.5) if "batch" in tiers else None
        started = time.perf_counter()
        report = plan_and_run(plan, app, model=model, tiers=tiers, deadline_s=deadline_s,
                              batch=batch)
        took = time.perf_counter() - started
        refused = server.flex_refused
    served = Counter(r.tier for r in report.usage.records if r.error is None)
    ok = report.ok and not report.deadline_reached
    return Row(name, took, report.usage.total.cost_usd, served, ok, deadline_s, refused)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tickets", type=int, default=2000)
    parser.add_argument("--latency", type=float, default=0.3,
                        help="seconds a standard answer takes (flex: ten times)")
    parser.add_argument("--quick", action="store_true",
                        help="400 tickets, every time scaled by 0.2")
    args = parser.parse_args(argv)
    if args.quick:
        args.tickets, args.latency = 400, 0.06
    n, latency = args.tickets, args.latency
    app = make_app()
    expected = estimate(make_plan(n, app), app, model="gpt-4o-mini").tiers["default"]
    base = run("standard", n, latency)
    all_flex_s = -(-n // SLOTS) * 10 * latency
    rows = [base,
            run("loose", n, latency, tiers=("flex", "priority"), deadline_s=4 * all_flex_s),
            run("tight", n, latency, tiers=("flex", "priority"),
                deadline_s=4 * base.makespan_s, flex_room=2),
            run("batch", n, latency, tiers=("batch", "flex"), deadline_s=4 * 3600.0,
                batch_s=10 * latency)]
    print(f"{n:,} classifications + a summary; standard answers {latency * 1000:.0f} ms, flex "
          f"{latency * 10000:.0f} ms, {SLOTS} workers")
    print(f"{'run':<9}{'deadline':>10}{'makespan':>10}{'cost':>11}{'x std':>7}  "
          f"{'served (flex refusals)':<44}{'kept':>5}")
    for r in rows:
        deadline = f"{r.deadline_s:.0f} s" if r.deadline_s else "-"
        served = ", ".join(f"{k} {v}" for k, v in sorted(r.served.items()))
        print(f"{r.name:<9}{deadline:>10}{r.makespan_s:>9.1f}s{r.cost_usd:>10.4f}$"
              f"{r.cost_usd / base.cost_usd:>7.3f}  {served + f' ({r.refused})':<44}"
              f"{'yes' if r.ok else 'NO':>5}")
    off = expected.cost_usd / base.cost_usd - 1
    print(f"estimate: ${expected.cost_usd:.4f} expected (${expected.cost_usd_max:.4f} at most) "
          f"against ${base.cost_usd:.4f} billed: {off:+.1%}")
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
