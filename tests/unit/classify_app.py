"""An app of one kind, ``classify_ticket`` (the tickets example's model worker), with no
contract: a plan of classifications alone is a whole plan here (``classify_app:app``)."""

from __future__ import annotations

from planrun import App, ModelWorker, Registry
from planrun.examples.tickets import Classification, TicketPayload

registry = Registry()
registry.register("classify_ticket", ModelWorker("classify_ticket", result=Classification),
                  payload=TicketPayload, description="Label one support ticket.")
app = App(registry)
