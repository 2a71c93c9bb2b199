"""Decomposer: a prose goal becomes a validated plan, or an error with the evidence.

The model is asked for a plan with the plan schema generated from the registry as its
response format, so under strict structured output it cannot name a kind that does not
exist. Its answer is still validated by the core (dependencies, payloads, bounds,
contracts). When it is invalid, the core's code repairs (:func:`planrun.core.repair_plan`)
first fix what the registry settles without a guess; a plan they finish is accepted with
no further call. Otherwise the model is shown its previous answer and the problem list,
and asked again, at most ``repair_attempts`` times (``repair="model"``: the model alone
repairs). The conversation never grows beyond the original request plus the last attempt,
and transport errors are never pasted into it: they propagate.

The accepted plan carries its repairs in order (:attr:`Plan.repairs`): a ``"model"`` one
per problem the model was shown before the reply that was accepted, then the ``"code"``
ones applied to that reply.

Nothing is dispatched from an invalid plan: :func:`decompose` either returns a
:class:`~planrun.Plan` that validated or raises :class:`~planrun.InvalidPlan`
with every problem of the last attempt and the raw output of each attempt.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from planrun.core import (
    TRUNCATED,
    InvalidPlan,
    Plan,
    Problem,
    Registry,
    Repair,
    SpawnRequest,
    UsageError,
    plan_schema,
    repair_plan,
    spawn_id,
)
from planrun.core.scheduling import Fragment
from planrun.model._errors import OutputTruncated
from planrun.model._prompts import PromptLibrary, RenderedPrompt, describe_kinds
from planrun.model._schema import check_max_tokens
from planrun.obs import tracing
from planrun.runtime import RealClock, run_blocking

if TYPE_CHECKING:
    from planrun.core.scheduling import ReplanRequest
    from planrun.model._client import Model
    from planrun.model._usage import Usage

__all__ = [
    "PLAN_TOKENS_PER_TASK",
    "REPAIR_MODES",
    "RepairMode",
    "adecompose",
    "check_repair",
    "decompose",
    "plan_bound",
    "repair_message",
    "replan_goal",
    "replanner",
]

PLAN_TOKENS_PER_TASK = 160
"""Completion tokens a plan may take per task (a kind, a payload, its dependencies)."""


REPAIR_MODES: tuple[str, ...] = ("code", "model")
"""``repair="code"`` (the default): code repairs, then the model for what they leave;
``"model"``: every repair is asked of the model."""

RepairMode = Literal["code", "model"]


def plan_bound(max_tasks: int) -> int:
    """The output bound of a plan of at most ``max_tasks`` tasks: the decomposer's default.

    It stops a runaway reply (a small model repeating one task) at the size of the largest
    plan the run accepts, instead of at the model's context."""
    return PLAN_TOKENS_PER_TASK * max_tasks + 128


def _truncated(cut: OutputTruncated) -> Problem:
    return Problem(TRUNCATED, None, (
        f"the reply was cut at its output bound of {cut.bound} tokens before the plan ended; "
        "return a shorter plan: fewer tasks, shorter payloads, no repeated items"))


def repair_message(problems: Sequence[Problem]) -> str:
    """The user message that asks for a corrected plan, listing each problem by code."""
    lines = [
        "That plan is invalid. Problems found (code, task index, what to fix):",
        *(f"- {p.code} (task {'-' if p.task is None else p.task}): {p.message}" for p in problems),
        "",
        "Return the complete corrected plan as JSON only, following every rule above.",
    ]
    return "\n".join(lines)


