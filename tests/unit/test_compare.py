"""The supervisor-vs-peer comparison reproduces the article's table and cases."""

from __future__ import annotations

from planrun.compare import RELEASE, PeerBoard, compare, make_workers, run_supervisor
from planrun.ledger import analyze
from planrun.task import Status


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
