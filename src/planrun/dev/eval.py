"""Measure decomposition prompts over a set of goals: accepted plans, cost, problems, closeness.

A goal set is a JSON Lines file, one goal a line::

    {"id": "brief-eu", "goal": "produce a competitive brief ...", "tags": ["brief"],
     "registry": "planrun.examples.brief:app",
     "expected_kinds": ["research", "analyse", "write_brief"],
     "reference": {"goal": "...", "tasks": [...]}}

``registry`` names the kinds the goal is planned over: an app or registry
(``module:attribute``) or a TaskBench tool graph (``taskbench:<folder>``, relative to the
goal file); ``--app`` / ``registry=`` gives a default for lines that name none.
``expected_kinds`` and ``reference`` are optional.

:func:`evaluate` runs the real decomposer (:func:`planrun.adecompose`) on every goal for
every prompt version (a :class:`~planrun.model.PromptLibrary`, a folder, or a ``decompose.md``
file) and reports, per version: the share of goals that end with an accepted plan (shape
and contracts: the plan a run would use), and from the first reply; the model calls and
tokens per accepted plan; the model repairs and the code repairs; how often a reply as the
model wrote it had a valid shape; the problem codes seen (with counts); the mean plan
size, tokens and cost; and, against a reference plan, how close the plan is:
node (kind) and link (dependency edge between kinds) precision, recall and F1, averaged
over goals as TaskBench scores its node and link F1. Model calls are recorded and replayed
like every other (``record=`` / ``replay=``); a prompt edited since its recording is a
:class:`~planrun.testing.FixtureMiss` naming the template, never a network call.

    report = evaluate("examples", {"default": None, "strict": "strict"}, replay="examples")
    print(report.table())
    report.compare("default", "strict")

Shipped goal sets (``examples``, ``taskbench``), their cassettes and the ``strict`` prompt
variant live in :mod:`planrun`'s ``evals`` data folder (:func:`shipped`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from planrun.core import (
    CONTRACT_CODES,
    TRUNCATED,
    InvalidPlan,
    PermanentError,
    Plan,
    Registry,
    UsageError,
)
from planrun.model import OutputTruncated, PromptLibrary

if TYPE_CHECKING:
    from planrun.model import Completion, Model, PriceTable

__all__ = [
    "EVALS_DIR",
    "EvalReport",
    "Goal",
    "GoalOutcome",
    "Scores",
    "VersionReport",
    "aevaluate",
    "evaluate",
    "load_goals",
    "prompt_versions",
    "score_plan",
    "shipped",
]

EVALS_DIR = Path(__file__).resolve().parent / "evals"
"""The shipped goal sets (``<name>.jsonl``), cassettes (``cassettes/<name>.json``) and
prompt variants (``prompts/<name>/``)."""

DEFAULT_VERSION = "default"


# ---- goals ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Goal:
    """One line of a goal set."""

    id: str
    goal: str
    registry: Registry
    tags: tuple[str, ...] = ()
    expected_kinds: tuple[str, ...] | None = None
    reference: Mapping[str, Any] | None = None


def shipped(name: str) -> tuple[Path, Path]:
    """The goal file and cassette of a shipped goal set (``examples`` or ``taskbench``)."""
    goals = EVALS_DIR / f"{name}.jsonl"
    if not goals.is_file():
        have = sorted(p.stem for p in EVALS_DIR.glob("*.jsonl"))
        raise UsageError(f"no shipped goal set {name!r}; have {have}")
    return goals, EVALS_DIR / "cassettes" / f"{name}.json"


def _goal_file(source: str | os.PathLike[str]) -> Path:
    path = Path(source)
    if path.is_file():
        return path
    if isinstance(source, str) and "/" not in source and not source.endswith(".jsonl"):
        return shipped(source)[0]
    raise UsageError(f"no goal file {str(source)!r}")


def _registry(ref: str, base: Path, cache: dict[str, Registry]) -> Registry:
    if ref in cache:
        return cache[ref]
    if ref.startswith("taskbench:"):
        from planrun.dev.taskbench import load_tool_graph

        folder = base / ref.split(":", 1)[1]
        if not folder.is_dir():
            raise UsageError(f"no TaskBench tool graph folder {str(folder)!r}")
        found = load_tool_graph(folder)
    else:
        from planrun._facade import load_app

        found = load_app(ref).registry
    cache[ref] = found
    return found


def load_goals(
    source: str | os.PathLike[str], *, registry: Registry | str | None = None
) -> list[Goal]:
    """Read a goal set (a path, or the name of a shipped one); every line is checked.

    Raises:
        UsageError: a line is not JSON, has no goal, names no registry (and none is
            given), or repeats an id; the message names the line.
    """
    path = _goal_file(source)
    cache: dict[str, Registry] = {}
    goals: list[Goal] = []
    seen: set[str] = set()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(data, dict) or not isinstance(data.get("goal"), str):
            raise UsageError(f"{where}: a goal line needs a \"goal\" string")
        ref = data.get("registry")
        if isinstance(ref, str):
            kinds = _registry(ref, path.parent, cache)
        elif isinstance(registry, Registry):
            kinds = registry
        elif isinstance(registry, str):
            kinds = _registry(registry, path.parent, cache)
        else:
            raise UsageError(f"{where}: no \"registry\" and no --app given")
        goal_id = str(data.get("id") or f"goal-{number}")
        if goal_id in seen:
            raise UsageError(f"{where}: id {goal_id!r} is used twice")
        seen.add(goal_id)
        expected = data.get("expected_kinds")
        goals.append(Goal(
            goal_id, data["goal"], kinds, tuple(str(t) for t in data.get("tags") or ()),
            tuple(str(k) for k in expected) if isinstance(expected, list) else None,
            data.get("reference") if isinstance(data.get("reference"), dict) else None,
        ))
    if not goals:
        raise UsageError(f"{path}: no goals")
    return goals


# ---- prompt versions --------------------------------------------------------------------------


PromptSource = PromptLibrary | str | os.PathLike[str] | None


def _library(source: PromptSource, stack: ExitStack) -> PromptLibrary:
    if source is None or source == DEFAULT_VERSION:
        return PromptLibrary()
    if isinstance(source, PromptLibrary):
        return source
    path = Path(source)
    if not path.exists() and isinstance(source, str) and (EVALS_DIR / "prompts" / source).is_dir():
        path = EVALS_DIR / "prompts" / source
    if path.is_dir():
        return PromptLibrary(path)
    if path.is_file():  # one template file: it is the decomposition prompt
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        shutil.copyfile(path, folder / "decompose.md")
        return PromptLibrary(folder)
    raise UsageError(f"no prompt folder or file {str(source)!r}")


def prompt_versions(specs: Sequence[str]) -> dict[str, str | None]:
    """``NAME=PATH`` or ``NAME`` (a shipped variant, or ``default``) -> name: source."""
    versions: dict[str, str | None] = {}
    for spec in specs or [DEFAULT_VERSION]:
        name, _, source = spec.partition("=")
        if not name:
            raise UsageError(f"--prompts wants NAME=PATH or NAME, got {spec!r}")
        if name in versions:
            raise UsageError(f"prompt version {name!r} is given twice")
        versions[name] = source or (None if name == DEFAULT_VERSION else name)
    return versions


# ---- scoring ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scores:
    """Precision, recall and F1 of one comparison (None when there is nothing to compare)."""

    precision: float
    recall: float
    f1: float

    @classmethod
    def of(cls, predicted: Counter[Any], gold: Counter[Any]) -> Scores | None:
        """Multiset overlap of ``predicted`` and ``gold``; None when both are empty."""
        if not predicted and not gold:
            return None
        hits = sum((predicted & gold).values())
        p = hits / sum(predicted.values()) if predicted else 0.0
        r = hits / sum(gold.values()) if gold else 0.0
        return cls(p, r, 2 * p * r / (p + r) if p + r else 0.0)

    def to_dict(self) -> dict[str, float]:
        """JSON-ready form, unrounded (a continued evaluation reads it back exactly)."""
        return {"precision": self.precision, "recall": self.recall, "f1": self.f1}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Scores | None:
        """The scores :meth:`to_dict` wrote (None stays None)."""
        if data is None:
            return None
        return cls(float(data["precision"]), float(data["recall"]), float(data["f1"]))


def _nodes_and_links(document: Mapping[str, Any]) -> tuple[Counter[str], Counter[tuple[str, str]]]:
    tasks = list(document.get("tasks") or [])
    ids = {str(t.get("id", i)): i for i, t in enumerate(tasks)}
    kinds = [str(t.get("kind")) for t in tasks]
    links: Counter[tuple[str, str]] = Counter()
    for i, task in enumerate(tasks):
        for dep in task.get("depends_on") or []:
            j = dep if isinstance(dep, int) else ids.get(str(dep))
            if isinstance(j, int) and 0 <= j < len(kinds):
                links[kinds[j], kinds[i]] += 1
    return Counter(kinds), links


def score_plan(
    plan: Plan | Mapping[str, Any] | None, reference: Mapping[str, Any]
) -> tuple[Scores | None, Scores | None]:
    """Node and link scores of ``plan`` against ``reference`` (TaskBench's node/link F1).

    Nodes are the plan's kinds and links its dependency edges as (kind before, kind
    after) pairs, both counted as multisets. No plan scores zero against a non-empty
    reference.
    """
    document = plan.to_document() if isinstance(plan, Plan) else (plan or {"tasks": []})
    nodes, links = _nodes_and_links(document)
    gold_nodes, gold_links = _nodes_and_links(reference)
    return Scores.of(nodes, gold_nodes), Scores.of(links, gold_links)


# ---- outcomes and reports ---------------------------------------------------------------------


@dataclass(frozen=True)
class GoalOutcome:
    """What one prompt version made of one goal."""

    id: str
    tags: tuple[str, ...]
    accepted: bool
    """The decomposer accepted a plan (shape and contracts): the plan a run would use."""
    first_try: bool
    """It accepted the first reply (after code repairs, if any): one model call."""
    shaped: bool
    """Some reply, as the model wrote it, had a valid shape (schema, kinds, dependencies,
    payloads), its contracts aside: a diagnostic of the prompt, not the headline."""
    first_try_shaped: bool
    """The first reply, as the model wrote it, had a valid shape."""
    attempts: int
    """Model calls (round trips) the decomposer made."""
    problems: list[list[str]]
    """Problem codes of each reply that had any, in order (shape and contract codes), as
    the model wrote it: those the code repairs then fixed are counted here too."""
    plan: dict[str, Any] | None
    tokens: int
    cost_usd: float
    nodes: Scores | None = None
    links: Scores | None = None
    kinds: Scores | None = None
    """Kinds of the plan against ``expected_kinds`` (when given)."""
    error: str | None = None
    code_repairs: tuple[str, ...] = ()
    """The problem codes the code repairs fixed in the accepted plan, in order."""

    @property
    def repairs(self) -> int:
        """Model repairs: calls after the first."""
        return max(0, self.attempts - 1)

    @property
    def size(self) -> int:
        """Tasks in the plan (0 without one)."""
        return len(self.plan["tasks"]) if self.plan else 0

    def outcome(self) -> str:
        """One word: ``first_try``, ``repaired``, ``invalid`` or ``error``: whether the
        decomposer accepted a plan (shape and contracts), and whether from the first reply
        or after the model repaired it."""
        if self.error:
            return "error"
        if not self.accepted:
            return "invalid"
        return "first_try" if self.first_try else "repaired"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "id": self.id, "tags": list(self.tags), "outcome": self.outcome(),
            "accepted": self.accepted, "shaped": self.shaped,
            "first_try_shaped": self.first_try_shaped, "attempts": self.attempts,
            "repairs": self.repairs, "code_repairs": list(self.code_repairs),
            "problems": self.problems, "tasks": self.size, "tokens": self.tokens,
            "cost_usd": round(self.cost_usd, 6),
            "nodes": self.nodes.to_dict() if self.nodes else None,
            "links": self.links.to_dict() if self.links else None,
            "kinds": self.kinds.to_dict() if self.kinds else None,
            "error": self.error, "plan": self.plan,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GoalOutcome:
        """The outcome :meth:`to_dict` wrote (a line of ``--out``)."""
        return cls(
            str(data["id"]), tuple(data.get("tags") or ()), bool(data["accepted"]),
            data["outcome"] == "first_try", bool(data["shaped"]),
            bool(data["first_try_shaped"]), int(data["attempts"]),
            [list(codes) for codes in data.get("problems") or []], data.get("plan"),
            int(data["tokens"]), float(data["cost_usd"]), Scores.from_dict(data.get("nodes")),
            Scores.from_dict(data.get("links")), Scores.from_dict(data.get("kinds")),
            data.get("error"), tuple(data.get("code_repairs") or ()))


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _per(total: float, count: int) -> float | None:
    return round(total / count, 2) if count else None


def _counted(codes: Iterator[str] | list[str]) -> dict[str, int]:
    return dict(sorted(Counter(codes).items(), key=lambda kv: (-kv[1], kv[0])))


@dataclass(frozen=True)
class VersionReport:
    """One prompt version over the whole goal set."""

    name: str
    outcomes: list[GoalOutcome]

    def summary(self) -> dict[str, Any]:
        """The rates and means of this version (what the table shows).

        The headline is ``accepted_rate``: the share of goals that end with a plan the
        decomposer accepts (shape and contracts), the plan a run would use. What it cost
        is ``model_calls_per_accepted`` and ``tokens_per_accepted`` (every call and token
        of the set, failed goals included, over the plans accepted)."""
        out = self.outcomes
        n = len(out)
        every = [c for o in out for attempt in o.problems for c in attempt]
        accepted = [o for o in out if o.accepted]

        def mean_score(attr: str, part: str) -> float | None:
            scores = [getattr(getattr(o, attr), part) for o in out if getattr(o, attr)]
            value = _mean(scores)
            return None if value is None else round(value, 4)

        tokens = sum(o.tokens for o in out)
        return {
            "goals": n,
            "accepted_rate": round(len(accepted) / n, 4),
            "first_try_accepted_rate": round(sum(o.first_try for o in accepted) / n, 4),
            "model_calls_per_accepted": _per(sum(o.attempts for o in out), len(accepted)),
            "tokens_per_accepted": _per(tokens, len(accepted)),
            "mean_repairs": round(sum(o.repairs for o in out) / n, 4),
            "code_repairs": sum(len(o.code_repairs) for o in out),
            "code_repair_codes": _counted([c for o in out for c in o.code_repairs]),
            "shape_rate": round(sum(o.shaped for o in out) / n, 4),
            "first_try_shape_rate": round(sum(o.first_try_shaped for o in out) / n, 4),
            "problem_codes": _counted([c for c in every if c not in CONTRACT_CODES]),
            "contract_codes": _counted([c for c in every if c in CONTRACT_CODES]),
            "mean_tasks": round(_mean([o.size for o in accepted]) or 0.0, 4),
            "tokens": tokens,
            "cost_usd": round(sum(o.cost_usd for o in out), 6),
            "errors": sum(1 for o in out if o.error),
            "node_precision": mean_score("nodes", "precision"),
            "node_recall": mean_score("nodes", "recall"),
            "node_f1": mean_score("nodes", "f1"),
            "link_precision": mean_score("links", "precision"),
            "link_recall": mean_score("links", "recall"),
            "link_f1": mean_score("links", "f1"),
            "kind_f1": mean_score("kinds", "f1"),
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: the summary and every goal's outcome."""
        return {"name": self.name, **self.summary(),
                "outcomes": [o.to_dict() for o in self.outcomes]}


