"""Supervisor against peer boards, on the release scenario, audited from the ledger alone.

The release: ``migrate_db`` (skill db), ``deploy_app`` (deploy, needs the migration),
``smoke_test`` (qa, needs the deploy), listed out of order on purpose. Workers ``db-1``,
``deploy-1``, ``deploy-2`` and ``qa-1``; failure plans say how many times a worker fails a
task, so every run is deterministic.

Three systems run it:

* a naive peer board: each agent takes whatever of its skill it sees;
* a peer board with the protocol: check dependencies, claim atomically, retry failed work;
* the planrun supervisor (``on_dead="abort_run"``: a release stops rather than deploying onto
  an unmigrated database).

The peer board works in rounds: every agent picks from the board, then all picks run, which
models agents deciding before they see each other's results.

The protocol is three rules, and each agent follows its own set of them (:data:`RULES`):

* ``check_deps``: take a task only once everything it depends on has completed;
* ``claims``: claim a task before taking it, and leave alone a task another agent claimed
  this round (an agent without the rule neither claims nor looks at claims);
* ``retry``: take a task whose last attempt failed (at most ``max_retries`` times over).

:func:`compare` runs the three systems under one set of rules and one :class:`Failures`
plan; :func:`sweep` runs every set of rules for all agents, and every "one agent without
one rule", next to the supervisor under the same failure plan. The article's conclusion
reads off the sweep: one agent without ``check_deps`` brings the order violations back,
a deploy agent without ``claims`` the duplicate, ``db-1`` without ``retry`` the migration
(and everything after it) missing; the supervisor's row never changes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from planrun.core import (
    Audit,
    Event,
    KindSpec,
    Ledger,
    Registry,
    RunResult,
    Task,
    TaskContext,
    TransientError,
    UsageError,
    WorkerSpec,
    analyze,
)
from planrun.core.scheduling import RetryPolicy
from planrun.runtime import Supervisor, VirtualClock

__all__ = [
    "AGENTS",
    "MAX_COUNT",
    "RELEASE",
    "RULES",
    "Failures",
    "PeerBoard",
    "ReleaseWorker",
    "Row",
    "SweepRow",
    "agent_rules",
    "compare",
    "format_sweep",
    "format_table",
    "make_workers",
    "options_from_text",
    "parse_agent_rules",
    "parse_count",
    "parse_rules",
    "run_supervisor",
    "settings",
    "sweep",
    "trace",
]

RELEASE: tuple[Task, ...] = (
    Task(id="deploy_app", kind="deploy", depends_on=("migrate_db",)),
    Task(id="smoke_test", kind="qa", depends_on=("deploy_app",)),
    Task(id="migrate_db", kind="db"),
)
"""The release, deliberately out of order: the system must restore the order, not the list."""


class ReleaseWorker:
    """A deterministic worker: fails a task as many times as its plan says, then succeeds."""

    def __init__(self, name: str, skill: str, fail_plan: Mapping[str, int] | None = None) -> None:
        self.name = name
        self.skill = skill
        self.fail_plan = dict(fail_plan or {})

    def attempt(self, task_id: str) -> None:
        """Do the task once; raise :class:`TransientError` while the plan says fail."""
        if self.fail_plan.get(task_id, 0) > 0:
            self.fail_plan[task_id] -= 1
            raise TransientError(f"{self.name} failed {task_id}")

    async def __call__(self, payload: Any, ctx: TaskContext) -> dict[str, str]:
        self.attempt(ctx.task_id)
        return {"done_by": self.name}


RULES: tuple[str, ...] = ("check_deps", "claims", "retry")
"""The peer board's protocol rules, in the order they are always printed."""

AGENTS: tuple[str, ...] = ("deploy-1", "deploy-2", "qa-1", "db-1")
"""The release's agents, as :func:`make_workers` builds them."""

MAX_COUNT = 1000
"""Upper bound of a failure or retry count: the scenario is three tasks, not a soak test."""


def make_workers(db_failures: int = 1, deploy1_failures: int = 0) -> list[ReleaseWorker]:
    """Fresh workers for one run (failure plans are consumed as they run)."""
    return [
        ReleaseWorker("deploy-1", "deploy", {"deploy_app": deploy1_failures}),
        ReleaseWorker("deploy-2", "deploy"),
        ReleaseWorker("qa-1", "qa"),
        ReleaseWorker("db-1", "db", {"migrate_db": db_failures}),
    ]


