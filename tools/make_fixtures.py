"""Make the cassettes in ``fixtures/``: synthesized from the stand-in, or recorded live.

    python tools/make_fixtures.py                  # every scenario, synthesized
    python tools/make_fixtures.py tickets brief    # some of them
    OPENAI_API_KEY=sk-... python tools/make_fixtures.py --live brief tickets release
    python tools/make_fixtures.py --eval                       # the eval goal sets' cassettes
    OPENAI_API_KEY=sk-... python tools/make_fixtures.py --eval --live taskbench

Either way it is planrun's own recorder (:func:`planrun.testing.record`) around the real
:class:`planrun.Model` and the scenario's real entry (:mod:`planrun.dev.scenarios`). Without
``--live`` the model talks to ``tools/standin.py`` on 127.0.0.1 with a placeholder key and
the cassette is marked ``"synthesized"``; with ``--live`` it talks to ``OPENAI_BASE_URL``
(default the OpenAI API) with ``OPENAI_API_KEY`` and ``PLANRUN_MODEL`` (default
gpt-4o-mini) and is marked ``"recorded"``. The failure scenarios script their failures in
the stand-in, so ``--live`` skips them. After each recording the cassette is replayed
once through the same entry to prove it reproduces the run.

``--eval`` makes the cassettes of the shipped eval goal sets (``src/planrun/evals``):
it writes the goal files (``examples.jsonl`` from the worked examples and a few more
goals over their kinds, ``taskbench.jsonl`` from the TaskBench samples in
``tests/data/taskbench``), then records :func:`planrun.dev.eval.evaluate` for the ``default``
and ``strict`` prompt versions, against the stand-in's synthetic planner
(:func:`standin.eval_planner`) or, with ``--live``, the real API; and replays it once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from standin import StandIn, eval_planner, for_scenario

from planrun._facade import RunReport
from planrun.dev.eval import EVALS_DIR, EvalReport, aevaluate, evaluate
from planrun.dev.fixtures import record, replay
from planrun.dev.scenarios import SCENARIOS, Scenario
from planrun.dev.testing import FakeOpenAI
from planrun.model import Model
from planrun.runtime._clock import VirtualClock

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


EVAL_SETS = ("examples", "taskbench")
EVAL_VERSIONS = {"default": None, "strict": "strict"}
TASKBENCH_SAMPLES = ("57993067", "30123865", "53762265", "16942550", "19276184", "25190828",
                     "30711588", "33805217")
"""The TaskBench HuggingFace samples of the ``taskbench`` goal set: singles, chains, DAGs."""


def _brief_plan(goal: str, topics: list[str], analyses: list[tuple[str, list[int]]],
                audience: str) -> dict[str, Any]:
    tasks: list[dict[str, Any]] = [
        {"kind": "research", "payload": {"topic": t, "questions": ["key players", "trends"]},
         "depends_on": []} for t in topics]
    for question, deps in analyses:
        tasks.append({"kind": "analyse", "payload": {"question": question}, "depends_on": deps})
    last = list(range(len(topics), len(tasks))) or list(range(len(topics)))
    tasks.append({"kind": "write_brief", "payload": {"audience": audience}, "depends_on": last})
    return {"goal": goal, "tasks": tasks}


def example_goals() -> list[dict[str, Any]]:
    """The ``examples`` goal set: the worked examples' goals and a few more over their kinds."""
    from planrun.examples import answers, brief, release

    brief_app, release_app = "planrun.examples.brief:app", "planrun.examples.release:app"
    lines = [
        ("brief-eu-payments", brief.GOAL, brief_app, answers.BRIEF_PLAN, ["brief"]),
        ("brief-us-robo", "produce a competitive brief on US robo-advisers", brief_app,
         _brief_plan("produce a competitive brief on US robo-advisers",
                     ["Betterment and Wealthfront", "Vanguard Digital Advisor"],
                     [("Who wins on fees and who on features?", [0, 1])], "the product team"),
         ["brief"]),
        ("brief-ev-charging", "brief the board on the EV charging market in Germany", brief_app,
         _brief_plan("brief the board on the EV charging market in Germany",
                     ["Public charging operators", "Home wallboxes", "Regulation and subsidies"],
                     [("Where is the margin?", [0, 1]), ("What changes with the AFIR?", [0, 2])],
                     "the board"), ["brief"]),
        ("brief-one-topic", "summarise Klarna's latest results for the sales team", brief_app,
         _brief_plan("summarise Klarna's latest results for the sales team",
                     ["Klarna quarterly results"], [("What changed this quarter?", [0])],
                     "the sales team"), ["brief", "small"]),
        ("release-billing", "release billing-api 2.4.0 with the invoices.due_at migration",
         release_app, release.RELEASE_PLAN, ["release"]),
        ("release-search", "roll out search-service 1.8 with its new index column",
         release_app, {"goal": "roll out search-service 1.8", "tasks": [
             {"kind": "migrate_db", "payload": {"database": "search",
                                                "change": "add column documents.lang"},
              "depends_on": []},
             {"kind": "deploy_app", "payload": {"service": "search-service",
                                                "version": "1.8.0"}, "depends_on": [0]},
             {"kind": "smoke_test", "payload": {"service": "search-service",
                                                "feature": "search by language"},
              "depends_on": [1]}]}, ["release"]),
    ]
    return [{"id": i, "goal": g, "registry": r, "tags": tags,
             "expected_kinds": sorted({t["kind"] for t in ref["tasks"]}), "reference": ref}
            for i, g, r, ref, tags in lines]


