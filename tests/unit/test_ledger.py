"""The ledger and the audit computed from it alone."""

from __future__ import annotations

import io
from pathlib import Path

from planrun.core._ledger import Event, Ledger, analyze, read_jsonl
from planrun.core._task import Task

DEPS = {"a": [], "b": ["a"], "c": ["b"]}


def ledger_of(*entries: tuple[str, str]) -> Ledger:
    ledger = Ledger()
    for task, event in entries:
        ledger.append(0.0, task, event)
    return ledger


def test_clean_run() -> None:
    audit = analyze(DEPS, ledger_of(("a", "completed"), ("b", "completed"), ("c", "completed")))
    assert audit.clean and audit.to_dict()["missing"] == []


def test_order_violation_duplicate_and_missing_are_counted() -> None:
    audit = analyze(DEPS, ledger_of(("b", "completed"), ("b", "completed"), ("a", "completed")))
    assert audit.order_violations == 1  # b before a
    assert audit.duplicates == 1
    assert audit.missing == ["c"]
    assert not audit.clean


def test_dependency_that_never_completed_is_a_violation() -> None:
    audit = analyze(DEPS, ledger_of(("c", "completed")))
    assert audit.order_violations == 1 and audit.missing == ["a", "b"]


def test_only_completions_count_and_effects_are_audited() -> None:
    ledger = ledger_of(("a", "started"), ("a", "failed"), ("a", "completed"),
                       ("a", "effect"), ("a", "effect"))
    audit = analyze({"a": []}, ledger)
    assert audit.duplicates == 0 and audit.duplicate_effects == 1


def test_task_records_work_as_input() -> None:
    tasks = [Task(id="a", kind="k"), Task(id="b", kind="k", depends_on=("a",))]
    assert analyze(tasks, ledger_of(("b", "completed"))).order_violations == 1


def test_jsonl_round_trip(tmp_path: Path) -> None:
    ledger = Ledger()
    ledger.append(1.5, "a", "completed", worker="w1", attempt=2, detail={"x": 1})
    ledger.append(2.0, "b", "failed")
    path = tmp_path / "events.jsonl"
    ledger.write_jsonl(path)
    events = read_jsonl(path)
    assert events == list(ledger)
    buffer = io.StringIO()
    ledger.write_jsonl(buffer)
    assert read_jsonl(io.StringIO(buffer.getvalue()))[0] == Event(
        0, 1.5, "a", "completed", "w1", 2, {"x": 1}
    )


def test_foreign_log_is_audited_in_seq_order() -> None:
    events = [Event(2, 0.0, "a", "completed"), Event(1, 0.0, "b", "completed")]
    assert analyze(DEPS, events).order_violations == 1  # b (seq 1) came before a (seq 2)


def test_noted_events_are_the_events_appended() -> None:
    entries = [(0.5, "a", "started", "w", 1, None), (1.5, "a", "completed", "w", 1, {"k": 1}),
               (2.0, "b", "cancelled", None, 0, {"cause": "a"})]
    appended, noted = Ledger(), Ledger()
    for at, task, event, worker, attempt, detail in entries:
        appended.append(at, task, event, worker=worker, attempt=attempt, detail=detail)
        noted.note(at, task, event, worker, attempt, detail)
    assert len(noted) == 3
    view = noted.view()
    assert list(view) == list(appended.events) == list(noted.events)
    assert view == appended.events and view[1].detail == {"k": 1} and view[0].detail == {}
    assert [e.seq for e in noted] == [0, 1, 2]
    assert noted.append(3.0, "b", "effect").seq == 3  # numbering goes on after noted entries


def test_the_audit_of_a_ledger_with_noted_events_is_that_of_its_events() -> None:
    ledger = Ledger()
    ledger.note(0.0, "b", "completed")
    ledger.append(0.0, "a", "completed")
    ledger.note(0.0, "b", "completed")
    ledger.note(0.0, "c", "effect")
    from_ledger = analyze(DEPS, ledger, effect_kinds=())
    from_events = analyze(DEPS, list(reversed(ledger.events)))  # any order: sorted by seq
    assert from_ledger == from_events
    assert from_ledger.order_violations == 1 and from_ledger.duplicates == 1
    assert from_ledger.missing == ["c"]
    view = ledger.view()
    ledger.note(0.0, "c", "completed")  # a view keeps the events it was taken with
    assert len(view) == 4 and analyze(DEPS, view) == from_events


def test_the_audit_reads_the_same_events_however_they_entered_the_ledger() -> None:
    """The audit reads the completions and effects without building events, whatever way
    they entered the ledger: append, note, a core's change sink, or a ledger built from
    stored events."""
    ledger = Ledger()
    ledger.append(0.0, "a", "created")
    ledger.note(0.0, "b", "completed")
    sink = ledger.change_sink(lambda: 1.0, lambda task: None)
    sink(Task(id="a", kind="k"), "completed", "w", None, 0)
    sink(Task(id="a", kind="k"), "started", "w", None, 0)
    ledger.append(2.0, "c", "effect")
    ledger.note(2.0, "c", "assigned")
    sink(Task(id="c", kind="k"), "completed", None, None, 0)
    audited = [(e.seq, e.task, e.event) for e in ledger.events
               if e.event in ("completed", "effect")]
    assert audited == [(1, "b", "completed"), (2, "a", "completed"), (4, "c", "effect"),
                       (6, "c", "completed")]
    tasks = [Task(id="a", kind="k"), Task(id="b", kind="k", depends_on=("a",)),
             Task(id="c", kind="k", depends_on=("b",)), Task(id="d", kind="k")]
    audit = analyze(tasks, ledger, effect_kinds=("k",))
    assert audit == analyze(tasks, list(ledger.events), effect_kinds=("k",))
    assert audit.order_violations == 1  # b completed before a
    assert audit.missing == ["d"] and audit.missing_effects == ["a", "b"]
    restored = Ledger(reversed(ledger.events))  # a resume's ledger, from the store
    assert analyze(tasks, restored, effect_kinds=("k",)) == audit
    restored.note(3.0, "d", "completed")
    assert analyze(tasks, restored, effect_kinds=("k",)).missing == []