class PeerBoard:
    """Equal agents picking work from a shared board, with optional protocol rules.

    The three flags set the rules of every agent, as in the article; ``agent_rules`` then
    replaces the rules of the agents it names (``{"deploy-2": {"claims", "retry"}}``), which
    is how one agent can run without a rule the others follow. ``max_retries`` bounds the
    ``retry`` rule (``None``: retry until ``max_rounds`` runs out, as the article does).
    """

    def __init__(
        self,
        workers: Sequence[ReleaseWorker],
        *,
        check_deps: bool = False,
        use_claims: bool = False,
        retry_failed: bool = False,
        max_rounds: int = 10,
        agent_rules: Mapping[str, Collection[str]] | None = None,
        max_retries: int | None = None,
    ) -> None:
        self.workers = list(workers)
        self.check_deps = check_deps
        self.use_claims = use_claims
        self.retry_failed = retry_failed
        self.max_rounds = max_rounds
        self.max_retries = max_retries
        flags = {"check_deps": check_deps, "claims": use_claims, "retry": retry_failed}
        base = frozenset(rule for rule, on in flags.items() if on)
        names = [w.name for w in self.workers]
        overrides = _check_agent_rules(agent_rules or {}, names)
        self.rules: dict[str, frozenset[str]] = {n: overrides.get(n, base) for n in names}
        """Each agent's rules, by agent name."""

    def execute(self, tasks: Sequence[Task]) -> Ledger:
        """Run rounds until nobody picks anything; return the ledger."""
        ledger = Ledger()
        done: set[str] = set()
        failures: dict[str, int] = {}
        for round_no in range(self.max_rounds):
            picks = self._pick(tasks, done, failures)
            if not picks:
                break
            for worker, task in picks:
                try:
                    worker.attempt(task.id)
                except TransientError as exc:
                    failures[task.id] = failures.get(task.id, 0) + 1
                    ledger.append(round_no, task.id, "failed", worker=worker.name,
                                  detail={"error": str(exc)})
                else:
                    done.add(task.id)
                    failures.pop(task.id, None)
                    ledger.append(round_no, task.id, "completed", worker=worker.name)
        return ledger

    def _pick(
        self, tasks: Sequence[Task], done: set[str], failures: Mapping[str, int]
    ) -> list[tuple[ReleaseWorker, Task]]:
        picks: list[tuple[ReleaseWorker, Task]] = []
        claimed: set[str] = set()
        for worker in self.workers:
            rules = self.rules[worker.name]
            for task in tasks:
                if task.kind != worker.skill or task.id in done:
                    continue
                if task.id in failures and not self._may_retry(rules, failures[task.id]):
                    continue  # "somebody else will deal with it"
                if "check_deps" in rules and not set(task.depends_on) <= done:
                    continue
                if "claims" in rules:
                    if task.id in claimed:
                        continue
                    claimed.add(task.id)
                picks.append((worker, task))
                break
        return picks

    def _may_retry(self, rules: frozenset[str], failures: int) -> bool:
        if "retry" not in rules:
            return False
        return self.max_retries is None or failures <= self.max_retries


def run_supervisor(
    workers: Sequence[ReleaseWorker],
    tasks: Sequence[Task] = RELEASE,
    *,
    max_retries: int = 2,
    on_event: Callable[[Event, Task], None] | None = None,
) -> RunResult:
    """Run the release under the planrun supervisor, in virtual time."""
    registry = Registry(KindSpec(k) for k in sorted({t.kind for t in tasks}))
    specs = [WorkerSpec(w.name, {w.skill: 1.0}, 1, {w.skill: w}) for w in workers]
    sup = Supervisor(
        registry,
        specs,
        strategy="balanced",
        max_attempts=max_retries + 1,
        retry=RetryPolicy(base=1.0),
        on_dead="abort_run",
        clock=VirtualClock(),
        run_id="release",
        seed=0,
        on_event=on_event,
    )
    sup.add_tasks(tasks)
    return sup.run()


# ------------------------------------------------------------------------- rules, failures


def parse_rules(text: str) -> frozenset[str]:
    """``"check_deps,claims"`` -> the set of rules; ``"none"`` is the empty set.

    Raises :class:`~planrun.UsageError` on an unknown or missing rule name.
    """
    names = [part.strip() for part in text.split(",")]
    if names == ["none"]:
        return frozenset()
    if not all(names):
        raise UsageError(f"rules {text!r}: expected names like check_deps,claims,retry "
                         "or none")
    return _check_rules(names)


