"""Make the cassettes in ``fixtures/``: synthesized from the stand-in, or recorded live.

    python tools/make_fixtures.py                  # every scenario, synthesized
    python tools/make_fixtures.py tickets brief    # some of them
    OPENAI_API_KEY=sk-... python tools/make_fixtures.py --live brief tickets release

Either way it is planrun's own recorder (:func:`planrun.fixtures.record`) around the real
:class:`planrun.Model` and the scenario's real entry (:mod:`planrun.scenarios`). Without
``--live`` the model talks to ``tools/standin.py`` on 127.0.0.1 with a placeholder key and
the cassette is marked ``"synthesized"``; with ``--live`` it talks to ``OPENAI_BASE_URL``
(default the OpenAI API) with ``OPENAI_API_KEY`` and ``PLANRUN_MODEL`` (default
gpt-4o-mini) and is marked ``"recorded"``. The failure scenarios script their failures in
the stand-in, so ``--live`` skips them. After each recording the cassette is replayed
once through the same entry to prove it reproduces the run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from standin import for_scenario

from planrun.clock import VirtualClock
from planrun.fixtures import record, replay
from planrun.model import Model
from planrun.runner import RunReport
from planrun.scenarios import SCENARIOS, Scenario

REPO = Path(__file__).resolve().parents[1]
STANDIN_KEY = "sk-standin-placeholder-key-not-a-secret-000"
"""The key sent to the stand-in (it is scrubbed from the file like any other)."""
STANDIN_MODEL = "gpt-4o-mini"


def command_for(scenario: Scenario, live: bool) -> str:
    """The command that re-makes one cassette."""
    flag = " --live" if live else ""
    return f"python tools/make_fixtures.py{flag} {scenario.name}"


def _check(scenario: Scenario, report: RunReport) -> None:
    counts = {k: report.counts.get(k, 0) for k in scenario.counts}
    if counts != dict(scenario.counts):
        raise SystemExit(f"{scenario.name}: expected {dict(scenario.counts)}, got {counts}")


async def _run(scenario: Scenario, model: Model) -> RunReport:
    try:
        return await scenario.entry(model, None)
    finally:
        await model.aclose()


def make(scenario: Scenario, out: Path, *, live: bool) -> Path:
    """Record one scenario to ``out/<name>.json`` and check that it replays."""
    path = out / scenario.file
    command = command_for(scenario, live)
    if live:
        model = Model()
        with record(path, base_url=model.base_url, model=model.model, made="recorded",
                    scenario=scenario.name, command=command) as recorder:
            report = asyncio.run(_run(scenario, model))
    else:
        with for_scenario(scenario.name) as server:
            model = Model(STANDIN_MODEL, api_key=STANDIN_KEY, base_url=server.base_url)
            with record(path, base_url="http://127.0.0.1:<port>/v1", model=STANDIN_MODEL,
                        made="synthesized", scenario=scenario.name,
                        command=command) as recorder:
                report = asyncio.run(_run(scenario, model))
    if not live:  # a live model may plan differently; its run is what it is
        _check(scenario, report)
    count = len(recorder.cassette.interactions)
    with replay(path) as cassette:
        clock = VirtualClock()
        replayed = clock.run(_run(scenario, cassette.model()))
    if dict(replayed.counts) != dict(report.counts):
        raise SystemExit(f"{scenario.name}: replay ended {dict(replayed.counts)}, "
                         f"the recording {dict(report.counts)}")
    if cassette.unused():
        raise SystemExit(f"{scenario.name}: {len(cassette.unused())} interactions unused")
    size = path.stat().st_size
    print(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}: {count} "
          f"interactions, {size / 1024:.0f} KiB, {dict(report.counts)}")
    return path


def main(argv: list[str] | None = None) -> int:
    """Make the named cassettes (default: all)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                        help=f"which ones (default: all of {', '.join(SCENARIOS)})")
    parser.add_argument("--live", action="store_true",
                        help="record against the real API (OPENAI_API_KEY) instead of the "
                        "stand-in")
    parser.add_argument("--out", type=Path, default=REPO / "fixtures", help="folder to write")
    args = parser.parse_args(argv)
    names = args.scenarios or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; have {list(SCENARIOS)}")
    if args.live and not os.environ.get("OPENAI_API_KEY"):
        parser.error("--live needs OPENAI_API_KEY")
    for name in names:
        scenario = SCENARIOS[name]
        if args.live and not scenario.live:
            print(f"{name}: skipped (its failures are scripted in the stand-in; synthesize it)")
            continue
        make(scenario, args.out, live=args.live)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
