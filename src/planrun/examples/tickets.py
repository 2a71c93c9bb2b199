"""Nightly ticket triage: classify each ticket, draft a reply, flag what needs a human.

The plan is one task (:func:`triage_plan`): ``fetch_tickets`` reads the night's tickets
and, when it completes, spawns two tasks per ticket (:meth:`TaskContext.spawn`):
``classify_ticket`` and ``draft_reply`` (which depends on it), and a ``summarize_triage``
that depends on every draft and counts them. :func:`ticket_plan` gives the same per-ticket
tasks up front instead.

The draft is computed by a worker and is safe to repeat; *sending* it is an effect the
supervisor applies once per completed draft, keyed by the task, never by the worker, so a
reclaimed-but-alive task cannot send twice. Tickets labelled ``needs_human`` are flagged
for the human desk instead of answered.

With ``make_app(approve_security=True)`` (``--app planrun.examples.tickets:secure_app``) a
reply to a ticket classified as a security incident waits for a person before it is sent:
its draft is kept in status ``waiting`` (across restarts) until ``planrun approve RUN TASK``
sends it or ``planrun reject RUN TASK --reason ...`` drops it. ``approve_security="auto"``
stands in for the person (approved by default one second into the wait), as
``planrun demo tickets`` does.

    python -m planrun.examples.tickets --tickets 200      # live: needs OPENAI_API_KEY
    planrun demo tickets                                   # offline, from the fixture
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field

from planrun._facade import App
from planrun.core import Plan, Registry, Task, TaskContext, WorkerSpec
from planrun.core.scheduling import Approval
from planrun.examples.ticket_data import Ticket, generate_tickets
from planrun.model import ModelWorker

__all__ = [
    "Classification",
    "Desk",
    "Outbox",
    "ReplyDraft",
    "Triage",
    "is_security_reply",
    "make_app",
    "ticket_plan",
    "triage_plan",
]

Category = Literal[
    "billing", "bug", "account", "shipping", "feature_request", "security", "other"
]


class Classification(BaseModel):
    """The label of one ticket."""

    category: Category
    urgency: Literal["low", "normal", "high", "critical"]
    needs_human: bool = Field(
        description="true for security incidents, legal threats, or anything a canned "
        "reply cannot safely answer"
    )
    reason: str = Field(description="one sentence quoting the words that decided the label")


class ReplyDraft(BaseModel):
    """A reply as the model drafts it."""

    subject: str
    body: str


class Triage(BaseModel):
    """What ``draft_reply`` returns: the draft plus the label that decides its fate."""

    ticket_id: str
    language: str
    category: str
    urgency: str
    needs_human: bool
    subject: str
    body: str


class TicketPayload(BaseModel):
    """Payload of both kinds: the ticket."""

    ticket: Ticket


class DraftReply:
    """Drafts with the model; copies the label from the classification in code."""

    def __init__(self) -> None:
        self.model_worker = ModelWorker("draft_reply", result=ReplyDraft)
        self.result_model = Triage

    async def __call__(self, payload: TicketPayload, ctx: TaskContext) -> Triage:
        label = Classification.model_validate(next(iter(ctx.inputs.values())))
        draft = await self.model_worker(payload, ctx)
        assert isinstance(draft, ReplyDraft)
        return Triage(
            ticket_id=payload.ticket.id,
            language=payload.ticket.language,
            category=label.category,
            urgency=label.urgency,
            needs_human=label.needs_human,
            subject=draft.subject,
            body=draft.body,
        )


@dataclass
class Outbox:
    """Where replies go. Sending is idempotent by key, as a mail API with keys would be."""

    sent: dict[str, dict[str, Any]] = field(default_factory=dict)
    attempts: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def send(self, task: Task, key: str) -> None:
        """Send the reply of a completed ``draft_reply`` task, once per key."""
        with self._lock:
            self.attempts += 1
            self.sent.setdefault(key, dict(task.result))


@dataclass
class Desk:
    """The human desk: tickets flagged for a person, once per key."""

    flagged: dict[str, str] = field(default_factory=dict)

    def flag(self, task: Task, key: str) -> None:
        """Flag a ticket whose label says a human must answer."""
        self.flagged.setdefault(key, str(task.result["ticket_id"]))


class FetchPayload(BaseModel):
    """Which night's tickets: how many, and the generator's seed (a ticket API stand-in)."""

    count: int = Field(ge=0, le=10_000)
    seed: int = 0


class Fetched(BaseModel):
    """What ``fetch_tickets`` returns (the tickets themselves go to the spawned tasks)."""

    tickets: int


class TriageSummary(BaseModel):
    """What ``summarize_triage`` returns: drafts by category, and how many need a human."""

    drafts: int
    by_category: dict[str, int]
    needs_human: int


def fetch_tickets(payload: FetchPayload, ctx: TaskContext) -> Fetched:
    """Read the tickets, then ask for a classify and a draft task per ticket, and a summary
    after every draft."""
    tickets = generate_tickets(payload.count, payload.seed)
    drafts = []
    for ticket in tickets:
        data = {"ticket": ticket.model_dump()}
        label = ctx.spawn("classify_ticket", data)
        drafts.append(ctx.spawn("draft_reply", data, depends_on=[label]))
    ctx.spawn("summarize_triage", {}, depends_on=drafts)
    return Fetched(tickets=len(tickets))


def summarize_triage(payload: dict[str, Any], ctx: TaskContext) -> TriageSummary:
    """Count the drafts of the night (the inputs: every ``draft_reply``)."""
    drafts = [r for r in ctx.inputs.values() if isinstance(r, dict) and "subject" in r]
    by_category: dict[str, int] = {}
    for draft in drafts:
        by_category[draft["category"]] = by_category.get(draft["category"], 0) + 1
    return TriageSummary(drafts=len(drafts), by_category=dict(sorted(by_category.items())),
                         needs_human=sum(1 for d in drafts if d["needs_human"]))


def is_security_reply(task: Task) -> bool:
    """A drafted reply to a ticket classified as a security incident."""
    return isinstance(task.result, dict) and task.result.get("category") == "security"


def make_app(workers: int = 8, capacity: int = 4,
             approve_security: bool | Literal["auto"] = False) -> tuple[App, Outbox, Desk]:
    """The triage app with a fresh outbox and desk.

    ``approve_security``: replies to security incidents wait for a person's approval before
    they are sent (an approved one is sent: a person read it); ``"auto"`` approves them by
    default one second into their wait (a demo without a person).
    """
    registry = Registry()
    # The contracts: a reply is the run's result and needs its ticket's classification;
    # a ticket is classified once. The night's triage is what fetch_tickets grows, so it
    # counts as a result too (the tasks it spawns are held to the same contracts).
    registry.register(
        "classify_ticket",
        ModelWorker("classify_ticket", result=Classification),
        payload=TicketPayload, unique=True,
        description="Label one support ticket: category, urgency, needs_human.",
    )
    registry.register(
        "draft_reply",
        DraftReply(),
        payload=TicketPayload, needs=["classify_ticket"], delivers=True, unique=True,
        description="Draft the reply to one classified ticket.",
    )
    registry.register("fetch_tickets", fetch_tickets, payload=FetchPayload, result=Fetched,
                      delivers=True,
                      description="Read the night's tickets; spawns their classify and "
                      "draft tasks.")
    registry.register("summarize_triage", summarize_triage, result=TriageSummary,
                      delivers=True, max_count=1,
                      description="Count the night's drafts (spawned by fetch_tickets).")
    outbox, desk = Outbox(), Desk()

    def deliver(task: Task, key: str) -> None:
        if task.result["needs_human"] and task.cause != "approved":
            desk.flag(task, key)
        else:
            outbox.send(task, key)

    approvals: dict[str, Approval | str] = {}
    if approve_security:
        auto = approve_security == "auto"
        approvals["draft_reply"] = Approval(
            "effect", when=is_security_reply, timeout_s=1.0 if auto else None,
            on_timeout="approve" if auto else "reject")
    app = App(
        registry,
        [WorkerSpec(f"triage-{i + 1}", None, capacity) for i in range(workers)],
        effects={"draft_reply": deliver},
        description="Nightly ticket triage",
        approvals=approvals,
    )
    return app, outbox, desk


def ticket_plan(tickets: Sequence[Ticket], registry: Registry) -> Plan:
    """Two tasks per ticket: classify, then draft (depending on the classification)."""
    tasks: list[dict[str, Any]] = []
    for ticket in tickets:
        payload = {"ticket": ticket.model_dump()}
        tasks.append({"kind": "classify_ticket", "payload": payload, "depends_on": []})
        tasks.append({"kind": "draft_reply", "payload": payload, "depends_on": [len(tasks) - 1]})
    document = {"goal": f"triage {len(tickets)} support tickets", "tasks": tasks}
    return Plan.parse(document, registry, min_tasks=1, max_tasks=max(2, len(tasks)))


def triage_plan(count: int, registry: Registry, seed: int = 0) -> Plan:
    """One task that fetches the tickets; the rest of the plan grows from its result."""
    document = {"goal": f"triage the night's {count} support tickets", "tasks": [
        {"kind": "fetch_tickets", "payload": {"count": count, "seed": seed}, "depends_on": []}]}
    return Plan.parse(document, registry, min_tasks=1, max_tasks=1)


app, outbox, desk = make_app()
"""A ready app for ``--app planrun.examples.tickets:app``."""
secure_app = make_app(approve_security=True)[0]
"""The same app, where replies to security incidents wait for ``planrun approve``."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the triage live against the configured OpenAI-compatible endpoint."""
    from planrun._facade import plan_and_run

    parser = argparse.ArgumentParser(description="Nightly ticket triage (live)")
    parser.add_argument("--tickets", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    run_app, sent, humans = make_app()
    plan = ticket_plan(generate_tickets(args.tickets, args.seed), run_app.registry)
    report = plan_and_run(plan, run_app)
    print(report.summary())
    print(f"replies sent: {len(sent.sent)}, flagged for a human: {len(humans.flagged)}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    from planrun.examples import run_main

    raise SystemExit(run_main(main))
