"""The scenarios behind the project's fixtures: what runs, and what the stand-in scripts.

Each :class:`Scenario` is one cassette in ``fixtures/``: an async entry that runs a worked
example through :func:`planrun.aplan_and_run` on a given :class:`~planrun.model.Model`, the
replies the stand-in server (``tools/standin.py``) serves before its normal answers
(rate limits, server errors, a refusal, a rejected request), and the outcome a replay must
reproduce. ``tools/make_fixtures.py`` records them, the tests replay them, and
:func:`planrun.dev.fixtures.check` re-runs them against their cassettes to find stale ones, so
all three agree on what each scenario is.

    report = run_scenario("release", cassette.model(), clock=VirtualClock())
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from planrun.core import UsageError
from planrun.dev.testing import Scripted
from planrun.runtime import Clock, RealClock

if TYPE_CHECKING:
    from planrun._facade import RunReport
    from planrun.model import Model

__all__ = ["BATCH_RUN_ID", "SCENARIOS", "TICKETS", "Scenario", "batch_options", "get_scenario",
           "run_scenario"]

TICKETS = 200
"""Tickets in the ``tickets`` scenario (two requests each)."""
TRIAGE_TICKETS = 20
"""Tickets the ``triage`` scenario's first task fetches (two spawned requests each)."""

RETRY_AFTER_S = 2
"""The ``Retry-After`` the ``rate_limited`` scenario's 429 replies carry, in seconds."""

Entry = Callable[["Model", "Clock | None"], Coroutine[Any, Any, "RunReport"]]


@dataclass(frozen=True)
class Scenario:
    """One recorded scenario: its entry, its scripted failures and its expected outcome."""

    name: str
    """Also the cassette's file name, ``fixtures/<name>.json``."""
    description: str
    entry: Entry
    """Runs the scenario on a model (and, when given, under a clock); returns the report."""
    script: tuple[Scripted, ...] = ()
    """Replies the stand-in serves first, in arrival order, before its normal answers."""
    counts: Mapping[str, int] = field(default_factory=dict)
    """Task statuses the run must end with (statuses not named here are not checked)."""
    requests: int = 0
    """HTTP requests the run makes (retries included): the cassette's interactions."""

    @property
    def file(self) -> str:
        """The cassette's file name."""
        return f"{self.name}.json"

    @property
    def live(self) -> bool:
        """True when a live API can record it: no scripted failures are needed."""
        return not self.script


async def _brief(model: Model, clock: Clock | None) -> RunReport:
    from planrun._facade import aplan_and_run
    from planrun.examples import brief

    return await aplan_and_run(brief.GOAL, brief.make_app(), model=model, clock=clock)


async def _brief_contract(model: Model, clock: Clock | None) -> RunReport:
    from planrun._facade import aplan_and_run
    from planrun.examples import brief
    from planrun.examples.answers import PIX_GOAL

    return await aplan_and_run(PIX_GOAL, brief.make_app(), model=model, clock=clock)


async def _tickets(model: Model, clock: Clock | None) -> RunReport:
    from planrun._facade import aplan_and_run
    from planrun.examples import tickets
    from planrun.examples.ticket_data import generate_tickets

    app, _, _ = tickets.make_app()
    plan = tickets.ticket_plan(generate_tickets(TICKETS, seed=0), app.registry)
    return await aplan_and_run(plan, app, model=model, clock=clock)


async def _brief_replan(model: Model, clock: Clock | None) -> RunReport:
    from planrun._facade import aplan_and_run
    from planrun.core.scheduling import RetryPolicy
    from planrun.examples import brief

    app = brief.make_app(unavailable=("Wallets",))
    return await aplan_and_run(brief.GOAL, app, model=model, clock=clock, on_dead="replan",
                               retry=RetryPolicy(attempts=3, base=0.5, cap=2.0, jitter=0.0))


async def _triage(model: Model, clock: Clock | None) -> RunReport:
    from planrun._facade import aplan_and_run
    from planrun.examples import tickets

    app, _, _ = tickets.make_app(approve_security="auto")
    plan = tickets.triage_plan(TRIAGE_TICKETS, app.registry, seed=0)
    return await aplan_and_run(plan, app, model=model, clock=clock)


BATCH_RUN_ID = "nightly-batch"
"""The ``batch`` scenario's run id: its calls' ``custom_id`` derive from it, so it is fixed."""


def batch_options() -> dict[str, Any]:
    """The ``batch`` scenario's run options: batch mode, a fixed run id."""
    from planrun.model import Batching

    return {"batch": Batching(wait_s=0.5, poll_s=1.0), "run_id": BATCH_RUN_ID}


async def _batch(model: Model, clock: Clock | None) -> RunReport:
    from planrun._facade import aplan_and_run
    from planrun.examples import tickets
    from planrun.examples.ticket_data import generate_tickets

    app, _, _ = tickets.make_app(approve_security="auto")
    plan = tickets.ticket_plan(generate_tickets(TRIAGE_TICKETS, seed=0), app.registry)
    return await aplan_and_run(plan, app, model=model, clock=clock, **batch_options())


