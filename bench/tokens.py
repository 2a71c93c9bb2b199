"""At a provider's token limit: the share of it used, requests per minute, 429s.

    python bench/tokens.py [--tasks 300] [--tpm 120000] [--concurrency 16] [--pythonpath DIR]

A stand-in server (``tools/standin.py``) enforces a tokens-per-minute limit the way the
API counts it: each request takes its prompt's estimated tokens plus its output bound
(1,024 when it sends none), one second's worth may go back to back, and every answer
carries the ``x-ratelimit-*`` headers. ``--tasks`` ticket classifications (one model call
each) run against it, in the same run:

* **plain asyncio + the openai SDK**: every call at once under a semaphore of
  ``--concurrency``, no output bound, the SDK's own retries (2, then 8);
* **planrun, one process**: ``planrun run --tpm N`` at the same concurrency;
* **planrun, 4 worker processes**: ``planrun worker`` x 4 sharing one limit through a
  SQLite file, the run started with ``--workers external --tpm N``.

For each: tasks completed, HTTP 429s, the share of the token limit used (the tokens the
server counted over the admitted requests, first to last, against the limit over that
time) and requests per minute. ``--pythonpath`` runs the planrun legs on another source
tree (an older checkout's ``src``), to compare versions in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(REPO / "tests" / "integration"))
from limits_app import plan_document  # noqa: E402
from standin import StandIn  # noqa: E402

from planrun.dev.testing import FakeOpenAI  # noqa: E402
from planrun.examples.answers import answers  # noqa: E402
from planrun.examples.tickets import Classification  # noqa: E402
from planrun.model import PromptLibrary  # noqa: E402
from planrun.model._schema import strict_schema  # noqa: E402

KEY = "sk-standin-tokens-0000000000000000"


@dataclass(frozen=True)
class Row:
    """One system's figures over one run."""

    system: str
    completed: int
    rate_limited: int
    share: float
    rpm: float
    seconds: float


def _figures(system: str, server: StandIn, completed: int, seconds: float,
             tpm: float) -> Row:
    admitted, counted = list(server.admitted), list(server.counted)
    span = admitted[-1] - admitted[0] if len(admitted) > 1 else 0.0
    # n admitted requests span n - 1 intervals: the last one's tokens fall outside.
    share = sum(counted[:-1]) / (tpm / 60 * span) if span else 0.0
    rpm = (len(admitted) - 1) / span * 60 if span else 0.0
    return Row(system, completed, server.rate_limited, share, rpm, seconds)


def plain(server: StandIn, tasks: int, tpm: float, concurrency: int, retries: int) -> Row:
    """Every classification at once under a semaphore, the SDK retrying on its own."""
    library = PromptLibrary()
    schema = strict_schema(Classification).schema
    payloads = plan_document(tasks)["tasks"]

    async def go() -> int:
        client = openai.AsyncOpenAI(api_key=KEY, base_url=server.base_url, max_retries=retries)
        gate = asyncio.Semaphore(concurrency)

        async def one(payload: dict[str, Any]) -> bool:
            rendered = library.render("classify_ticket", **payload["payload"],
                                      payload=payload["payload"], inputs={}, task_id="t")
            async with gate:
                try:
                    await client.chat.completions.create(
                        model="gpt-4o-mini", messages=rendered.messages(None),
                        response_format={"type": "json_schema", "json_schema": {
                            "name": "classify_ticket", "strict": True, "schema": schema}})
                except openai.APIError:
                    return False
                return True

        try:
            done = await asyncio.gather(*(one(p) for p in payloads))
        finally:
            await client.close()
        return sum(done)

    started = time.monotonic()
    completed = asyncio.run(go())
    return _figures(f"plain asyncio + SDK ({retries} retries)", server, completed,
                    time.monotonic() - started, tpm)


def _env(server: StandIn, pythonpath: str | None) -> dict[str, str]:
    paths = [p for p in (pythonpath, str(REPO / "tests" / "integration")) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths),
            "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": KEY}


def _cli(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "planrun.cli", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def one_process(server: StandIn, plan: Path, tpm: float, concurrency: int,
                pythonpath: str | None) -> Row:
    """``planrun run --tpm`` in one process."""
    started = time.monotonic()
    run = _cli(["run", str(plan), "--app", "limits_app:app", "--tpm", f"{tpm:g}",
                "--concurrency", str(concurrency), "--json"], _env(server, pythonpath))
    out, err = run.communicate(timeout=1800)
    summary = _summary(out, err)
    return _figures("planrun, 1 process", server, summary["counts"]["completed"],
                    time.monotonic() - started, tpm)


def worker_processes(server: StandIn, plan: Path, tpm: float, concurrency: int,
                     pythonpath: str | None, workers: int = 4) -> Row:
    """``planrun worker`` x ``workers`` and a run with ``--workers external --tpm``."""
    env = _env(server, pythonpath)
    per = max(1, concurrency // workers)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'tokens.db'}"
        procs = [_cli(["worker", "--db", url, "--app", "limits_app:app", "--name", f"w{i}",
                       "--concurrency", str(per), "--idle-exit", "120"], env)
                 for i in range(workers)]
        try:
            for p in procs:
                assert p.stderr is not None
                banner = p.stderr.readline()
                if not banner.startswith("worker "):
                    raise SystemExit(f"a worker did not start: {banner}")
            started = time.monotonic()
            run = _cli(["run", str(plan), "--app", "limits_app:app", "--db", url,
                        "--workers", "external", "--tpm", f"{tpm:g}", "--json"], env)
            out, err = run.communicate(timeout=1800)
            seconds = time.monotonic() - started
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                p.communicate(timeout=60)
    summary = _summary(out, err)
    return _figures(f"planrun, {workers} worker processes", server,
                    summary["counts"]["completed"], seconds, tpm)


def _summary(out: str, err: str) -> dict[str, Any]:
    lines = out.strip().splitlines()
    if not lines:
        raise SystemExit(f"planrun printed no summary: {err[-2000:]}")
    summary: dict[str, Any] = json.loads(lines[-1])
    return summary


def main(argv: list[str] | None = None) -> int:
    """Measure every system against a fresh stand-in and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--tpm", type=float, default=120_000.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--pythonpath", help="run the planrun legs on this source tree")
    parser.add_argument("--only", choices=["plain", "planrun"], help="one side only")
    args = parser.parse_args(argv)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "plan.json"
        plan.write_text(json.dumps(plan_document(args.tasks)))
        legs: list[Any] = []
        if args.only != "planrun":
            legs += [lambda s: plain(s, args.tasks, args.tpm, args.concurrency, 2),
                     lambda s: plain(s, args.tasks, args.tpm, args.concurrency, 8)]
        if args.only != "plain":
            legs += [lambda s: one_process(s, plan, args.tpm, args.concurrency,
                                           args.pythonpath),
                     lambda s: worker_processes(s, plan, args.tpm, args.concurrency,
                                                args.pythonpath)]
        for leg in legs:
            with StandIn(FakeOpenAI(answers()), tpm_limit=args.tpm) as server:
                rows.append(leg(server))
            r = rows[-1]
            print(f"{r.system}: {r.completed}/{args.tasks} completed, {r.rate_limited} x 429, "
                  f"{r.share:.0%} of the token limit, {r.rpm:.0f} requests/min, "
                  f"{r.seconds:.0f} s", flush=True)
    print()
    print(f"| system ({args.tasks} classifications, {args.tpm:g} TPM) | completed | HTTP 429s "
          "| share of the token limit used | requests/min |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.system} | {r.completed} | {r.rate_limited} | {r.share:.0%} | "
              f"{r.rpm:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
