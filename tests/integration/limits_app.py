"""The app that worker processes of the shared-limits tests load (``limits_app:app``).

One kind, ``classify_ticket``: one model request per task (the tickets example's
:class:`~planrun.ModelWorker`), so requests and tasks can be counted against each other.
"""

from __future__ import annotations

from typing import Any

from planrun import App, ModelWorker, Registry
from planrun.examples.ticket_data import generate_tickets
from planrun.examples.tickets import Classification, TicketPayload

registry = Registry()
registry.register(
    "classify_ticket",
    ModelWorker("classify_ticket", result=Classification),
    payload=TicketPayload,
    description="Label one support ticket: category, urgency, needs_human.",
)
app = App(registry)


def plan_document(n: int) -> dict[str, Any]:
    """A plan of ``n`` independent classify_ticket tasks."""
    tasks = [{"kind": "classify_ticket", "payload": {"ticket": t.model_dump()}, "depends_on": []}
             for t in generate_tickets(n)]
    return {"goal": f"classify {n} tickets", "tasks": tasks}
