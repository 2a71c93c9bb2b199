"""Who owns a run: owner names, and whether an owner is provably gone.

An owner name is ``host:pid:start:random``, where ``start`` is the process's start time, so
a pid reused by another process is not mistaken for the owner. :func:`owner_gone` is the one
rule that says a run's owner no longer exists: resuming takes such a run over at once
(:func:`planrun.runtime.hold_run`), and every listing shows it ``interrupted`` at once
(:func:`planrun.stores.shown_status`).
"""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

__all__ = ["owner_gone", "owner_name"]


def _started(pid: int) -> str | None:
    """The process's start time in clock ticks since boot, or None where /proc does not
    tell (another system, or no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: count after it.
    fields = stat[stat.rfind(")") + 2:].split()
    return fields[19] if len(fields) > 19 else None


def owner_name() -> str:
    """A name for this process as a run's owner: ``host:pid:start:random``."""
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{_started(pid) or 0}:{uuid.uuid4().hex[:6]}"


def owner_gone(name: str) -> bool:
    """Whether ``name`` is a process of this host that no longer exists.

    Only an owner named by :func:`owner_name` on this host can be known to be gone: one
    on another host, or a name of another form, is not (its lease decides). A pid that
    exists but belongs to a process started at another time than the owner's was reused,
    so the owner is gone too.
    """
    parts = name.split(":")
    if len(parts) not in (3, 4) or parts[0] != socket.gethostname():
        return False
    try:
        pid = int(parts[1])
    except ValueError:
        return False
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # it exists, as another user's process
        pass
    if len(parts) == 4 and parts[2] != "0":
        started = _started(pid)
        return started is not None and started != parts[2]
    return False