_ROWS = [
    ("goals", "goals", "{}"),
    ("accepted plan (shape and contracts)", "accepted_rate", "{:.0%}"),
    ("accepted from the first reply", "first_try_accepted_rate", "{:.0%}"),
    ("model calls per accepted plan", "model_calls_per_accepted", "{:.2f}"),
    ("tokens per accepted plan", "tokens_per_accepted", "{:,.0f}"),
    ("mean model repairs", "mean_repairs", "{:.2f}"),
    ("code repairs", "code_repairs", "{}"),
    ("first reply well-shaped", "first_try_shape_rate", "{:.0%}"),
    ("some reply well-shaped", "shape_rate", "{:.0%}"),
    ("mean tasks", "mean_tasks", "{:.2f}"),
    ("node F1", "node_f1", "{:.3f}"),
    ("link F1", "link_f1", "{:.3f}"),
    ("kind F1 (expected)", "kind_f1", "{:.3f}"),
    ("tokens", "tokens", "{}"),
    ("cost USD", "cost_usd", "{:.4f}"),
    ("errors", "errors", "{}"),
]


@dataclass(frozen=True)
class EvalReport:
    """Every prompt version's report over one goal set."""

    versions: dict[str, VersionReport]

    def __getitem__(self, name: str) -> VersionReport:
        try:
            return self.versions[name]
        except KeyError:
            raise UsageError(f"no prompt version {name!r}; have {list(self.versions)}") from None

    def summaries(self) -> dict[str, dict[str, Any]]:
        """Version name -> :meth:`VersionReport.summary`."""
        return {name: v.summary() for name, v in self.versions.items()}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``planrun eval --json``)."""
        return {"versions": {name: v.to_dict() for name, v in self.versions.items()}}

    def table(self) -> str:
        """The versions side by side, one metric a row, then the problem codes."""
        summaries = self.summaries()
        names = list(summaries)
        rows: list[list[str]] = [["", *names]]
        for label, key, fmt in _ROWS:
            rows.append([label, *("-" if s[key] is None else fmt.format(s[key])
                                  for s in summaries.values())])
        codes = sorted({c for s in summaries.values() for c in s["problem_codes"]})
        for code in codes:
            rows.append([f"problem {code}",
                         *(str(s["problem_codes"].get(code, 0)) for s in summaries.values())])
        broken = sorted({c for s in summaries.values() for c in s["contract_codes"]})
        for code in broken:
            rows.append([f"contract {code}",
                         *(str(s["contract_codes"].get(code, 0)) for s in summaries.values())])
        fixed = sorted({c for s in summaries.values() for c in s["code_repair_codes"]})
        for code in fixed:
            rows.append([f"code repaired {code}",
                         *(str(s["code_repair_codes"].get(code, 0))
                           for s in summaries.values())])
        widths = [max(len(r[i]) for r in rows) for i in range(len(names) + 1)]
        return "\n".join(
            "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                      for i, (cell, w) in enumerate(zip(row, widths, strict=True))).rstrip()
            for row in rows)

    def compare(self, a: str, b: str) -> list[dict[str, Any]]:
        """The goals whose outcome or plan differs between versions ``a`` and ``b``."""
        left = {o.id: o for o in self[a].outcomes}
        changed = []
        for right in self[b].outcomes:
            before = left.get(right.id)
            if before is None:
                continue
            plan_changed = _shape(before.plan) != _shape(right.plan)
            if before.outcome() == right.outcome() and not plan_changed:
                continue
            changed.append({
                "id": right.id, a: before.outcome(), b: right.outcome(),
                "plan_changed": plan_changed,
                "repairs": {a: before.repairs, b: right.repairs},
                "tasks": {a: before.size, b: right.size},
                "link_f1": {a: before.links.f1 if before.links else None,
                            b: right.links.f1 if right.links else None},
            })
        return changed


def _shape(plan: Mapping[str, Any] | None) -> Any:
    if not plan:
        return None
    return [(t["kind"], tuple(t.get("depends_on") or ()), json.dumps(t.get("payload"),
                                                                       sort_keys=True))
            for t in plan["tasks"]]


# ---- running ----------------------------------------------------------------------------------


class _Counting:
    """A model that remembers the replies of the decomposer's calls (one goal at a time)."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.max_tokens = model.max_tokens
        self.replies: list[Completion[Any] | OutputTruncated] = []

    async def complete(self, *args: Any, **kwargs: Any) -> Any:
        try:
            reply = await self.model.complete(*args, **kwargs)
        except OutputTruncated as cut:  # a reply too: the decomposer repairs it
            self.replies.append(cut)
            raise
        self.replies.append(reply)
        return reply