def taskbench_goals() -> list[dict[str, Any]]:
    """The ``taskbench`` goal set: user requests and gold plans of TaskBench samples."""
    from planrun.dev.taskbench import iter_samples, sample_to_plan

    folder = REPO / "tests" / "data" / "taskbench" / "data_huggingface"
    samples = {str(s["id"]): s for s in iter_samples(folder)}
    out = []
    for sample_id in TASKBENCH_SAMPLES:
        sample = samples[sample_id]
        plan = sample_to_plan(sample)
        plan["goal"] = sample["user_request"]
        out.append({"id": f"hf-{sample_id}", "goal": sample["user_request"],
                    "registry": "taskbench:taskbench_huggingface",
                    "tags": ["taskbench", "huggingface", str(sample.get("type"))],
                    "reference": plan})
    return out


def write_goal_sets() -> None:
    """Write ``examples.jsonl`` and ``taskbench.jsonl`` into the shipped evals folder."""
    for name, lines in (("examples", example_goals()), ("taskbench", taskbench_goals())):
        text = "".join(json.dumps(line, ensure_ascii=False, sort_keys=True) + "\n"
                       for line in lines)
        (EVALS_DIR / f"{name}.jsonl").write_text(text, encoding="utf-8")


def make_eval(name: str, *, live: bool, out: Path | None = None) -> Path:
    """Record the eval of goal set ``name`` (both prompt versions) into ``out`` (default
    the shipped cassettes folder) and check that it replays."""
    goals = EVALS_DIR / f"{name}.jsonl"
    path = (out or EVALS_DIR / "cassettes") / f"{name}.json"
    command = f"python tools/make_fixtures.py --eval{' --live' if live else ''} {name}"

    async def measure(model: Model) -> EvalReport:
        async with model:
            return await aevaluate(goals, EVAL_VERSIONS, model=model, concurrency=1)

    if live:
        model = Model()
        with record(path, base_url=model.base_url, model=model.model, made="recorded",
                    scenario=f"eval:{name}", command=command):
            recorded = asyncio.run(measure(model))
    else:
        with StandIn(FakeOpenAI({"plan": eval_planner(goals)})) as server:
            model = Model(STANDIN_MODEL, api_key=STANDIN_KEY, base_url=server.base_url)
            with record(path, base_url="http://127.0.0.1:<port>/v1", model=STANDIN_MODEL,
                        made="synthesized", scenario=f"eval:{name}", command=command):
                recorded = asyncio.run(measure(model))
    replayed = evaluate(goals, EVAL_VERSIONS, replay=path)
    if replayed.summaries() != recorded.summaries():
        raise SystemExit(f"eval {name}: the replay differs from the recording")
    shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    print(f"{shown}: {len(recorded.versions)} versions")
    print(recorded.table())
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
    parser.add_argument("--eval", action="store_true",
                        help=f"make the eval goal sets' cassettes ({', '.join(EVAL_SETS)})")
    args = parser.parse_args(argv)
    if args.live and not os.environ.get("OPENAI_API_KEY"):
        parser.error("--live needs OPENAI_API_KEY")
    if args.eval:
        wanted = args.scenarios or list(EVAL_SETS)
        if set(wanted) - set(EVAL_SETS):
            parser.error(f"unknown eval set(s); have {list(EVAL_SETS)}")
        write_goal_sets()
        for name in wanted:
            make_eval(name, live=args.live)
        return 0
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
