"""The task record and its state machine."""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import sys
from typing import Any

import pytest

from planrun.core._errors import IllegalTransition
from planrun.core._records import fast_init
from planrun.core._task import FINAL, Status, Task, transition

LEGAL = {
    (Status.PENDING, Status.ASSIGNED),
    (Status.PENDING, Status.RUNNING),  # a peer worker claims and starts in one step
    (Status.PENDING, Status.CANCELLED),
    (Status.PENDING, Status.DEAD),
    (Status.ASSIGNED, Status.RUNNING),
    (Status.ASSIGNED, Status.PENDING),
    (Status.ASSIGNED, Status.CANCELLED),
    (Status.ASSIGNED, Status.DEAD),
    (Status.RUNNING, Status.COMPLETED),
    (Status.RUNNING, Status.FAILED),
    (Status.RUNNING, Status.DEAD),
    (Status.RUNNING, Status.PENDING),
    (Status.RUNNING, Status.CANCELLED),
    (Status.FAILED, Status.PENDING),
    (Status.FAILED, Status.CANCELLED),
    (Status.FAILED, Status.DEAD),
    (Status.PENDING, Status.WAITING),  # ready, and needs approval before it starts
    (Status.RUNNING, Status.WAITING),  # its result needs approval before its effect
    (Status.WAITING, Status.PENDING),  # approved before start
    (Status.WAITING, Status.COMPLETED),  # approved before the effect
    (Status.WAITING, Status.DEAD),  # rejected
    (Status.WAITING, Status.CANCELLED),  # abort, deadline, budget
}

ALL_PAIRS = list(itertools.product(Status, Status))


def _at(status: Status) -> Task:
    return Task(id="t", kind="k", status=status)


@pytest.mark.parametrize(("src", "dst"), sorted(LEGAL, key=str))
def test_legal_transition_returns_new_record(src: Status, dst: Status) -> None:
    task = _at(src)
    moved = transition(task, dst, error="x")
    assert moved.status is dst
    assert moved.error == "x"
    assert task.status is src  # the old record is untouched


@pytest.mark.parametrize(
    ("src", "dst"), [p for p in ALL_PAIRS if p not in LEGAL], ids=lambda s: s.value
)
def test_illegal_transition_is_refused(src: Status, dst: Status) -> None:
    with pytest.raises(IllegalTransition, match=f"{src.value} -> {dst.value}"):
        transition(_at(src), dst)


def test_final_statuses_have_no_way_out() -> None:
    assert {Status.COMPLETED, Status.DEAD, Status.CANCELLED} == FINAL
    for src in FINAL:
        assert not [dst for dst in Status if (src, dst) in LEGAL]
    assert _at(Status.DEAD).finished and not _at(Status.FAILED).finished


def test_record_is_frozen_and_status_only_changes_through_transition() -> None:
    task = Task(id="t", kind="k")
    with pytest.raises(AttributeError):
        task.status = Status.RUNNING  # type: ignore[misc]
    with pytest.raises(IllegalTransition):
        task.evolve(status=Status.RUNNING)
    assert task.evolve(attempts=2).attempts == 2


def test_round_trip_through_dict() -> None:
    task = Task(id="t", kind="k", payload={"a": 1}, depends_on=("x",), resources=("db",),
                estimate_s=3.5, token=2)
    data = task.to_dict()
    assert data["status"] == "pending" and data["depends_on"] == ["x"]
    assert Task.from_dict(data) == task


def test_a_status_is_the_same_key_as_its_value() -> None:
    assert hash(Status.PENDING) == hash("pending")
    assert "dead" in FINAL and Status.DEAD in {"dead"}
    assert {Status.RUNNING: 1}["running"] == 1


def test_a_record_is_built_as_the_dataclass_builds_it() -> None:
    """Task's quick __init__ takes the dataclass's arguments and defaults, refuses the same
    mistakes, and gives each record a payload of its own."""
    reference = dataclasses.make_dataclass(
        "Reference", [(f.name, f.type, f) for f in dataclasses.fields(Task)], frozen=True)
    given: dict[str, Any] = {"id": "a", "kind": "k", "depends_on": ("b",), "max_attempts": 5}
    assert dataclasses.asdict(Task(**given)) == dataclasses.asdict(reference(**given))
    assert Task("a", "k") == Task(id="a", kind="k")
    first, second = Task("a", "k"), Task("b", "k")
    assert first.payload == {} and first.payload is not second.payload
    assert str(inspect.signature(Task)) == str(inspect.signature(reference))
    with pytest.raises(TypeError, match="kind"):
        Task("a")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="colour"):
        Task("a", "k", colour="red")  # type: ignore[call-arg]
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.kind = "other"  # type: ignore[misc]


def test_a_changed_record_shares_its_keys_with_the_others() -> None:
    """A new record and each copy a transition makes keep the class's shared keys: their
    state takes far less memory than a dict of its own (what 100,000 tasks cost)."""
    task = Task("a", "k")
    copy = transition(transition(task, Status.ASSIGNED, assigned_to="w"), Status.RUNNING)
    own = dict(copy.__dict__)
    for record in (task, copy, copy.evolve(token=2)):
        assert sys.getsizeof(record.__dict__) < sys.getsizeof(own) / 2, record
    assert copy.status is Status.RUNNING and copy.assigned_to == "w" and task.assigned_to is None


def test_fast_init_refuses_what_it_cannot_build() -> None:
    @dataclasses.dataclass(frozen=True)
    class Checked:
        x: int

        def __post_init__(self) -> None:
            assert self.x >= 0

    with pytest.raises(TypeError, match="__post_init__"):
        fast_init(Checked)


def test_the_cores_transitions_are_the_tables_and_change_only_their_fields() -> None:
    """The scheduling core's hot transitions (assign, start, complete, take in) are the
    table's: each refuses a move the table refuses, and copies the record with its own
    fields only, sharing the class's keys."""
    from planrun.core._task import assigned, completed, created, started

    task = Task("a", "k", payload={"x": 1}, error="TransientError: before", error_class="transient")
    taken = created(task, 5.0, max_attempts=7)
    assert (taken.created_at, taken.max_attempts, taken.status) == (5.0, 7, Status.PENDING)
    assert created(task, 5.0).max_attempts == task.max_attempts
    given = assigned(taken, "w", None)
    assert (given.status, given.assigned_to, given.token, given.lease) == (
        Status.ASSIGNED, "w", 1, None)
    running = started(given, 6.0, 16.0)
    assert (running.status, running.started_at, running.lease, running.token) == (
        Status.RUNNING, 6.0, 16.0, 1)
    done = completed(running, {"r": 1}, 7.0)
    assert (done.status, done.result, done.finished_at, done.attempts, done.lease) == (
        Status.COMPLETED, {"r": 1}, 7.0, 1, None)
    assert done.error is None and done.error_class is None  # an earlier failure is cleared
    for record in (taken, given, running, done):
        assert sys.getsizeof(record.__dict__) < sys.getsizeof(dict(record.__dict__)) / 2
        assert record.payload == {"x": 1} and record.id == "a"
    assert task.status is Status.PENDING and task.created_at is None  # untouched
    with pytest.raises(IllegalTransition, match="completed -> assigned"):
        assigned(done, "w", None)
    with pytest.raises(IllegalTransition, match="pending -> completed"):
        completed(taken, 1, 8.0)
    with pytest.raises(IllegalTransition, match="completed -> running"):
        started(done, 8.0, 9.0)