async def _one(
    goal: Goal, library: PromptLibrary, model: _Counting, options: Mapping[str, Any],
    prices: PriceTable | None,
) -> GoalOutcome:
    from planrun.model import Usage, adecompose

    meter = Usage(prices)
    model.replies.clear()
    plan: Plan | None = None
    error: str | None = None
    try:
        plan = await adecompose(goal.goal, goal.registry, model, prompts=library,  # type: ignore[arg-type]
                                meter=meter, **options)
    except InvalidPlan:
        pass
    except PermanentError as exc:  # this goal's request was refused: noted, the set goes on
        error = f"{type(exc).__name__}: {exc}"
    # A TransientError (the server unreachable or failing after the retries) propagates:
    # the evaluation stops, keeping what it wrote.
    problems = [_problems(reply, goal.registry, options) for reply in model.replies]
    invalid = [codes for codes in problems if codes]
    shaped = [not any(c not in CONTRACT_CODES for c in codes) for codes in problems]
    document = plan.to_document() if plan is not None else None
    nodes = links = kinds = None
    if goal.reference is not None:
        nodes, links = score_plan(plan, goal.reference)
    if goal.expected_kinds is not None:
        got = Counter(t["kind"] for t in document["tasks"]) if document else Counter()
        kinds = Scores.of(Counter(set(got)), Counter(set(goal.expected_kinds)))
    total = meter.total
    fixed = tuple(r.code for r in plan.repairs if r.by == "code") if plan is not None else ()
    return GoalOutcome(
        goal.id, goal.tags, plan is not None, plan is not None and len(model.replies) == 1,
        any(shaped), bool(shaped) and shaped[0],
        len(model.replies), invalid, document, total.total_tokens, total.cost_usd,
        nodes, links, kinds, error, fixed)


