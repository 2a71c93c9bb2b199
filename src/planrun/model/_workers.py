"""Model-backed workers: a prompt file, a payload model and a result model make a kind.

A :class:`ModelWorker` is a handler like any function: it renders its prompt from the
payload (and the results of the tasks it depends on), calls the model with the result
model as the response schema, and returns the validated result. It finds the model and the
usage meter in ``ctx.extras`` (put there by :func:`planrun.plan_and_run`) unless it was given
its own model.

    registry.register(
        "classify_ticket",
        ModelWorker("classify_ticket", result=Classification),
        payload=Ticket,
        description="Label one support ticket with category, urgency and needs_human",
    )
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from planrun.core import ConfigError, PermanentError, TaskContext, UsageError
from planrun.model._prompts import PromptLibrary
from planrun.model._schema import check_max_tokens

if TYPE_CHECKING:
    from planrun.model._client import Model
    from planrun.model._usage import Usage

__all__ = ["ModelWorker", "reask_message"]


def reask_message(errors: str) -> str:
    """The user message that shows the model why its answer failed the result model."""
    return (
        "That answer does not match the required JSON schema. Validation errors:\n"
        f"{errors}\n\nReply again with the complete corrected JSON object only."
    )


class ModelWorker:
    """A handler that asks a model, with a prompt template, for a structured result.

    Args:
        prompt: template name in the prompt library (``classify_ticket`` for
            ``prompts/classify_ticket.md``).
        result: pydantic model of the reply; the call uses it as a strict JSON Schema.
        prompts: where templates come from (default: the ones shipped with planrun).
        system: an optional system message.
        model: a model of its own; default the run's (``ctx.extras["model"]``).
        reask: how many times a reply that fails ``result`` is sent back to the model with
            its validation errors (default 1; 0 fails at once). Each re-ask is a model call
            like any other: metered, budgeted and rate limited. When the last answer still
            fails, the task is dead with that answer's errors.
        inputs: the result models this worker reads from its dependencies (its
            ``$inputs``): the kind's contract then asks that each comes from at least one
            dependency, derived from the registry's result models (see
            :class:`~planrun.core.KindSpec`).
        max_tokens: the output bound of this kind's calls (default: the Model's
            ``max_tokens``, else derived from ``result``'s schema; see
            :func:`~planrun.model.output_bound`). It is what the rate limiter and the budget
            reserve beside the prompt, so a bound that fits the answer lets more calls go.

    The template sees ``$payload`` (the whole payload as JSON), each payload field by
    name, ``$inputs`` (results of the dependencies, by task id, as JSON) and ``$task_id``.
    """

    def __init__(
        self,
        prompt: str,
        *,
        result: type[BaseModel],
        prompts: PromptLibrary | None = None,
        system: str | None = None,
        model: Model | None = None,
        reask: int = 1,
        inputs: Sequence[type[BaseModel]] | type[BaseModel] = (),
        max_tokens: int | None = None,
    ) -> None:
        if not isinstance(reask, int) or reask < 0:
            raise UsageError(f"reask must be a whole number >= 0, got {reask!r}")
        self.max_tokens = check_max_tokens(max_tokens, "ModelWorker")
        self.reask = reask
        self.input_models: tuple[type[BaseModel], ...] = (
            (inputs,) if isinstance(inputs, type) else tuple(inputs))
        self.prompt = prompt
        self.result_model = result
        self.prompts = prompts or PromptLibrary()
        self.system = system
        self.model = model
        self.prompts.get(prompt)  # fail at registration, not mid-run, when it is missing

    def __repr__(self) -> str:
        return f"ModelWorker({self.prompt!r}, result={self.result_model.__name__})"

    def render_variables(self, payload: Any, ctx: TaskContext) -> dict[str, Any]:
        """The variables the template is rendered with."""
        fields: Mapping[str, Any]
        if isinstance(payload, BaseModel):
            fields = payload.model_dump(mode="json")
        elif isinstance(payload, Mapping):
            fields = payload
        else:
            fields = {}
        return {**fields, "payload": payload, "inputs": dict(ctx.inputs), "task_id": ctx.task_id}

    async def __call__(self, payload: Any, ctx: TaskContext) -> BaseModel:
        model: Model | None = self.model or ctx.extras.get("model")
        if model is None:
            raise ConfigError(f"kind {ctx.kind!r} needs a model: pass model= to plan_and_run")
        meter: Usage | None = ctx.extras.get("usage")
        if meter is not None:
            meter = meter.scoped(f"task:{ctx.task_id}", f"worker:{ctx.worker}", f"kind:{ctx.kind}")
        template = self.prompts.get(self.prompt)
        rendered = template.render(**self.render_variables(payload, ctx))
        messages: list[dict[str, str]] = rendered.messages(self.system)
        # In a run with tiers, calls of one kind share a cache key: their common prefix.
        cache_key = f"{ctx.kind}:{template.version}" if ctx.tier is not None else None
        conversation = list(messages)
        errors = ""
        for attempt in range(self.reask + 1):
            ctx.heartbeat()
            key = ctx.idempotency_key
            completion = await model.complete(
                conversation,
                result_model=self.result_model,
                schema_name=ctx.kind,
                prompt_hash=rendered.hash,
                prompt_name=rendered.name,
                idempotency_key=f"{key}:reask-{attempt}" if key and attempt else key,
                meter=meter,
                max_tokens=self.max_tokens,
                validate=False,
                task=ctx,
                prompt_cache_key=cache_key,
            )
            ctx.heartbeat()
            try:
                return self._validated(completion.parsed)
            except ValueError as exc:  # pydantic's ValidationError is a ValueError
                errors = _errors(exc)
            answer = completion.text or json.dumps(completion.parsed)
            conversation = [
                *messages,
                {"role": "assistant", "content": answer},
                {"role": "user", "content": reask_message(errors)},
            ]
        raise PermanentError(
            f"the model's reply for {ctx.kind!r} does not match {self.result_model.__name__} "
            f"after {self.reask + 1} attempt(s): {errors}"
        )

    def _validated(self, parsed: Any) -> BaseModel:
        if parsed is None:
            raise ValueError("the reply is not valid JSON")
        return self.result_model.model_validate(parsed)


def _errors(exc: ValueError) -> str:
    if isinstance(exc, ValidationError):
        return "\n".join(
            f"- {'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in exc.errors()
        )
    return f"- {exc}"
