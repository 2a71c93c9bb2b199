"""Synthetic model answers for the worked examples.

Used by the tests and by the stand-in server that synthesises the project's fixtures (no
request here ever reaches the OpenAI API). Each answerer reads the request the way a model
would (the rendered prompt, the schema name) and returns JSON that fits the schema: the
ticket labels follow the generator's ground truth, replies are in the customer's
language, the brief's plan has the shape a good model gives.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from planrun.dev.testing import ChatRequest
from planrun.examples.ticket_data import ground_truth

__all__ = ["BRIEF_PLAN", "BRIEF_REPLAN", "INVALID_BRIEF_PLAN", "PIX_FIRST_PLAN", "PIX_GOAL",
           "PIX_PLAN", "answers"]

BRIEF_PLAN: dict[str, Any] = {
    "tasks": [
        {"kind": "research", "depends_on": [], "payload": {
            "topic": "Card acquirers and PSPs in Europe (Adyen, Worldline, Nexi, Stripe)",
            "questions": ["market shares", "pricing models", "recent moves"]}},
        {"kind": "research", "depends_on": [], "payload": {
            "topic": "Account-to-account payments and open banking under PSD2/PSD3",
            "questions": ["adoption", "key players", "regulatory timeline"]}},
        {"kind": "research", "depends_on": [], "payload": {
            "topic": "Wallets and BNPL in Europe (Apple Pay, PayPal, Klarna)",
            "questions": ["usage by country", "merchant fees"]}},
        {"kind": "analyse", "depends_on": [0, 1], "payload": {
            "question": "Where is card acquiring losing share to account-to-account rails?"}},
        {"kind": "analyse", "depends_on": [0, 2], "payload": {
            "question": "Which competitors are best placed in wallets and BNPL, and why?"}},
        {"kind": "write_brief", "depends_on": [3, 4], "payload": {
            "audience": "the executive team"}},
    ],
}
"""The plan the synthetic planner settles on after one repair."""

INVALID_BRIEF_PLAN: dict[str, Any] = {
    "tasks": [
        {"kind": "research", "depends_on": [], "payload": BRIEF_PLAN["tasks"][0]["payload"]},
        {"kind": "verify_sources", "depends_on": [0], "payload": {}},
        {"kind": "analyse", "depends_on": [3], "payload": BRIEF_PLAN["tasks"][3]["payload"]},
        {"kind": "write_brief", "depends_on": [2], "payload": {"audience": "executives"}},
    ],
}
"""A first plan with the two classic mistakes: an invented kind and a forward dependency."""

BRIEF_REPLAN: dict[str, Any] = {
    "tasks": [
        {"kind": "research", "depends_on": [], "payload": {
            "topic": "Digital wallets and BNPL in Europe from public filings (PayPal, Klarna)",
            "questions": ["usage by country", "merchant fees"]}},
        {"kind": "analyse", "depends_on": [0], "payload": {
            "question": "Which competitors are best placed in wallets and BNPL, and why?"}},
        {"kind": "write_brief", "depends_on": [1], "payload": {
            "audience": "the executive team"}},
    ],
}
"""The fragment the synthetic planner gives to re-plan the wallets research that died."""

PIX_GOAL = "produce a short brief on the risks of entering the Brazilian instant-payments market"
"""The goal of the contract demo: a plan whose first form does not do the job."""

_PIX_TOPICS = ("Pix adoption and the central bank's rules", "Incumbent banks and fintechs on Pix")
PIX_FIRST_PLAN: dict[str, Any] = {
    "tasks": [
        {"kind": "research", "depends_on": [], "payload": {
            "topic": topic, "questions": ["what are the risks for a new entrant?"]}}
        for topic in (*_PIX_TOPICS, *_PIX_TOPICS)
    ],
}
"""A well-formed first plan that breaks the brief's contracts: the same research twice over
and no brief at all (``duplicate_task``, ``no_deliverable``)."""

PIX_PLAN: dict[str, Any] = {
    "tasks": [
        *PIX_FIRST_PLAN["tasks"][:2],
        {"kind": "analyse", "depends_on": [0, 1], "payload": {
            "question": "What are the main risks of entering Pix as a new provider?"}},
        {"kind": "write_brief", "depends_on": [2], "payload": {"audience": "the board"}},
    ],
}
"""The plan the synthetic planner gives when the repair names the broken contracts."""

_REPLIES = {
    "en": ("Re: {subject}", "Hello {name},\n\nthank you for writing to us. We are looking into "
           "\"{subject}\" and will get back to you as soon as we know more. If you have an order "
           "number or a screenshot, please reply with it.\n\nBest regards,\nThe Support Team"),
    "de": ("AW: {subject}", "Hallo {name},\n\nvielen Dank für Ihre Nachricht. Wir kümmern uns um "
           "\"{subject}\" und melden uns, sobald wir mehr wissen.\n\nBeste Grüße,\n"
           "Das Support-Team"),
    "fr": ("RE : {subject}", "Bonjour {name},\n\nmerci pour votre message. Nous examinons "
           "« {subject} » et revenons vers vous dès que possible.\n\nCordialement,\n"
           "L'équipe support"),
    "es": ("RE: {subject}", "Hola {name}:\n\ngracias por escribirnos. Estamos revisando "
           "\"{subject}\" y le responderemos en cuanto sepamos más.\n\nSaludos cordiales,\n"
           "El equipo de soporte"),
}


def _ticket(req: ChatRequest) -> dict[str, Any]:
    """The first JSON object of the prompt: the payload (``ticket`` inside, if any)."""
    start = req.prompt.find("{")
    data: dict[str, Any] = {}
    if start >= 0:
        try:
            data, _ = json.JSONDecoder().raw_decode(req.prompt[start:])
        except json.JSONDecodeError:
            data = {}
    ticket: dict[str, Any] = data.get("ticket", data) if isinstance(data, dict) else {}
    return ticket


def classify(req: ChatRequest, tickets: int = 2000) -> dict[str, Any]:
    """Label a ticket the way its generator meant it."""
    ticket = _ticket(req)
    category, urgency = ground_truth(tickets).get(ticket.get("id", ""), ("other", "normal"))
    needs_human = category == "security" or urgency == "critical"
    return {
        "category": category,
        "urgency": urgency,
        "needs_human": needs_human,
        "reason": f"The customer writes: \"{ticket.get('subject', '')}\".",
    }


def draft(req: ChatRequest) -> dict[str, Any]:
    """A polite reply in the customer's language."""
    ticket = _ticket(req)
    subject_t, body_t = _REPLIES.get(ticket.get("language", "en"), _REPLIES["en"])
    name = str(ticket.get("customer", "")).split(" ")[0] or "there"
    subject = ticket.get("subject", "your request")
    return {"subject": subject_t.format(subject=subject),
            "body": body_t.format(subject=subject, name=name)}