async def _release(model: Model, clock: Clock | None) -> RunReport:
    from planrun._facade import aplan_and_run
    from planrun.examples import release

    return await aplan_and_run(
        release.RELEASE_PLAN, release.make_app(), model=model, clock=clock, on_dead="abort_run"
    )


_OK = Scripted()
_RATE_LIMIT = Scripted(
    429,
    "Rate limit reached for gpt-4o-mini in organization org-standin on requests per min "
    "(RPM): Limit 500, Used 500, Requested 1. Please try again in 2s.",
    code="rate_limit_exceeded",
    headers={
        "retry-after": str(RETRY_AFTER_S),
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": f"{RETRY_AFTER_S}s",
    },
)
_SERVER_ERROR = Scripted(500, "The server had an error while processing your request.")

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "brief",
            "The competitive brief: the goal is decomposed (one invalid plan, repaired once), "
            "then three research tasks, two analyses and the brief run.",
            _brief,
            counts={"completed": 6},
            requests=8,
        ),
        Scenario(
            "brief_contract",
            "A brief whose first plan is well formed but does not do the job (the same "
            "research twice over, no brief: duplicate_task, no_deliverable); the repair "
            "loop gets a plan that keeps the kinds' contracts, which then runs.",
            _brief_contract,
            counts={"completed": 4},
            requests=6,
        ),
        Scenario(
            "tickets",
            f"Nightly triage of {TICKETS} generated tickets (seed 0): classify each, then "
            "draft its reply, 8 workers x 4 at a time.",
            _tickets,
            counts={"completed": 2 * TICKETS},
            requests=2 * TICKETS,
        ),
        Scenario(
            "brief_replan",
            "The competitive brief with the wallets research failing on every attempt: it "
            "dies after three, and the model re-plans it and the steps it cancelled (the "
            "wallets analysis, the brief); the replacement runs.",
            _brief_replan,
            counts={"completed": 6, "dead": 1, "cancelled": 2},
            requests=9,
        ),
        Scenario(
            "triage",
            f"The triage grown at run time: one task fetches {TRIAGE_TICKETS} tickets and "
            "spawns a classify and a draft task per ticket, and a summary after every draft.",
            _triage,
            counts={"completed": 2 + 2 * TRIAGE_TICKETS},
            requests=2 * TRIAGE_TICKETS,
        ),
        Scenario(
            "batch",
            f"The triage of {TRIAGE_TICKETS} tickets in batch mode: the classifications go "
            "out as one Batch API job, the drafts as a second, at half price.",
            _batch,
            counts={"completed": 2 * TRIAGE_TICKETS},
            requests=8,
        ),
        Scenario(
            "release",
            "The release plan: migrate, deploy, smoke-test, in order (on_dead='abort_run').",
            _release,
            counts={"completed": 3},
            requests=3,
        ),
        Scenario(
            "rate_limited",
            f"The release under a 429 storm: the migration is refused three times with "
            f"Retry-After: {RETRY_AFTER_S}, then succeeds; the run completes.",
            _release,
            script=(_RATE_LIMIT, _RATE_LIMIT, _RATE_LIMIT),
            counts={"completed": 3},
            requests=6,
        ),
        Scenario(
            "server_error",
            "The release with two 500s on the deploy request, retried, then success.",
            _release,
            script=(_OK, _SERVER_ERROR, _SERVER_ERROR),
            counts={"completed": 3},
            requests=5,
        ),
        Scenario(
            "refusal",
            "The release where the model refuses the deploy checklist: the deploy is dead "
            "after one request (ModelRefused), the smoke test cancelled, the run aborted.",
            _release,
            script=(_OK, Scripted(refusal="I'm sorry, but I can't help with that request.")),
            counts={"completed": 1, "dead": 1, "cancelled": 1},
            requests=2,
        ),
        Scenario(
            "bad_request",
            "The release where the migration request is rejected with a 400: dead after one "
            "request, nothing else runs.",
            _release,
            script=(
                Scripted(
                    400,
                    "This model's maximum context length is 128000 tokens. However, your "
                    "messages resulted in 131072 tokens. Please reduce the length of the "
                    "messages.",
                    code="context_length_exceeded",
                ),
            ),
            counts={"completed": 0, "dead": 1, "cancelled": 2},
            requests=1,
        ),
    )
}
"""Every scenario, by name."""


def get_scenario(name: str) -> Scenario:
    """The scenario called ``name`` (a file name such as ``tickets.json`` works too)."""
    key = name[: -len(".json")] if name.endswith(".json") else name
    try:
        return SCENARIOS[key]
    except KeyError:
        raise UsageError(f"no scenario {key!r}; have {sorted(SCENARIOS)}") from None


def run_scenario(name: str, model: Model, *, clock: Clock | None = None) -> RunReport:
    """Run scenario ``name`` to the end on ``model`` (synchronously, under ``clock``)."""
    scenario = get_scenario(name)
    return (clock or RealClock()).run(scenario.entry(model, clock))