def parse_agent_rules(
    items: Iterable[str], agents: Sequence[str] = AGENTS
) -> dict[str, frozenset[str]]:
    """``["deploy-2=claims,retry", ...]`` -> each named agent's rules.

    Raises :class:`~planrun.UsageError` on a malformed item, an unknown rule, an agent
    that does not exist, or an agent named twice.
    """
    rules: dict[str, frozenset[str]] = {}
    for item in items:
        agent, sep, text = item.partition("=")
        agent = agent.strip()
        if not sep or not agent or not text.strip():
            raise UsageError(f"agent rules {item!r}: expected AGENT=RULES, "
                             "e.g. deploy-2=claims,retry")
        if agent in rules:
            raise UsageError(f"agent rules: {agent!r} is given twice")
        rules[agent] = parse_rules(text)
    return _check_agent_rules(rules, agents)


def parse_count(option: str, text: str) -> int:
    """Parse a count given on the command line: an integer from 0 to :data:`MAX_COUNT`."""
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{option}: expected an integer, got {text!r}") from None
    _check_count(option, value)
    return value


def agent_rules(
    rules: Collection[str] = RULES,
    overrides: Mapping[str, Collection[str]] | None = None,
    agents: Sequence[str] = AGENTS,
) -> dict[str, frozenset[str]]:
    """Every agent's rules: ``rules`` for all, replaced by ``overrides`` for those it names."""
    base = _check_rules(rules)
    named = _check_agent_rules(overrides or {}, agents)
    return {agent: named.get(agent, base) for agent in agents}


def options_from_text(
    rules: str | None = None,
    agent_rules_items: Sequence[str] | None = None,
    db_failures: str | None = None,
    deploy1_failures: str | None = None,
    max_retries: str | None = None,
) -> tuple[dict[str, frozenset[str]] | None, Failures | None]:
    """The rules and the failure plan from the command line's text (``None``: not given).

    ``rules`` is every agent's set (``--rules``), ``agent_rules_items`` replaces it for the
    agents they name (``--agent-rules``); an unset count keeps the article's value. Raises
    :class:`~planrun.UsageError` with a one-line message on anything malformed.
    """
    chosen: dict[str, frozenset[str]] | None = None
    if rules is not None or agent_rules_items:
        base = parse_rules(rules) if rules is not None else frozenset(RULES)
        chosen = agent_rules(base, parse_agent_rules(agent_rules_items or ()))
    counts = {"db_failures": db_failures, "deploy1_failures": deploy1_failures,
              "max_retries": max_retries}
    if all(v is None for v in counts.values()):
        return chosen, None
    defaults = Failures().to_dict()
    parsed = {name: defaults[name] if text is None
              else parse_count("--" + name.replace("_", "-"), text)
              for name, text in counts.items()}
    return chosen, Failures(**parsed)


def settings(
    rules: Mapping[str, Collection[str]] | None = None, failures: Failures | None = None
) -> dict[str, Any]:
    """What a comparison ran under, as JSON-ready data: each agent's ``rules`` on the second
    peer board, and the failure plan."""
    chosen = agent_rules(RULES, rules)
    return {"rules": {agent: [r for r in RULES if r in c] for agent, c in chosen.items()},
            **(failures or Failures()).to_dict()}


def _check_rules(rules: Iterable[str]) -> frozenset[str]:
    if isinstance(rules, str):
        raise UsageError(f"rules {rules!r}: expected a collection of names; "
                         "parse text with parse_rules")
    chosen = frozenset(rules)
    unknown = sorted(chosen - set(RULES))
    if unknown:
        raise UsageError(f"unknown rule {unknown[0]!r} (rules: {', '.join(RULES)})")
    return chosen


def _check_agent_rules(
    rules: Mapping[str, Collection[str]], agents: Sequence[str]
) -> dict[str, frozenset[str]]:
    checked: dict[str, frozenset[str]] = {}
    for agent, names in rules.items():
        if agent not in agents:
            raise UsageError(f"unknown agent {agent!r} (agents: {', '.join(agents)})")
        checked[agent] = _check_rules(names)
    return checked