def test_entries_a_core_appends_raw_are_numbered_by_place_and_built_when_read() -> None:
    ledger = Ledger()
    add = ledger.raw_appender()
    add((0.5, "a", "created", None, 0, None))
    add((0.6, "a", "assigned", "w", 1, None))
    first = ledger.events  # read mid-run: what is there is built
    assert [(e.seq, e.event, e.detail) for e in first] == [(0, "created", {}),
                                                          (1, "assigned", {})]
    add((0.7, "a", "started", "w", 1, None))  # after a read: still found and built
    entry = ledger.append(0.8, "a", "completed", worker="w", attempt=1)
    add((0.9, "a", "effect", None, 1, {"key": "r:a"}))
    assert entry.seq == 3 and ledger.next_seq == 5
    events = list(ledger)
    assert [(e.seq, e.event) for e in events] == [
        (0, "created"), (1, "assigned"), (2, "started"), (3, "completed"), (4, "effect")]
    assert events[4].detail == {"key": "r:a"} and events[2].worker == "w"
    assert ledger.events[0] is first[0]  # built once, in place


def test_a_ledger_made_from_stored_events_with_gaps_numbers_on_from_the_last() -> None:
    stored = [Event(7, 0.0, "a", "created"), Event(2, 0.0, "a", "assigned"),
              Event(12, 1.0, "a", "started")]  # store-made seqs are increasing, not dense
    ledger = Ledger(stored)
    ledger.raw_appender()((2.0, "a", "completed", "w", 1, None))
    assert ledger.append(3.0, "a", "effect").seq == 14
    assert [e.seq for e in ledger.events] == [2, 7, 12, 13, 14]
    audit = analyze([Task(id="a", kind="k")], ledger, effect_kinds=("k",))
    assert audit.clean and audit == analyze([Task(id="a", kind="k")], list(ledger.events),
                                            effect_kinds=("k",))


def test_an_audit_computed_when_read_is_the_audit_it_computes() -> None:
    import pickle

    from planrun.core._ledger import Audit, audit_when_read

    calls: list[int] = []
    ledger = Ledger()
    ledger.note(0.0, "a", "completed")

    def compute() -> Audit:
        calls.append(1)
        return analyze(DEPS, ledger)

    later = audit_when_read(compute)
    assert calls == []  # nothing computed until a field is read
    now = analyze(DEPS, ledger)
    assert later.missing == now.missing and calls == [1]
    assert later == now and now == later
    assert later.clean is now.clean and later.to_dict() == now.to_dict()
    assert repr(later) == repr(now) and isinstance(later, Audit)
    assert pickle.loads(pickle.dumps(later)) == now and calls == [1]
    assert later != analyze({"z": []}, ledger)


# ---- the repairs of a run's plan -------------------------------------------------------------


def test_a_repair_of_one_task_is_on_that_task_and_the_others_on_the_first() -> None:
    from planrun.core import Repair, repair_events

    ids = ["research", "analyse", "brief"]
    asked = Repair("model", "unknown_kind", 2, "no kind 'brief_it'", attempt=2)
    order = Repair("code", "forward_dependency", None, "sorted", rule="put_in_dependency_order",
                   attempt=2)
    link = Repair("code", "missing_input", 0, "linked", rule="add_needed_input", attempt=2,
                  final_task=1)
    events = repair_events([asked, order, link], ids)
    assert [task for task, _ in events] == ["research", "research", "analyse"]
    assert [detail for _, detail in events] == [asked.to_dict(), order.to_dict(),
                                                link.to_dict()]
    assert events[2][1] == {"by": "code", "code": "missing_input", "rule": "add_needed_input",
                            "task": 0, "detail": "linked", "attempt": 2, "final_task": 1}
    assert repair_events([asked], []) == []
    # an index the plan does not have (a hand-built Plan) is no task of it: the first one
    stray = [Repair("code", "dead_end", 0, "x", rule="link_dead_end", final_task=k)
             for k in (3, -1)]
    assert [task for task, _ in repair_events(stray, ids)] == ["research", "research"]


def test_repaired_events_change_no_finding_of_the_audit() -> None:
    from planrun.core import EventName

    tasks = [Task(id="a", kind="k"), Task(id="b", kind="k", depends_on=("a",))]
    log = Ledger()
    for t in tasks:
        log.append(0.0, t.id, EventName.CREATED)
    log.append(0.0, "a", EventName.REPAIRED, detail={"by": "code", "code": "self_dependency"})
    log.append(1.0, "a", EventName.COMPLETED)
    log.append(1.5, "b", EventName.REPAIRED, detail={"by": "model", "code": "unknown_kind"})
    log.append(2.0, "b", EventName.COMPLETED)
    assert analyze(tasks, log).clean
    assert analyze(tasks, list(log)).clean
    assert analyze(tasks, log) == analyze(tasks, [e for e in log if e.event != "repaired"])