def _problems(reply: Any, registry: Registry, options: Mapping[str, Any]) -> list[str]:
    if isinstance(reply, OutputTruncated):
        return [TRUNCATED]
    candidate = reply.parsed if reply.parsed is not None else reply.text
    try:
        Plan.parse(candidate, registry, min_tasks=options["min_tasks"],
                   max_tasks=options["max_tasks"])
    except InvalidPlan as exc:
        return [p.code for p in exc.problems]
    return []


def _cassette(
    record: str | os.PathLike[str] | None, replay: str | os.PathLike[str] | None,
    command: str | None,
) -> AbstractContextManager[Any]:
    from planrun.dev import fixtures

    if record and replay:
        raise UsageError("record and replay cannot be used together")
    if replay:
        return fixtures.replay(_cassette_path(replay))
    if record:
        return fixtures.record(record, command=command)
    return nullcontext()


def _cassette_path(source: str | os.PathLike[str]) -> Path:
    from planrun.dev.fixtures import shipped_cassette

    path = Path(source)
    if path.is_file():
        return path
    if isinstance(source, str) and "/" not in source and not source.endswith(".json"):
        return shipped_cassette(source)
    raise UsageError(f"no cassette {str(source)!r}")


def evaluate(
    goals: str | os.PathLike[str] | Sequence[Goal],
    prompts: Mapping[str, PromptSource] | Sequence[str] | None = None,
    **options: Any,
) -> EvalReport:
    """Decompose every goal with every prompt version; see :func:`aevaluate`.

    Synchronous (on a private thread inside a running loop, as in a notebook).
    """
    from planrun.runtime import RealClock, run_blocking

    return run_blocking(RealClock(), lambda: aevaluate(goals, prompts, **options))