def _check_count(option: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{option}: expected an integer, got {value!r}")
    if not 0 <= value <= MAX_COUNT:
        raise UsageError(f"{option}: must be between 0 and {MAX_COUNT}, got {value}")


def _rules_text(rules: Collection[str]) -> str:
    return ",".join(r for r in RULES if r in rules) or "none"


@dataclass(frozen=True)
class Failures:
    """The failure plan every system runs under, and the retry budget.

    ``db_failures``: times ``db-1`` fails ``migrate_db`` before it succeeds (the article's 1);
    ``deploy1_failures``: times ``deploy-1`` fails ``deploy_app`` (0);
    ``max_retries``: retries after the first attempt, for the supervisor and for the peer
    board's ``retry`` rule alike (2). Each is an integer from 0 to :data:`MAX_COUNT`;
    anything else raises :class:`~planrun.UsageError`.
    """

    db_failures: int = 1
    deploy1_failures: int = 0
    max_retries: int = 2

    def __post_init__(self) -> None:
        _check_count("db_failures", self.db_failures)
        _check_count("deploy1_failures", self.deploy1_failures)
        _check_count("max_retries", self.max_retries)

    def workers(self) -> list[ReleaseWorker]:
        """Fresh workers carrying this plan."""
        return make_workers(self.db_failures, self.deploy1_failures)

    def to_dict(self) -> dict[str, int]:
        """The plan as JSON-ready data."""
        return {"db_failures": self.db_failures, "deploy1_failures": self.deploy1_failures,
                "max_retries": self.max_retries}


# ---------------------------------------------------------------------------- the systems


def trace(events: Iterable[Event]) -> list[str]:
    """The ledger in the article's notation: ``run:TASK:WORKER``, ``fail:TASK:WORKER``,
    ``abort:TASK`` (the supervisor gave up on the task and stopped the run) and
    ``cancel:TASK`` (a dependent it will not start)."""
    lines: list[str] = []
    for e in events:
        if e.event == "completed":
            lines.append(f"run:{e.task}:{e.worker}")
        elif e.event in ("failed", "dead"):
            lines.append(f"fail:{e.task}:{e.worker}")
            if e.event == "dead":
                lines.append(f"abort:{e.task}")
        elif e.event == "cancelled":
            lines.append(f"cancel:{e.task}")
    return lines


def _audit_dict(audit: Audit) -> dict[str, Any]:
    return {"order_violations": audit.order_violations, "duplicates": audit.duplicates,
            "missing": list(audit.missing)}


@dataclass(frozen=True)
class Row:
    """One line of the comparison table."""

    system: str
    audit: Audit
    events: Sequence[Event] = ()
    """The system's ledger (see :func:`trace`)."""

    def to_dict(self, *, ledger: bool = False) -> dict[str, Any]:
        """The JSON shape of one row of ``planrun compare --json``; ``ledger`` adds the
        ``"ledger"`` key, the system's :func:`trace`."""
        data: dict[str, Any] = {"system": self.system, **_audit_dict(self.audit)}
        if ledger:
            data["ledger"] = trace(self.events)
        return data


def _peer_board(
    rules: Mapping[str, Collection[str]], failures: Failures, tasks: Sequence[Task]
) -> PeerBoard:
    rounds = max(10, (failures.max_retries + 1) * len(tasks))
    return PeerBoard(failures.workers(), agent_rules=rules, max_retries=failures.max_retries,
                     max_rounds=rounds)


def _board_name(rules: Mapping[str, frozenset[str]]) -> str:
    sets = set(rules.values())
    if len(sets) > 1:
        return "peer (mixed)"
    only = sets.pop() if sets else frozenset()
    return "peer (protocol)" if only == set(RULES) else f"peer ({_rules_text(only)})"


def compare(
    tasks: Sequence[Task] = RELEASE,
    *,
    rules: Mapping[str, Collection[str]] | None = None,
    failures: Failures | None = None,
) -> list[Row]:
    """Run the release through the three systems and audit each ledger.

    ``rules`` replaces the protocol of the agents it names on the second peer board (every
    other agent follows all of :data:`RULES`); ``failures`` is the plan every system runs
    under. With neither, this is the article's table: naive peers, peers with the protocol,
    the supervisor.
    """
    plan = failures or Failures()
    chosen = agent_rules(RULES, rules)
    naive = _peer_board(agent_rules(()), plan, tasks).execute(tasks)
    board = _peer_board(chosen, plan, tasks).execute(tasks)
    supervised = run_supervisor(plan.workers(), tasks, max_retries=plan.max_retries)
    return [
        Row("peer (naive)", analyze(tasks, naive), naive.events),
        Row(_board_name(chosen), analyze(tasks, board), board.events),
        Row("supervisor", analyze(tasks, supervised.events), tuple(supervised.events)),
    ]


@dataclass(frozen=True)
class SweepRow:
    """One combination of the sweep: the peer board under ``rules`` and the supervisor."""

    name: str
    """``"all: check_deps,claims"`` or ``"deploy-2 without check_deps"``."""
    rules: Mapping[str, frozenset[str]]
    """Each agent's rules."""
    peer: Audit
    supervisor: Audit
    """The supervisor under the same failure plan (it has no rules to turn off)."""
    without: tuple[str, str] | None = None
    """``(agent, rule)`` for the rows where one agent lacks one rule."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape of one combination of ``planrun compare --sweep --json``."""
        return {
            "name": self.name,
            "rules": {agent: [r for r in RULES if r in rules]
                      for agent, rules in self.rules.items()},
            "without": None if self.without is None
            else {"agent": self.without[0], "rule": self.without[1]},
            "peer": _audit_dict(self.peer),
            "supervisor": _audit_dict(self.supervisor),
        }


def _combinations() -> list[tuple[str, dict[str, frozenset[str]], tuple[str, str] | None]]:
    combos: list[tuple[str, dict[str, frozenset[str]], tuple[str, str] | None]] = []
    for size in range(len(RULES), -1, -1):
        for chosen in itertools.combinations(RULES, size):
            combos.append((f"all: {_rules_text(chosen)}", agent_rules(chosen), None))
    for rule in RULES:
        for agent in AGENTS:
            rest = frozenset(RULES) - {rule}
            combos.append((f"{agent} without {rule}", agent_rules(RULES, {agent: rest}),
                           (agent, rule)))
    return combos


def sweep(tasks: Sequence[Task] = RELEASE, *, failures: Failures | None = None) -> list[SweepRow]:
    """Every set of rules for all agents (all three first, none last), then every agent
    without each rule while the others follow all three; each next to the supervisor,
    every run under ``failures``."""
    plan = failures or Failures()
    rows: list[SweepRow] = []
    for name, rules, without in _combinations():
        board = _peer_board(rules, plan, tasks).execute(tasks)
        supervised = run_supervisor(plan.workers(), tasks, max_retries=plan.max_retries)
        rows.append(SweepRow(name, rules, analyze(tasks, board),
                             analyze(tasks, supervised.events), without))
    return rows


# ------------------------------------------------------------------------------- printing


def _settings_lines(rules: Mapping[str, frozenset[str]], failures: Failures) -> list[str]:
    counts: dict[frozenset[str], int] = {}
    for chosen in rules.values():
        counts[chosen] = counts.get(chosen, 0) + 1
    base = max(counts, key=lambda c: (counts[c], len(c)))
    others = [f"{agent} {_rules_text(chosen)}" for agent, chosen in rules.items()
              if chosen != base]
    line = f"peer rules: {_rules_text(base)} for " + ("all" if not others else
                                                      "the others; " + "; ".join(others))
    return [line, _failures_line(failures)]


def _failures_line(failures: Failures) -> str:
    return (f"failures: db-1 fails migrate_db {_times(failures.db_failures)}, deploy-1 fails "
            f"deploy_app {_times(failures.deploy1_failures)}; max retries {failures.max_retries}")


def _times(n: int) -> str:
    return f"{n} time" if n == 1 else f"{n} times"


def format_table(
    rows: Sequence[Row],
    *,
    rules: Mapping[str, Collection[str]] | None = None,
    failures: Failures | None = None,
    ledger: bool = False,
) -> list[str]:
    """The text of ``planrun compare``: the table, preceded by the settings when ``rules``
    or ``failures`` is given, followed by each system's :func:`trace` when ``ledger``."""
    lines: list[str] = []
    if rules is not None or failures is not None:
        lines += _settings_lines(agent_rules(RULES, rules), failures or Failures())
    width = max([18, *(len(r.system) + 1 for r in rows)])
    lines.append(f"{'system':<{width}} {'order violations':>16} {'duplicates':>10}  missing")
    for row in rows:
        a = row.audit
        lines.append(f"{row.system:<{width}} {a.order_violations:>16} {a.duplicates:>10}  "
                     f"{a.missing}")
    if ledger:
        lines += [f"{row.system}: {' '.join(trace(row.events))}".rstrip() for row in rows]
    return lines


def format_sweep(rows: Sequence[SweepRow], failures: Failures | None = None) -> list[str]:
    """The text of ``planrun compare --sweep``: the failure plan, then one line per
    combination, the peer board's audit and the supervisor's side by side."""
    width = max([28, *(len(r.name) + 1 for r in rows)])
    peer = [_audit_cells(r.peer) for r in rows]
    cell = max([len("order dups  missing"), *(len(c) + 1 for c in peer)])
    lines = [
        _failures_line(failures or Failures()),
        f"{'':<{width}} {'peer board':<{cell}}| supervisor",
        f"{'peer rules':<{width}} {'order dups  missing':<{cell}}| order dups  missing",
    ]
    for row, cells in zip(rows, peer, strict=True):
        lines.append(f"{row.name:<{width}} {cells:<{cell}}| {_audit_cells(row.supervisor)}")
    return lines


def _audit_cells(audit: Audit) -> str:
    missing = ",".join(audit.missing) or "-"
    return f"{audit.order_violations:>5} {audit.duplicates:>4}  {missing}"
