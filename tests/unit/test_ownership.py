"""hold_run: one owner per run, renewed while the block runs, released however it ends."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from planrun import RunInUse, UsageError
from planrun.runtime import hold_run
from planrun.runtime._ownership import default_ttl
from planrun.stores import InMemoryStore, RunInfo


async def test_the_lease_is_taken_renewed_and_released() -> None:
    store = InMemoryStore()
    await store.create_run(RunInfo("r", 1.0))
    async with hold_run(store, "r", owner="me", ttl=0.3) as name:
        assert name == "me"
        first = await store.run_owner("r")
        assert first is not None and first.name == "me" and first.live(time.time())
        with pytest.raises(RunInUse, match="run r is owned by me"):
            async with hold_run(store, "r", owner="other", ttl=0.3, wait=False):
                pytest.fail("a second owner got in")
        await asyncio.sleep(0.5)  # longer than the ttl: only renewals keep it
        renewed = await store.run_owner("r")
        assert renewed is not None and renewed.until > first.until
        assert renewed.live(time.time())
    assert await store.run_owner("r") is None
    assert len(store.calls_to("renew_run")) >= 2


async def test_the_lease_is_released_when_the_block_fails() -> None:
    store = InMemoryStore()
    await store.create_run(RunInfo("r", 1.0))
    with pytest.raises(KeyboardInterrupt):
        async with hold_run(store, "r", owner="me"):
            raise KeyboardInterrupt
    assert await store.run_owner("r") is None


async def test_a_new_run_is_owned_as_soon_as_it_exists() -> None:
    store = InMemoryStore()
    async with hold_run(store, "fresh", owner="me", ttl=5.0, new_run=True):
        await asyncio.sleep(0.02)
        await store.create_run(RunInfo("fresh", 1.0))
        for _ in range(100):
            if await store.run_owner("fresh") is not None:
                break
            await asyncio.sleep(0.01)
        owner = await store.run_owner("fresh")
        assert owner is not None and owner.name == "me"
    assert await store.run_owner("fresh") is None
    async with hold_run(store, "never", new_run=True):  # the block never creates it
        pass


def test_the_ttl_comes_from_the_environment_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PLANRUN_OWNER_TTL", raising=False)
    assert default_ttl() == 30.0
    monkeypatch.setenv("PLANRUN_OWNER_TTL", "2.5")
    assert default_ttl() == 2.5
    monkeypatch.setenv("PLANRUN_OWNER_TTL", "soon")
    with pytest.raises(UsageError, match="PLANRUN_OWNER_TTL must be a positive number"):
        default_ttl()


async def test_resume_run_and_a_wrapped_supervisor_are_refused_while_the_owner_lives() -> None:
    from planrun import Registry, aresume_run
    from planrun.core import KindSpec, Task
    from planrun.runtime import Supervisor

    ran: list[str] = []

    async def work(payload: object, ctx: object) -> int:
        ran.append("ran")
        return 1

    registry = Registry([KindSpec("k", handler=work)])
    store = InMemoryStore()
    await store.create_run(RunInfo("r", 1.0, "running"))
    await store.add_tasks("r", [Task(id="a", kind="k")], [])
    async with hold_run(store, "r", owner="host:1:abc", ttl=5.0):
        with pytest.raises(RunInUse, match="run r is owned by host:1:abc"):
            await aresume_run("r", registry, store, wait=False)
        with pytest.raises(RunInUse, match="owned by host:1:abc"):
            async with hold_run(store, "r", wait=False):
                await Supervisor(registry, store=store, run_id="r").aresume()
    assert ran == []  # neither second owner ran anything
    state = await store.load("r")
    assert [t.status.value for t in state.tasks] == ["pending"]
    report = await aresume_run("r", registry, store)  # the owner is gone: it goes on
    assert report.ok and ran == ["ran"]


# ---- an owner that is a gone process of this host --------------------------------------


def _name_of(pid: int, started: str | None) -> str:
    import socket

    return f"{socket.gethostname()}:{pid}:{started or 0}:abcdef"


def _gone_process() -> int:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_owner_gone_knows_a_process_of_this_host_that_no_longer_exists() -> None:
    import os
    import socket

    from planrun.stores import owner_gone, owner_name
    from planrun.stores._owners import _started

    me = owner_name()
    assert me.startswith(f"{socket.gethostname()}:{os.getpid()}:") and not owner_gone(me)
    assert owner_gone(_name_of(_gone_process(), None))
    # The pid exists, but it is another process than the one that took the lease.
    assert owner_gone(_name_of(os.getpid(), "12345"))
    assert not owner_gone(_name_of(os.getpid(), _started(os.getpid())))
    # Old-style names (no start time) are judged by the pid alone.
    assert not owner_gone(f"{socket.gethostname()}:{os.getpid()}:abcdef")
    # Elsewhere, or not a name of this form: only the lease can tell.
    for name in (f"elsewhere-{socket.gethostname()}:{_gone_process()}:1:ab", "me", "h:x:y",
                 f"{socket.gethostname()}:0:1:ab"):
        assert not owner_gone(name), name


async def test_a_gone_owner_of_this_host_is_taken_over_at_once() -> None:
    store = InMemoryStore()
    await store.create_run(RunInfo("r", 1.0))
    dead = _name_of(_gone_process(), None)
    await store.acquire_run("r", dead, ttl=300.0, now=time.time())
    started = time.monotonic()
    async with hold_run(store, "r", owner="me", wait=False):
        owner = await store.run_owner("r")
        assert owner is not None and owner.name == "me"
    assert time.monotonic() - started < 60  # not its 300 s lease


async def test_a_live_owner_elsewhere_is_waited_for_then_refused_or_taken_over() -> None:
    store = InMemoryStore()
    await store.create_run(RunInfo("r", 1.0))
    seen: list[float] = []
    # A live owner keeps renewing: after one lease the waiter gives up, naming it.
    async with hold_run(store, "r", owner="elsewhere:1:2:ab", ttl=1.2):
        with pytest.raises(RunInUse, match="a live process: it kept renewing its lease"):
            async with hold_run(store, "r", owner="me", on_wait=lambda o, left: seen.append(left)):
                pytest.fail("a second owner got in")
        assert seen and seen == sorted(seen, reverse=True) and seen[0] <= 1.2
        with pytest.raises(RunInUse, match="whose lease ends"):  # no wait: at once
            async with hold_run(store, "r", owner="me", wait=False):
                pytest.fail("a second owner got in")
    # An owner elsewhere that stopped renewing is waited for, then taken over.
    await store.acquire_run("r", "elsewhere:1:2:ab", ttl=0.8, now=time.time())
    async with hold_run(store, "r", owner="me"):
        owner = await store.run_owner("r")
        assert owner is not None and owner.name == "me"


@pytest.mark.parametrize("reused", [False, True], ids=["pid gone", "pid reused"])
def test_a_run_whose_owner_is_provably_gone_is_listed_interrupted_at_once(
        tmp_path: Any, capsys: pytest.CaptureFixture[str], reused: bool) -> None:
    """The listing asks the rule resume asks (owner_gone): a SIGKILLed owner of this host
    does not keep its run 'running' until its lease runs out."""
    import json
    import os

    from planrun.cli import main
    from planrun.stores import open_store
    from planrun.stores._owners import _started

    db = f"sqlite:///{tmp_path / 'runs.db'}"
    dead = _name_of(os.getpid(), "12345") if reused else _name_of(_gone_process(), None)
    alive = _name_of(os.getpid(), _started(os.getpid()))

    async def make() -> None:
        store = open_store(db)
        await store.open()
        for run_id, owner in (("dead", dead), ("alive", alive)):
            await store.create_run(RunInfo(run_id, 1.0, goal=run_id))
            await store.acquire_run(run_id, owner, ttl=300.0, now=time.time())
        await store.close()

    asyncio.run(make())
    assert main(["runs", "--db", db, "--json"]) == 0
    listed = {r["id"]: r["status"] for r in json.loads(capsys.readouterr().out)}
    assert listed == {"dead": "interrupted", "alive": "running"}
    assert main(["status", "dead", "--db", db, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["run_status"] == "interrupted"
    assert main(["runs", "--db", db]) == 0
    assert "dead  interrupted" in capsys.readouterr().out