OnOutcome = Callable[[str, GoalOutcome, int, int], None]
"""Called as each outcome is measured: ``(version, outcome, done, total)``."""

DEFAULT_CONCURRENCY = 4
"""Goals decomposed at once by default (a local server's usual slot count)."""


async def aevaluate(
    goals: str | os.PathLike[str] | Sequence[Goal],
    prompts: Mapping[str, PromptSource] | Sequence[str] | None = None,
    *,
    model: Model | None = None,
    replay: str | os.PathLike[str] | None = None,
    record: str | os.PathLike[str] | None = None,
    registry: Registry | str | None = None,
    min_tasks: int = 1,
    max_tasks: int = 8,
    repair_attempts: int = 2,
    repair: str = "code",
    prices: PriceTable | None = None,
    command: str | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
    out: str | os.PathLike[str] | None = None,
    on_outcome: OnOutcome | None = None,
) -> EvalReport:
    """Decompose every goal with every prompt version and measure each version.

    Args:
        goals: a goal file, the name of a shipped set (``examples``, ``taskbench``), or
            :class:`Goal` objects.
        prompts: version name -> a :class:`PromptLibrary`, a folder, a ``decompose.md``
            file, a shipped variant name, or None (the shipped prompts); or ``NAME=PATH``
            strings. Default: the shipped prompts alone, as ``default``.
        model: the model (default: from the environment; under ``replay`` the cassette's);
            one passed in is not closed. Its limiter and budget hold for the whole run.
        replay, record: a cassette to answer from (a path or a shipped set's name; a
            request with no recording is a :class:`~planrun.testing.FixtureMiss`), or to write.
        registry: the kinds for goal lines that name none (an app ``module:attr``).
        min_tasks, max_tasks, repair_attempts, repair: as for :func:`planrun.decompose`;
            ``prices`` the price table; ``command`` the re-record command a recording keeps.
        concurrency: how many goals (of any version) are decomposed at once.
        out: a JSON Lines file each outcome is appended to as it is measured (``{"version":
            ..., **outcome}``); outcomes already in it are read back, not measured again.
        on_outcome: called as each outcome is measured (a progress bar).

    A refused request (a permanent error) is an ``error`` outcome and the set goes on; a
    server unreachable past the retries stops the evaluation (what was measured is in ``out``).
    """
    _check_concurrency(concurrency)
    items = _goal_list(goals, registry)
    versions = prompts if isinstance(prompts, Mapping) else prompt_versions(list(prompts or []))
    options = {"min_tasks": min_tasks, "max_tasks": max_tasks, "repair": repair,
               "repair_attempts": repair_attempts}
    measured = _read_out(out, versions, items) if out is not None else {}
    with ExitStack() as stack:
        sink = stack.enter_context(_open_out(out)) if out is not None else None
        cassette = stack.enter_context(_cassette(record, replay, command))
        chosen = model or (cassette.model() if replay else _default_model())
        libraries = {name: _library(source, stack) for name, source in versions.items()}
        try:
            await _measure(items, libraries, chosen, options, prices, concurrency=concurrency,
                           measured=measured, sink=sink, on_outcome=on_outcome)
        finally:
            if model is None:
                await chosen.aclose()
        return EvalReport({name: VersionReport(name, [measured[name, g.id] for g in items])
                           for name in versions})


