"""The heap a run starts with is kept out of the collector's passes, and given back after."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import pytest

from planrun.core._registry import KindSpec, Registry, TaskContext, WorkerSpec
from planrun.core._task import Task
from planrun.runtime import _heap
from planrun.runtime._supervisor import Supervisor


class Node:
    """An object that can sit in a reference cycle (only the collector frees it)."""

    def __init__(self) -> None:
        self.other: Any = self


def _supervisor(seen: list[tuple[int, tuple[int, int, int]]], handler_gone: Any = None,
                freeze: bool | None = None) -> Supervisor:
    async def probe(payload: Any, ctx: TaskContext) -> None:
        seen.append((gc.get_freeze_count(), gc.get_threshold()))
        if handler_gone is not None:
            handler_gone()

    sup = Supervisor(Registry([KindSpec("probe", handler=probe)]), [WorkerSpec("w", None, 2)])
    if freeze is not None:
        sup.freeze_heap = freeze
    sup.add_tasks([Task(id=f"t{i}", kind="probe") for i in range(4)])
    return sup


@pytest.fixture(autouse=True)
def _collector_as_usual() -> Any:
    before = gc.get_threshold()
    yield
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before


def test_a_run_freezes_the_heap_it_starts_with_and_gives_it_back() -> None:
    seen: list[tuple[int, tuple[int, int, int]]] = []
    before = gc.get_threshold()
    result = _supervisor(seen).run()
    assert result.ok
    assert len(seen) == 4
    assert all(count > 0 for count, _ in seen)  # frozen while the handlers ran
    assert all(t == (max(before[0], _heap.YOUNG_EVERY), before[1],
                     max(before[2], _heap.FULL_EVERY)) for _, t in seen)
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before


def test_a_cycle_dropped_during_a_run_is_collected_after_it() -> None:
    node = Node()
    gone = weakref.ref(node)
    box = [node]
    del node

    def drop() -> None:
        box.clear()  # the cycle existed before the run: frozen, so only collected after
        gc.collect()

    seen: list[tuple[int, tuple[int, int, int]]] = []
    alive_during: list[bool] = []
    sup = _supervisor(seen, lambda: (drop(), alive_during.append(gone() is not None)))
    assert sup.run().ok
    assert alive_during and all(alive_during)
    gc.collect()
    assert gone() is None


def test_turned_off_the_run_freezes_nothing() -> None:
    seen: list[tuple[int, tuple[int, int, int]]] = []
    before = gc.get_threshold()
    assert _supervisor(seen, freeze=False).run().ok
    assert seen == [(0, before)] * 4


def test_a_heap_the_program_froze_itself_is_left_as_it_is() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        seen: list[tuple[int, tuple[int, int, int]]] = []
        assert _supervisor(seen).run().ok
        assert gc.get_freeze_count() == frozen  # not unfrozen by the run
        assert all(t == gc.get_threshold() for _, t in seen)  # thresholds untouched
    finally:
        gc.unfreeze()


def test_overlapping_runs_unfreeze_when_the_last_one_ends() -> None:
    counts: list[int] = []

    async def main() -> None:
        a = _supervisor([])
        b = _supervisor([])
        first = asyncio.ensure_future(a.arun())
        await asyncio.sleep(0)
        await asyncio.gather(first, b.arun())
        counts.append(gc.get_freeze_count())

    asyncio.run(main())
    assert counts == [0]


def test_with_the_collector_disabled_nothing_is_frozen() -> None:
    gc.disable()
    try:
        seen: list[tuple[int, tuple[int, int, int]]] = []
        assert _supervisor(seen).run().ok
        assert all(count == 0 for count, _ in seen)
    finally:
        gc.enable()


def test_the_heap_stays_frozen_until_the_last_of_nested_runs_ends() -> None:
    with _heap.frozen_heap() as outer:
        with _heap.frozen_heap() as inner:
            assert outer and inner
        assert gc.get_freeze_count() > 0  # the outer run goes on
        assert gc.get_threshold()[2] >= _heap.FULL_EVERY
    assert gc.get_freeze_count() == 0


_FIRST_READ = """
import gc, json, sys
from planrun import App, Registry, plan_and_run
from planrun.core import KindSpec

async def noop(payload, ctx):
    return None

plan = {"goal": "g", "tasks": [{"id": f"t{i}", "kind": "noop", "payload": {"i": [i, {"n": i}]}}
                               for i in range(2000)]}
app = App(Registry([KindSpec("noop", handler=noop)]))
full = []
gc.callbacks.append(lambda phase, info: phase == "start" and info["generation"] == 2
                    and full.append(gc.get_freeze_count()))
report = plan_and_run(plan, app)
print(json.dumps({"ok": report.ok, "unfrozen_full_passes": sum(1 for f in full if f == 0)}))
"""


@pytest.mark.parametrize("freeze", ["1", "0"])
def test_a_large_plan_read_first_thing_in_a_process_walks_no_unfrozen_heap(
    freeze: str,
) -> None:
    """The first call of a fresh process reads its plan with the heap frozen, as it runs it:
    no full pass of the collector walks the objects the imports left (with freezing turned
    off, one does: the case the freeze is for)."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "PLANRUN_GC_FREEZE": freeze}
    out = subprocess.run([sys.executable, "-c", _FIRST_READ], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    found = json.loads(out.strip().splitlines()[-1])
    assert found["ok"]
    if freeze == "1":
        assert found["unfrozen_full_passes"] == 0
    else:
        assert found["unfrozen_full_passes"] >= 1
