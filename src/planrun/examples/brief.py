"""Competitive brief: a prose goal decomposed by the model into research, analysis, writing.

With ``make_app(unavailable=(...))`` research on a topic that starts with one of those
words keeps failing (its source times out on every attempt); run with
``on_dead="replan"``, the dead research and the steps it cancelled are re-planned by the
model (told the failure and the results so far) and the replacement runs.

    python -m planrun.examples.brief          # live: needs OPENAI_API_KEY
    planrun demo                              # offline, from the fixture
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, Field

from planrun._facade import App
from planrun.core import (
    InvalidPlan,
    PlanrunError,
    Registry,
    TaskContext,
    TransientError,
    WorkerSpec,
)
from planrun.model import ModelWorker

__all__ = ["GOAL", "Analysis", "Brief", "Findings", "make_app"]

GOAL = "produce a competitive brief on the European payments market"

Confidence = Literal["high", "medium", "low"]


class ResearchRequest(BaseModel):
    """What to research."""

    topic: str = Field(description="the subject, e.g. 'Adyen: products and pricing'")
    questions: list[str] = Field(description="the questions the research must answer")


class Finding(BaseModel):
    statement: str
    source: str
    confidence: Confidence


class Findings(BaseModel):
    """Result of ``research``."""

    topic: str
    findings: list[Finding]
    open_questions: list[str]


class AnalysisRequest(BaseModel):
    """What to analyse, from the research it depends on."""

    question: str = Field(description="the question the analysis answers")


class Factor(BaseModel):
    name: str
    evidence: str
    strength: Confidence


class Analysis(BaseModel):
    """Result of ``analyse``."""

    question: str
    factors: list[Factor]
    gaps: list[str]
    conclusion: str
    confidence: Confidence


class BriefRequest(BaseModel):
    """Who the brief is for."""

    audience: str = Field(description="the readers, e.g. 'the executive team'")


class Brief(BaseModel):
    """Result of ``write_brief``."""

    title: str
    summary: str
    points: list[str]
    risks: list[str]
    next_steps: list[str]


class _Research:
    """The research worker; a topic whose source is unavailable fails every attempt."""

    def __init__(self, unavailable: Sequence[str]) -> None:
        self.worker = ModelWorker("research", result=Findings)
        self.result_model = Findings
        self.unavailable = tuple(unavailable)

    async def __call__(self, payload: ResearchRequest, ctx: TaskContext) -> Findings:
        if payload.topic.startswith(self.unavailable) if self.unavailable else False:
            raise TransientError(f"the source for {payload.topic!r} timed out")
        result = await self.worker(payload, ctx)
        assert isinstance(result, Findings)
        return result


def make_app(researchers: int = 3, unavailable: Sequence[str] = ()) -> App:
    """Research workers in parallel, one analyst, one writer.

    ``unavailable``: topic prefixes whose research always times out (to show replanning).
    """
    registry = Registry()
    research: ModelWorker | _Research = (
        _Research(unavailable) if unavailable else ModelWorker("research", result=Findings))
    # The contracts: an analysis reads findings, the brief reads analyses and is the run's
    # result (one of it); no two research tasks or analyses ask the same thing.
    registry.register(
        "research", research, payload=ResearchRequest, unique=True,
        description="Collect findings with sources on one topic (a competitor, a segment, "
        "regulation). Independent research tasks run in parallel.",
    )
    registry.register(
        "analyse", ModelWorker("analyse", result=Analysis, inputs=Findings),
        payload=AnalysisRequest, unique=True,
        description="Analyse the findings of the research tasks it depends on to answer one "
        "question.",
    )
    registry.register(
        "write_brief", ModelWorker("write_brief", result=Brief, inputs=Analysis),
        payload=BriefRequest, delivers=True, max_count=1,
        description="Write the one-page brief from the analyses it depends on. Use once, last.",
    )
    workers = [WorkerSpec(f"researcher-{i + 1}", {"research": 1.0}, 1) for i in range(researchers)]
    workers.append(WorkerSpec("analyst", {"analyse": 1.0, "research": 0.5}, 1))
    workers.append(WorkerSpec("writer", {"write_brief": 1.0}, 1))
    return App(registry, workers, description="Competitive brief")


app = make_app()
"""A ready app for ``--app planrun.examples.brief:app``."""


def main(argv: Sequence[str] | None = None) -> int:
    """Decompose the goal and run it live against the configured endpoint."""
    from planrun._facade import plan_and_run

    parser = argparse.ArgumentParser(description="Competitive brief (live)")
    parser.add_argument("goal", nargs="?", default=GOAL)
    args = parser.parse_args(argv)
    try:
        report = plan_and_run(args.goal, make_app())
    except PlanrunError as exc:  # no key, an invalid plan after repairs, ...: one line
        from planrun.core import redact

        lines = [line.strip() for line in redact(str(exc)).splitlines() if line.strip()]
        print(f"brief: error: {' '.join(lines) or type(exc).__name__}", file=sys.stderr)
        return 1 if isinstance(exc, InvalidPlan) else 2
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    from planrun.examples import run_main

    raise SystemExit(run_main(main))