def _goal_list(goals: str | os.PathLike[str] | Sequence[Goal],
               registry: Registry | str | None) -> list[Goal]:
    if isinstance(goals, Sequence) and not isinstance(goals, str):
        return list(goals)
    return load_goals(goals, registry=registry)


def _check_concurrency(concurrency: object) -> None:
    if not isinstance(concurrency, int) or concurrency < 1:
        raise UsageError(f"concurrency must be a whole number >= 1, got {concurrency!r}")


async def _measure(items: Sequence[Goal], libraries: Mapping[str, PromptLibrary],
                   model: Model, options: Mapping[str, Any], prices: PriceTable | None, *,
                   concurrency: int, measured: dict[tuple[str, str], GoalOutcome],
                   sink: IO[str] | None, on_outcome: OnOutcome | None) -> None:
    """Measure every goal of every version not in ``measured`` yet, ``concurrency`` at a
    time, noting each outcome as it comes."""
    todo = [(name, g) for name in libraries for g in items if (name, g.id) not in measured]
    total = len(libraries) * len(items)

    async def measure(name: str, goal: Goal) -> None:
        outcome = await _one(goal, libraries[name], _Counting(model), options, prices)
        measured[name, goal.id] = outcome
        _noted(sink, name, outcome)
        if on_outcome is not None:
            on_outcome(name, outcome, len(measured), total)

    await _at_most(concurrency, [functools.partial(measure, name, goal) for name, goal in todo])


