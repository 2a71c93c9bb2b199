"""What a plan will cost before it runs, with no model call: :func:`estimate_plan`.

Each task of a model-backed kind (a :class:`~planrun.model.ModelWorker`) is one call: its
prompt rendered from its payload as the run renders it, plus the response schema the call
sends, counted as a provider counts tokens (about four characters a token, and a few a
message); the results of the tasks it depends on, unknown before the run, count at their
expected size. Its output counts twice: as expected (:func:`~planrun.model.expected_output`,
a typical answer) and at its bound (what the call sends as ``max_completion_tokens``). The
cost follows at every allowed tier (flex and batch at the Batch API's price, priority at the
price table's priority figures), and the time the calls need at the run's rate limits.

Tasks added while the run goes on (spawned, replanned), re-asks and retries are not in it:
the estimate is of the plan as given.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from planrun.core import Plan, Registry, TaskContext, UsageError
from planrun.core.scheduling import check_tiers
from planrun.model._request import _Target
from planrun.model._schema import expected_output
from planrun.model._usage import PriceTable
from planrun.model._workers import ModelWorker

__all__ = ["Estimate", "TierCost", "estimate_plan", "provider_tokens"]

PROVIDER_CHARS_PER_TOKEN = 4
"""What a provider's tokenizer makes of English text and JSON, on average."""
PROVIDER_MESSAGE_TOKENS = 4
"""Tokens the chat format adds around each message (and once for the reply)."""


def provider_tokens(messages: Sequence[Mapping[str, Any]], extra_text: str = "") -> int:
    """The prompt tokens a provider counts for ``messages`` and ``extra_text`` (a response
    schema): an expected figure, where :func:`~planrun.model.estimate_tokens` is a high
    one."""
    chars = len(extra_text)
    for message in messages:
        content = message.get("content")
        chars += len(content) if isinstance(content, str) else len(json.dumps(content))
    return (math.ceil(chars / PROVIDER_CHARS_PER_TOKEN)
            + PROVIDER_MESSAGE_TOKENS * (len(messages) + 1))


@dataclass(frozen=True)
class TierCost:
    """The plan's cost at one tier: expected, and with every output at its bound."""

    cost_usd: float
    cost_usd_max: float


