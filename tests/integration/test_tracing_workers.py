"""A worker process's attempt spans join the trace of the run they work for."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from dbos_support import run_on_dbos
from dist_app import registry
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from planrun._facade import App, resume_run
from planrun.core._task import Task
from planrun.obs import tracing
from planrun.stores import open_store

HERE = Path(__file__).resolve().parent


def test_worker_process_spans_are_in_the_runs_trace(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'dist.db'}"
    spans_file = tmp_path / "worker-spans.jsonl"
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.instrument(tracer_provider=provider)
    tickets = [Task(id=f"T-{i}", kind="triage", payload={"ticket": f"T-{i}"}) for i in range(4)]

    async def go() -> Any:
        with tracing.traced_run("dist-run") as traced:
            assert traced is not None
            return await asyncio.wait_for(run_on_dbos(registry, tickets, url, run_id="dist-run",
                                                      meta=traced.meta), 60)

    env = {**os.environ, "PYTHONPATH": str(HERE), tracing.FILE_ENV: str(spans_file)}
    worker = subprocess.Popen(
        [sys.executable, "-m", "planrun.cli", "worker", "--db", url, "--app", "dist_app:app",
         "--name", "w1", "--idle-exit", "30"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        result = asyncio.run(go())
    finally:
        tracing.uninstrument()
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err[-500:]
    assert result.ok
    [run] = [s for s in exporter.get_finished_spans() if s.name == "run dist-run"]
    lines = [json.loads(line) for line in spans_file.read_text().splitlines()]
    attempts = [s for s in lines if s["name"] == "task triage"]
    assert sorted(s["attributes"]["planrun.task.id"] for s in attempts) == [
        f"T-{i}" for i in range(4)]
    trace_id = f"0x{run.context.trace_id:032x}"
    assert {s["context"]["trace_id"] for s in attempts} == {trace_id}
    assert {s["parent_id"] for s in attempts} == {f"0x{run.context.span_id:016x}"}
    assert {s["attributes"]["planrun.worker"] for s in attempts} == {"w1"}
    assert {s["attributes"]["planrun.task.status"] for s in attempts} == {"completed"}


def test_a_resumed_run_joins_the_trace_of_the_run_it_carries_on(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.instrument(tracer_provider=provider)
    try:
        with tracing.traced_run("crashed") as traced:
            assert traced is not None
            meta = traced.meta

        async def create() -> None:
            from planrun.stores.base import RunInfo

            store = open_store(url)
            await store.open()
            await store.create_run(RunInfo("crashed", 0.0, "running", "g", meta))
            await store.add_tasks("crashed", [Task("T-0", "triage", {"ticket": "T-0"})], [])
            await store.close()

        asyncio.run(create())
        report = resume_run("crashed", App(registry), url)
    finally:
        tracing.uninstrument()
    assert report.ok
    spans = exporter.get_finished_spans()
    first, second = (s for s in spans if s.name == "run crashed")
    assert second.context.trace_id == first.context.trace_id
    assert second.parent is not None and second.parent.span_id == first.context.span_id
    assert second.attributes is not None and second.attributes["planrun.run.resumed"] is True
    [attempt] = [s for s in spans if s.name == "task triage"]
    assert attempt.parent is not None and attempt.parent.span_id == second.context.span_id


def test_an_external_run_from_the_cli_is_one_trace_with_its_workers(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"goal": "triage", "tasks": [
        {"kind": "triage", "payload": {"ticket": f"T-{i}"}, "depends_on": []}
        for i in range(3)]}))
    base = {**os.environ, "PYTHONPATH": str(HERE)}
    worker = subprocess.Popen(
        [sys.executable, "-m", "planrun.cli", "worker", "--db", url, "--app", "dist_app:app",
         "--name", "w1", "--idle-exit", "30"],
        env={**base, tracing.FILE_ENV: str(tmp_path / "worker.jsonl")},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "planrun.cli", "run", str(plan), "--app", "dist_app:app",
             "--db", url, "--workers", "external", "--json"],
            env={**base, tracing.FILE_ENV: str(tmp_path / "run.jsonl")},
            capture_output=True, text=True, timeout=120)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=30)
    assert done.returncode == 0, done.stderr[-800:]
    run_spans = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    [run] = [s for s in run_spans if s["name"].startswith("run ")]
    attempts = [json.loads(line) for line in
                (tmp_path / "worker.jsonl").read_text().splitlines()]
    attempts = [s for s in attempts if s["name"] == "task triage"]
    assert len(attempts) == 3
    assert {s["context"]["trace_id"] for s in attempts} == {run["context"]["trace_id"]}
    assert {s["parent_id"] for s in attempts} == {run["context"]["span_id"]}