def plan(req: ChatRequest) -> dict[str, Any]:
    """First an invalid plan, then, asked to repair it, the good one (a re-plan of the
    brief gets its replacement fragment)."""
    if "Re-plan part of this goal" in req.prompt:
        return BRIEF_REPLAN
    if PIX_GOAL in req.prompt:
        return PIX_FIRST_PLAN if req.repairs == 0 else PIX_PLAN
    return INVALID_BRIEF_PLAN if req.repairs == 0 else BRIEF_PLAN


def research(req: ChatRequest) -> dict[str, Any]:
    topic = _ticket(req).get("topic", "the topic")
    return {
        "topic": topic,
        "findings": [
            {"statement": f"{topic}: the segment is growing faster than card payments overall.",
             "source": "general knowledge", "confidence": "medium"},
            {"statement": f"{topic}: pricing pressure is strongest for large merchants.",
             "source": "general knowledge", "confidence": "medium"},
        ],
        "open_questions": [f"Current market share figures for {topic}"],
    }


def analyse(req: ChatRequest) -> dict[str, Any]:
    question = _ticket(req).get("question", "the question")
    return {
        "question": question,
        "factors": [
            {"name": "Regulation", "evidence": "PSD2 opened bank APIs to third parties.",
             "strength": "high"},
            {"name": "Merchant fees", "evidence": "A2A rails undercut card interchange.",
             "strength": "medium"},
        ],
        "gaps": ["No country-level volume data in the research."],
        "conclusion": f"On '{question}': the shift is real but uneven across countries.",
        "confidence": "medium",
    }


def write_brief(req: ChatRequest) -> dict[str, Any]:
    return {
        "title": "European payments: where the money moves next",
        "summary": "Card acquiring still dominates European payments. Account-to-account "
                   "rails and wallets are taking share where regulation and fees favour them. "
                   "We should partner on A2A before building our own.",
        "points": [
            "Acquirers compete mostly on price for large merchants.",
            "Open banking adoption is highest in the UK and the Nordics.",
            "Wallets grow fastest on mobile checkout.",
        ],
        "risks": ["PSD3 timing may slip.", "Market shares are estimates."],
        "next_steps": ["Shortlist two A2A partners this quarter."],
    }


def _release(kind: str) -> Callable[[ChatRequest], dict[str, Any]]:
    fixed: dict[str, dict[str, Any]] = {
        "migrate_db": {
            "statements": ["ALTER TABLE invoices ADD COLUMN pdf_url text",
                           "CREATE INDEX CONCURRENTLY invoices_pdf_url ON invoices (pdf_url)"],
            "reversible": True,
            "rollback": ["DROP INDEX CONCURRENTLY invoices_pdf_url",
                         "ALTER TABLE invoices DROP COLUMN pdf_url"],
            "locks": ["invoices: brief ACCESS EXCLUSIVE for the nullable column"],
            "risks": ["none for the deployed version: the column is nullable"],
        },
        "deploy_app": {
            "preconditions": ["migration applied", "image billing-api:2.4.0 built"],
            "steps": ["drain one pod", "roll out 2.4.0 to 10 %", "roll out to 100 %"],
            "health_checks": ["5xx rate below 0.5 % for 5 minutes after each step"],
            "rollback": ["roll back the deployment to 2.3.x"],
        },
        "smoke_test": {"checks": [
            {"name": "health", "request": "GET /healthz", "expected": "200",
             "critical": True},
            {"name": "pdf export", "request": "GET /invoices/TEST-1/pdf",
             "expected": "200 application/pdf", "critical": True},
        ]},
    }
    return lambda req: fixed[kind]


def answers(tickets: int = 2000) -> dict[str, Callable[[ChatRequest], Any]]:
    """Schema name -> answerer, for every kind of the three examples and the planner."""
    return {
        "classify_ticket": lambda req: classify(req, tickets),
        "draft_reply": draft,
        "plan": plan,
        "research": research,
        "analyse": analyse,
        "write_brief": write_brief,
        "migrate_db": _release("migrate_db"),
        "deploy_app": _release("deploy_app"),
        "smoke_test": _release("smoke_test"),
    }
