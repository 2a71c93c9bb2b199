"""The supervisor-vs-peer comparison reproduces the article's table and cases."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from planrun.core._errors import UsageError
from planrun.core._ledger import Audit, analyze
from planrun.core._task import Status
from planrun.dev.compare import (
    AGENTS,
    RELEASE,
    RULES,
    Failures,
    PeerBoard,
    Row,
    agent_rules,
    compare,
    make_workers,
    parse_agent_rules,
    parse_count,
    parse_rules,
    run_supervisor,
    sweep,
    trace,
)


def test_table_matches_the_article() -> None:
    rows = {r.system: r.to_dict() for r in compare()}
    assert rows["peer (naive)"] == {
        "system": "peer (naive)", "order_violations": 1, "duplicates": 1,
        "missing": ["migrate_db"],
    }
    for clean in ("peer (protocol)", "supervisor"):
        assert rows[clean] == {
            "system": clean, "order_violations": 0, "duplicates": 0, "missing": []
        }


def test_naive_peers_deploy_twice_before_the_migration() -> None:
    ledger = PeerBoard(make_workers()).execute(RELEASE)
    runs = [(e.task, e.worker) for e in ledger if e.event == "completed"]
    assert runs[:2] == [("deploy_app", "deploy-1"), ("deploy_app", "deploy-2")]
    assert ("migrate_db", "db-1") not in runs


def test_one_protocol_rule_missing_brings_violations_back() -> None:
    board = PeerBoard(make_workers(), check_deps=False, use_claims=True, retry_failed=True)
    audit = analyze(RELEASE, board.execute(RELEASE))
    assert audit.order_violations >= 1


def test_supervisor_recovers_after_a_transient_failure() -> None:
    result = run_supervisor(make_workers())
    failed = [(e.task, e.worker) for e in result.events if e.event == "failed"]
    assert failed == [("migrate_db", "db-1")]
    assert result.audit.clean


def test_supervisor_fails_over_to_another_worker_of_the_same_skill() -> None:
    result = run_supervisor(make_workers(db_failures=0, deploy1_failures=1))
    deploy = [(e.event, e.worker) for e in result.events if e.task == "deploy_app"]
    assert ("failed", "deploy-1") in deploy and ("completed", "deploy-2") in deploy
    assert result.audit.clean


def test_supervisor_stops_dependents_when_retries_are_exhausted() -> None:
    result = run_supervisor(make_workers(db_failures=5), max_retries=2)
    assert result.tasks["migrate_db"].status is Status.DEAD
    assert result.tasks["migrate_db"].attempts == 3
    assert result.aborted_by == "migrate_db"
    for dependent in ("deploy_app", "smoke_test"):
        assert result.tasks[dependent].status is Status.CANCELLED
        assert not [e for e in result.events if e.task == dependent and e.event == "started"]
    assert result.audit.order_violations == 0 and result.audit.duplicates == 0


# ------------------------------------------------------------------- rules per agent, sweep


def _row(rules: dict[str, set[str]] | None = None, **failures: int) -> Row:
    return compare(rules=rules, failures=Failures(**failures))[1]


@pytest.mark.parametrize("agent", ["deploy-1", "deploy-2", "qa-1"])
def test_one_agent_without_check_deps_brings_back_an_order_violation(agent: str) -> None:
    row = _row({agent: {"claims", "retry"}})
    assert row.system == "peer (mixed)"
    assert row.audit.order_violations >= 1
    assert row.audit.duplicates == 0 and row.audit.missing == []


def test_the_db_agent_without_check_deps_changes_nothing() -> None:
    # migrate_db depends on nothing: the rule only matters to agents whose tasks have deps
    assert _row({"db-1": {"claims", "retry"}}).audit.clean


@pytest.mark.parametrize("agent", ["deploy-1", "deploy-2"])
def test_one_deploy_agent_without_claims_brings_back_a_duplicate(agent: str) -> None:
    audit = _row({agent: {"check_deps", "retry"}}).audit
    assert (audit.order_violations, audit.duplicates, audit.missing) == (0, 1, [])


def test_the_db_agent_without_retry_leaves_the_migration_and_its_dependents_missing() -> None:
    audit = _row({"db-1": {"check_deps", "claims"}}).audit
    assert "migrate_db" in audit.missing
    assert audit.missing == ["deploy_app", "smoke_test", "migrate_db"]
    assert audit.order_violations == 0 and audit.duplicates == 0


def test_agent_rules_reproduce_the_board_wide_flags() -> None:
    for size in range(len(RULES) + 1):
        for chosen in itertools.combinations(RULES, size):
            flags = PeerBoard(make_workers(), check_deps="check_deps" in chosen,
                              use_claims="claims" in chosen, retry_failed="retry" in chosen)
            per_agent = PeerBoard(make_workers(), agent_rules=agent_rules(chosen))
            assert list(per_agent.execute(RELEASE)) == list(flags.execute(RELEASE)), chosen


def test_the_peer_retry_rule_respects_max_retries() -> None:
    def board(max_retries: int | None) -> Audit:
        peers = PeerBoard(make_workers(db_failures=5), check_deps=True, use_claims=True,
                          retry_failed=True, max_retries=max_retries)
        ledger = peers.execute(RELEASE)
        fails = [e for e in ledger if e.event == "failed"]
        assert len(fails) == (5 if max_retries is None else max_retries + 1)
        return analyze(RELEASE, ledger)

    assert board(None).clean  # the article's board: retry until the rounds run out
    assert board(2).missing == ["deploy_app", "smoke_test", "migrate_db"]


def test_every_system_runs_under_the_same_failure_plan() -> None:
    rows = {r.system: r for r in compare(failures=Failures(db_failures=0))}
    assert rows["peer (naive)"].audit.missing == []  # nothing failed, nothing dropped
    failed = [e for r in rows.values() for e in r.events if e.event == "failed"]
    assert failed == []


def test_sweep_covers_every_combination_and_the_supervisor_stays_clean() -> None:
    rows = sweep()
    assert len(rows) == 2 ** len(RULES) + len(AGENTS) * len(RULES)
    assert len({r.name for r in rows}) == len(rows)
    assert len({tuple(sorted((a, tuple(sorted(c))) for a, c in r.rules.items()))
                for r in rows}) == len(rows)
    for row in rows:
        assert row.supervisor.clean, row.name
    by_name = {r.name: r for r in rows}
    assert by_name["all: check_deps,claims,retry"].peer.clean
    naive = by_name["all: none"].peer
    assert (naive.order_violations, naive.duplicates, naive.missing) == (1, 1, ["migrate_db"])
    for agent in AGENTS:
        row = by_name[f"{agent} without retry"]
        assert row.without == (agent, "retry")
        assert row.rules[agent] == {"check_deps", "claims"}
    assert by_name["deploy-2 without check_deps"].peer.order_violations >= 1
    assert by_name["deploy-1 without claims"].peer.duplicates == 1
    assert "migrate_db" in by_name["db-1 without retry"].peer.missing


def test_sweep_under_exhausted_retries_keeps_the_supervisor_in_order() -> None:
    for row in sweep(failures=Failures(db_failures=5, max_retries=2)):
        assert row.supervisor.order_violations == 0 and row.supervisor.duplicates == 0
        assert row.supervisor.missing == ["deploy_app", "smoke_test", "migrate_db"]


def test_trace_uses_the_articles_notation() -> None:
    result = run_supervisor(make_workers(db_failures=5), max_retries=2)
    assert trace(result.events) == [
        "fail:migrate_db:db-1", "fail:migrate_db:db-1", "fail:migrate_db:db-1",
        "abort:migrate_db", "cancel:deploy_app", "cancel:smoke_test",
    ]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: parse_rules("check_deps,lock"), "unknown rule 'lock'"),
        (lambda: parse_rules(""), "expected names"),
        (lambda: parse_agent_rules(["deploy-9=claims"]), "unknown agent 'deploy-9'"),
        (lambda: parse_agent_rules(["deploy-2"]), "expected AGENT=RULES"),
        (lambda: parse_agent_rules(["=claims"]), "expected AGENT=RULES"),
        (lambda: parse_agent_rules(["db-1=retry", "db-1=none"]), "given twice"),
        (lambda: parse_count("--db-failures", "-1"), "between 0 and"),
        (lambda: parse_count("--db-failures", "two"), "expected an integer"),
        (lambda: Failures(max_retries=-1), "max_retries: must be between 0"),
        (lambda: compare(rules={"deploy-3": {"claims"}}), "unknown agent 'deploy-3'"),
        (lambda: agent_rules("claims"), "expected a collection"),
        (lambda: PeerBoard(make_workers(), agent_rules={"qa-1": {"lock"}}), "unknown rule"),
    ],
)
def test_bad_settings_raise_usage_error(call: Callable[[], object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        call()


def test_rules_parse() -> None:
    assert parse_rules("none") == frozenset()
    assert parse_rules(" retry , claims ") == {"claims", "retry"}
    assert parse_agent_rules(["deploy-2=claims,retry", "qa-1=none"]) == {
        "deploy-2": {"claims", "retry"}, "qa-1": frozenset()}