@tracing.traced_decompose
async def adecompose(
    goal: str,
    registry: Registry,
    model: Model,
    *,
    min_tasks: int = 3,
    max_tasks: int = 8,
    repair_attempts: int = 2,
    prompts: PromptLibrary | None = None,
    meter: Usage | None = None,
    max_tokens: int | None = None,
    repair: RepairMode = "code",
) -> Plan:
    """Ask ``model`` to break ``goal`` into a plan over the kinds of ``registry``.

    Each call's output bound is ``max_tokens``, else the Model's ``max_tokens``, else
    :func:`plan_bound` of ``max_tasks``. A reply cut at it raises
    :class:`~planrun.model.OutputTruncated`. ``repair="model"`` turns the code repairs off
    (every fix is asked of the model). The plan's :attr:`~planrun.Plan.repairs` say what was
    fixed, by whom, in order.

    Raises:
        InvalidPlan: still invalid after ``repair_attempts`` repairs; ``problems`` are the
            last attempt's, ``raw_outputs`` every attempt's text.
        TransientError, PermanentError, BudgetExceeded: the model call itself failed.
    """
    _check_arguments(goal, repair_attempts, repair, max_tokens)
    library = prompts or PromptLibrary()
    rendered = library.render("decompose", goal=goal.strip(), kinds=describe_kinds(registry),
                              min_tasks=min_tasks, max_tasks=max_tasks)
    # The model is asked for the tasks only: the goal is the user's, never a model's
    # rewording of it.
    schema = plan_schema(registry, min_tasks=min_tasks, max_tasks=max_tasks, goal=False)
    request = {"role": "user", "content": rendered.text}
    scoped = meter.scoped("decompose") if meter is not None else None
    bound = max_tokens or getattr(model, "max_tokens", None) or plan_bound(max_tasks)
    messages: list[dict[str, str]] = [request]
    outputs: list[str] = []
    history: list[list[Problem]] = []
    parse = _parser(registry, min_tasks, max_tasks, code_repairs=repair == "code")
    for _ in range(repair_attempts + 1):
        plan, answer, problems = await _attempt(
            model, messages, schema, rendered, scoped, bound, parse)
        if plan is not None:
            return Plan(goal.strip(), plan.tasks, _repairs(history, plan.repairs))
        outputs.append(answer)
        history.append(problems)
        tracing.plan_problems(len(history), problems)
        messages = [
            request,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": repair_message(problems)},
        ]
    raise InvalidPlan(history[-1], raw_outputs=outputs, attempts=history,
                      message=_failure_message(history, len(outputs)))


def _check_arguments(goal: object, repair_attempts: int, repair: object,
                     max_tokens: int | None) -> None:
    if not isinstance(goal, str) or not goal.strip():
        raise UsageError("a goal must be a non-empty string")
    if repair_attempts < 0:
        raise UsageError("repair_attempts must be >= 0")
    check_repair(repair)
    check_max_tokens(max_tokens, "decompose")


def check_repair(repair: object) -> None:
    """Refuse a repair mode that is not one of :data:`REPAIR_MODES` (before any model call).

    Raises:
        UsageError: naming the modes.
    """
    if repair not in REPAIR_MODES:
        raise UsageError(f"repair must be one of {list(REPAIR_MODES)}, got {repair!r}")


def _parser(registry: Registry, min_tasks: int, max_tasks: int, *,
            code_repairs: bool) -> Callable[[Any], Plan]:
    """What judges a reply: the strict validator, then (``code_repairs``) the core's code
    repairs. It raises the reply's own :class:`InvalidPlan` when the model is needed, so
    the model is asked as without code repairs: its answer and every problem in it."""

    def parse(candidate: Any) -> Plan:
        try:
            return Plan.parse(candidate, registry, min_tasks=min_tasks, max_tasks=max_tasks)
        except InvalidPlan:
            if not code_repairs:
                raise
            repaired = repair_plan(candidate, registry, min_tasks=min_tasks,
                                   max_tasks=max_tasks).plan
            if repaired is None:
                raise
            return repaired

    return parse


def _repairs(history: Sequence[Sequence[Problem]], code: Sequence[Repair]) -> tuple[Repair, ...]:
    """The accepted plan's repairs: each problem shown to the model, by the reply that
    answered it, then the code repairs of the accepted reply."""
    accepted = len(history) + 1
    asked = [Repair("model", p.code, p.task, p.message, attempt=n)
             for n, problems in enumerate(history, 2) for p in problems]
    return (*asked, *(dataclasses.replace(r, attempt=accepted) for r in code))


async def _attempt(model: Model, messages: list[dict[str, str]], schema: dict[str, Any],
                   rendered: RenderedPrompt, meter: Usage | None, bound: int,
                   parse: Callable[[Any], Plan]) -> tuple[Plan | None, str, list[Problem]]:
    """One request for a plan: the plan it gave, else its answer and what is wrong with it."""
    try:
        completion = await model.complete(
            messages, result_model=schema, schema_name="plan", prompt_hash=rendered.hash,
            prompt_name=rendered.name, meter=meter, max_tokens=bound, validate=False)
    except OutputTruncated as cut:  # a plan that does not fit: ask for a shorter one
        return None, cut.text, [_truncated(cut)]
    candidate: Any = completion.parsed if completion.parsed is not None else completion.text
    try:
        return parse(candidate), completion.text, []
    except InvalidPlan as exc:
        return None, completion.text or json.dumps(candidate), exc.problems