def _noted(sink: IO[str] | None, version: str, outcome: GoalOutcome) -> None:
    """Append ``outcome`` to the outcomes file as it is measured (flushed at once)."""
    if sink is not None:
        sink.write(json.dumps({"version": version, **outcome.to_dict()}) + "\n")
        sink.flush()


async def _at_most(concurrency: int, work: Sequence[Callable[[], Awaitable[None]]]) -> None:
    """Run each of ``work``, ``concurrency`` at a time; the first failure cancels the rest
    and is raised."""
    gate = asyncio.Semaphore(concurrency)

    async def gated(one: Callable[[], Awaitable[None]]) -> None:
        async with gate:
            await one()

    tasks = [asyncio.ensure_future(gated(one)) for one in work]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _open_out(out: str | os.PathLike[str]) -> IO[str]:
    try:
        return open(out, "a", encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write the outcomes to {os.fspath(out)!r}: "
                         f"{exc.strerror or exc}") from None


def _read_out(out: str | os.PathLike[str], versions: Mapping[str, Any],
              items: Sequence[Goal]) -> dict[tuple[str, str], GoalOutcome]:
    """The outcomes an earlier, interrupted evaluation wrote to ``out`` (of these versions
    and goals); a line cut short by the interruption is passed over."""
    path = Path(out)
    if not path.is_file():
        return {}
    ids = {g.id for g in items}
    found: dict[tuple[str, str], GoalOutcome] = {}
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            outcome = GoalOutcome.from_dict(data)
        except (ValueError, KeyError, TypeError) as exc:
            if number == len(lines):
                continue  # the last line, cut short when the evaluation was stopped
            raise UsageError(f"{path}:{number}: not an eval outcome ({exc})") from None
        if data.get("version") in versions and outcome.id in ids:
            found[data["version"], outcome.id] = outcome
    return found


def _default_model() -> Model:
    from planrun.model import Model

    return Model()


def iter_changed(report: EvalReport, a: str, b: str) -> Iterator[str]:
    """Lines for a terminal: one per goal whose outcome or plan changed from ``a`` to ``b``."""
    for row in report.compare(a, b):
        plan = ", plan changed" if row["plan_changed"] else ""
        yield (f"{row['id']}: {row[a]} -> {row[b]} (repairs {row['repairs'][a]} -> "
               f"{row['repairs'][b]}, tasks {row['tasks'][a]} -> {row['tasks'][b]}{plan})")