@dataclass(frozen=True)
class Estimate:
    """What a plan's model calls will use and cost, computed before the run."""

    model: str
    calls: int
    """Model calls: one per task of a model-backed kind."""
    prompt_tokens: int
    """Prompt tokens as the provider counts them, response schemas included."""
    output_tokens: int
    """Output tokens expected."""
    output_tokens_max: int
    """Output tokens with every answer at its bound."""
    tiers: Mapping[str, TierCost]
    """Cost at each allowed tier, cheapest first."""
    priced: bool
    """False when the price table does not know the model (every cost is then 0)."""
    rpm: float | None = None
    tpm: float | None = None
    time_s: float | None = None
    """Seconds the calls need at the rate limits (``rpm``, ``tpm``; None without one): the
    provider counts each request's prompt and output bound against ``tpm``."""
    by_kind: Mapping[str, int] = field(default_factory=dict)
    """Calls per kind."""

    @property
    def cheapest(self) -> tuple[str, TierCost]:
        """The allowed tier with the lowest expected cost, and its cost."""
        return min(self.tiers.items(), key=lambda item: item[1].cost_usd)

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` shape of ``planrun estimate``."""
        return {"model": self.model, "calls": self.calls, "by_kind": dict(self.by_kind),
                "tokens": {"prompt": self.prompt_tokens, "output": self.output_tokens,
                           "output_max": self.output_tokens_max},
                "tiers": {t: {"cost_usd": round(c.cost_usd, 6),
                              "cost_usd_max": round(c.cost_usd_max, 6)}
                          for t, c in self.tiers.items()},
                "priced": self.priced, "rpm": self.rpm, "tpm": self.tpm,
                "time_s": None if self.time_s is None else round(self.time_s, 3)}

    def summary(self) -> str:
        """A few lines for a person."""
        lines = [f"{self.calls} model call(s) on {self.model}: {self.prompt_tokens} prompt "
                 f"tokens, {self.output_tokens} output tokens expected "
                 f"({self.output_tokens_max} at their bounds)"]
        for tier, cost in self.tiers.items():
            lines.append(f"  {tier:<8} ${cost.cost_usd:.4f} expected, "
                         f"${cost.cost_usd_max:.4f} at most")
        if not self.priced:
            lines.append(f"  (no price for {self.model!r}: costs count as 0)")
        if self.time_s is not None:
            lines.append(f"  at least {self.time_s:.0f} s at the rate limits")
        return "\n".join(lines)


@dataclass
class _Sums:
    calls: int = 0
    prompt: int = 0
    output: int = 0
    bound: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)


def estimate_plan(plan: Plan, registry: Registry, *, model: str,
                  prices: PriceTable | None = None, tiers: Iterable[str] = (),
                  rpm: float | None = None, tpm: float | None = None,
                  handlers: Mapping[str, Any] | None = None) -> Estimate:
    """What ``plan``'s model calls on ``model`` will use and cost (see the module).

    ``tiers``: the tiers the run may use beside ``default`` (each priced); ``priority`` for a
    model the table knows without a priority price is a :class:`~planrun.core.UsageError`.
    ``handlers``: kind -> handler where a worker overrides the registry's."""
    table = prices or PriceTable()
    allowed = check_tiers(tiers)
    for tier in allowed:
        table.check_tier(model, tier)
    sums = _Sums()
    expected: dict[str, int] = {}
    for task in plan.to_tasks():
        spec = registry[task.kind]
        worker = (handlers or {}).get(task.kind) or spec.handler
        if not isinstance(worker, ModelWorker):
            continue
        target = _Target.of(worker.result_model, task.kind)
        expected[task.id] = expected_output(target.original)
        payload = (spec.payload_model.model_validate(dict(task.payload))
                   if spec.payload_model is not None else dict(task.payload))
        prompt = _prompt_tokens(worker, task.id, task.kind, payload, target)
        prompt += sum(expected.get(d, 0) for d in task.depends_on)
        sums.calls += 1
        sums.prompt += prompt
        sums.output += expected[task.id]
        sums.bound += worker.max_tokens or target.bound
        sums.by_kind[task.kind] = sums.by_kind.get(task.kind, 0) + 1
    costs = {tier: TierCost(table.cost(model, sums.prompt, 0, sums.output, tier=tier) or 0.0,
                            table.cost(model, sums.prompt, 0, sums.bound, tier=tier) or 0.0)
             for tier in allowed}
    return Estimate(model, sums.calls, sums.prompt, sums.output, sums.bound, costs,
                    model in table, rpm, tpm, _time_s(sums, rpm, tpm), sums.by_kind)


def _prompt_tokens(worker: ModelWorker, task_id: str, kind: str, payload: Any,
                   target: _Target) -> int:
    """The provider's count of the call's prompt: rendered as the run renders it (its
    dependencies' results empty), with the response format the call sends."""
    ctx = TaskContext(run_id="estimate", task_id=task_id, kind=kind, attempt=1,
                      worker="estimate", skill=1.0, payload=payload)
    try:
        rendered = worker.prompts.render(worker.prompt, **worker.render_variables(payload, ctx))
    except UsageError as exc:
        raise UsageError(f"task {task_id} ({kind}): {exc}") from None
    sent = {"type": "json_schema", "json_schema": {"name": target.name, "strict": True,
                                                   "schema": target.sent_schema(False)}}
    return provider_tokens(rendered.messages(worker.system), json.dumps(sent))


def _time_s(sums: _Sums, rpm: float | None, tpm: float | None) -> float | None:
    """Seconds the calls need at ``rpm`` and ``tpm`` (each request counted as its prompt
    plus its output bound, as a provider counts it)."""
    if rpm is None and tpm is None:
        return None
    by_requests = 60.0 * sums.calls / rpm if rpm else 0.0
    by_tokens = 60.0 * (sums.prompt + sums.bound) / tpm if tpm else 0.0
    return max(by_requests, by_tokens)