def decompose(
    goal: str,
    registry: Registry,
    model: Model,
    *,
    min_tasks: int = 3,
    max_tasks: int = 8,
    repair_attempts: int = 2,
    prompts: PromptLibrary | None = None,
    meter: Usage | None = None,
    max_tokens: int | None = None,
    repair: RepairMode = "code",
) -> Plan:
    """Synchronous :func:`adecompose` (on a private thread inside a running loop)."""
    return run_blocking(
        RealClock(),
        lambda: adecompose(
            goal, registry, model, min_tasks=min_tasks, max_tasks=max_tasks,
            repair_attempts=repair_attempts, prompts=prompts, meter=meter,
            max_tokens=max_tokens, repair=repair,
        ),
    )


def replan_goal(goal: str, request: ReplanRequest, *, max_chars: int = 4000) -> str:
    """The goal the decomposer is given to re-plan a dead task's part of ``goal``."""
    dead = request.dead
    results = json.dumps(dict(request.results), default=str, sort_keys=True)
    if len(results) > max_chars:
        results = results[:max_chars] + " ..."
    replaced = ", ".join(f"{t.id} ({t.kind} {json.dumps(dict(t.payload), sort_keys=True)})"
                         for t in request.cancelled) or "none"
    return (
        f"{goal.strip()}\n\n"
        f"Re-plan part of this goal. Task {dead.id} ({dead.kind} "
        f"{json.dumps(dict(dead.payload), sort_keys=True)}) failed for good: {dead.error}. "
        f"Its dependents were cancelled: {replaced}. Results so far: {results}. "
        "Plan only the tasks that replace the failed task and its cancelled dependents, "
        "another way if the failure says the same way cannot work."
    )


def replanner(
    goal: str,
    registry: Registry,
    model: Model,
    *,
    min_tasks: int = 1,
    max_tasks: int = 8,
    repair_attempts: int = 2,
    prompts: PromptLibrary | None = None,
    meter: Usage | None = None,
    repair: RepairMode = "code",
) -> Callable[[ReplanRequest], Awaitable[list[SpawnRequest]]]:
    """A replanner for ``Supervisor(on_dead="replan", replanner=...)`` over the decomposer.

    Each replan is one decomposition (with its repair loop, charged to ``meter``, so to the
    run's budget, and ``repair`` as :func:`adecompose` takes it) of :func:`replan_goal`;
    the fragment's first tasks depend on what the dead task depended on, the others on
    earlier tasks of the fragment. The answer is a
    :class:`~planrun.core.scheduling.Fragment`: the run records the repairs of its plan as
    ``repaired`` events on its tasks.
    """

    async def replan(request: ReplanRequest) -> list[SpawnRequest]:
        plan = await adecompose(
            replan_goal(goal, request), registry, model, min_tasks=min_tasks,
            max_tasks=max_tasks, repair_attempts=repair_attempts, prompts=prompts, meter=meter,
            repair=repair)
        return Fragment(fragment_of(plan, request), plan.repairs)

    return replan


def fragment_of(plan: Plan, request: ReplanRequest) -> list[SpawnRequest]:
    """A plan as the fragment that replaces the dead task and its cancelled dependents.

    Ids are ``"<dead>/<n>"``. Its first tasks wait for what the dead task waited for; its
    last ones (no task of the fragment waits for them) also get what the replaced tasks
    had from the rest of the run (their completed dependencies), so a replacement of the
    final step still sees every input the original would have seen.
    """
    dead = request.dead
    replaced = {dead.id, *(t.id for t in request.cancelled)}
    kept = tuple(dict.fromkeys(d for t in request.cancelled for d in t.depends_on
                               if d not in replaced and d in request.results))
    used = {d for t in plan.tasks for d in t.depends_on}
    out = []
    for i, t in enumerate(plan.tasks):
        deps = tuple(spawn_id(dead.id, d) for d in t.depends_on) or dead.depends_on
        if i not in used:
            deps = tuple(dict.fromkeys(deps + kept))
        out.append(SpawnRequest(t.kind, dict(t.payload), deps))
    return out


def _failure_message(history: Sequence[Sequence[Problem]], attempts: int) -> str:
    last = history[-1]
    lines = [f"the model's plan was still invalid after {attempts} attempt(s); last problems:"]
    lines += [f"  {p}" for p in last]
    return "\n".join(lines)
