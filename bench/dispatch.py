"""Per-task supervisor overhead with no-op async workers, against asyncio.gather.

    python bench/dispatch.py --quick      # 1,000 / 10,000 / 100,000 tasks, one round each
    python bench/dispatch.py              # the same sizes, best of three rounds
    python bench/dispatch.py --otel       # also with OpenTelemetry spans and metrics on

The baseline, measured in the same run, is plain ``asyncio.gather`` over the same no-op
coroutine with a semaphore of the same concurrency. The figure that matters is the ratio,
and how it moves with size: a flat per-task cost means dispatch does not scan the task set.

``--otel`` adds a column: the same flat run observed by :class:`planrun.tracing.RunTracer`
(one span per attempt, the task and worker metrics) with the OpenTelemetry SDK configured,
spans going through a ``SimpleSpanProcessor`` to an exporter that drops them, so the cost
measured is planrun's and the SDK's, not an exporter's I/O. Its ratio is against the
untraced run of the same size.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from typing import Any

from planrun import tracing
from planrun.registry import KindSpec, Registry, TaskContext, WorkerSpec
from planrun.supervisor import Supervisor
from planrun.task import Task

CONCURRENCY = 64


async def noop(payload: Any, ctx: TaskContext) -> None:
    return None


async def baseline(n: int) -> float:
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one(i: int) -> None:
        async with sem:
            await noop({}, None)  # type: ignore[arg-type]

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return time.perf_counter() - started


async def supervised(n: int, chained: bool, traced: bool = False) -> float:
    registry = Registry([KindSpec("noop", handler=noop)])
    observer = tracing.RunTracer(f"bench-{n}") if traced else None
    sup = Supervisor(registry, [WorkerSpec("w", None, CONCURRENCY)], strategy="least_loaded",
                     on_event=observer.on_event if observer else None)
    started = time.perf_counter()
    # Every 10th task depends on the one before it, so readiness tracking is exercised.
    sup.add_tasks(
        Task(id=f"t{i}", kind="noop", depends_on=(f"t{i - 1}",) if chained and i % 10 else ())
        for i in range(n)
    )
    if observer is not None:
        observer.start()
        result = await observer.run(sup.arun())
        observer.finish("finished")
    else:
        result = await sup.arun()
    elapsed = time.perf_counter() - started
    assert result.ok, result.counts
    return elapsed


def best(fn: Any, n: int, rounds: int, *args: Any) -> float:
    times = []
    for _ in range(rounds):
        gc.collect()
        times.append(asyncio.run(fn(n, *args)))
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one round per size")
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--otel", action="store_true",
                        help="also run with OpenTelemetry tracing and metrics configured")
    args = parser.parse_args()
    rounds = 1 if args.quick else 3
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.otel:
        _configure_otel()
    print(f"no-op tasks, concurrency {CONCURRENCY}, best of {rounds}")
    header = f"{'tasks':>8} {'gather us/task':>15} {'planrun us/task':>16} {'ratio':>7}"
    header += f" {'chained us/task':>16} {'ratio':>7}"
    print(header + (f" {'traced us/task':>15} {'vs planrun':>10}" if args.otel else ""))
    for n in sizes:
        base = best(baseline, n, rounds) / n * 1e6
        flat = best(supervised, n, rounds, False) / n * 1e6
        chain = best(supervised, n, rounds, True) / n * 1e6
        line = (f"{n:>8} {base:>15.2f} {flat:>16.2f} {flat / base:>7.1f}"
                f" {chain:>16.2f} {chain / base:>7.1f}")
        if args.otel:
            traced = best(supervised, n, rounds, False, True) / n * 1e6
            line += f" {traced:>15.2f} {traced / flat:>10.2f}"
        print(line)


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
