"""Writes that fail for seconds, in a real process on a real SQLite file.

Another process takes the file's write lock and holds it for 5 s: every write of the
supervised run fails meanwhile. The run starts no new attempt while its writes fail, starts
again once one succeeds, finishes with nothing lost, and its stderr has no traceback (no
"Task exception was never retrieved").
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

JOB = Path(__file__).with_name("locked_job.py")
HOLD_S = 5.0


def completed(conn: sqlite3.Connection) -> int:
    try:
        return int(conn.execute(
            "SELECT count(*) FROM planrun_tasks WHERE status = 'completed'").fetchone()[0])
    except sqlite3.OperationalError:  # the job has not made its tables yet
        return 0


def test_failing_writes_pause_new_work_and_leave_no_traceback(tmp_path: Path) -> None:
    db = tmp_path / "locked.db"
    job = subprocess.Popen([sys.executable, str(JOB), str(db)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while not db.exists() and time.time() < deadline:
            time.sleep(0.05)
        with contextlib.closing(sqlite3.connect(db, timeout=10, isolation_level=None)) as conn:
            while completed(conn) < 60:
                assert job.poll() is None and time.time() < deadline, job.communicate()
                time.sleep(0.05)
            conn.execute("BEGIN IMMEDIATE")  # the write lock: the job's writes now fail
            locked = time.time()
            time.sleep(HOLD_S)
            unlocked = time.time()
            conn.execute("COMMIT")
        out, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    assert job.returncode == 0, err[-3000:]
    assert "Task exception was never retrieved" not in err and "Traceback" not in err, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["ok"] and report["clean"]
    starts = report["starts"]
    assert len(starts) == 400  # every task ran once: no result was thrown away
    # Attempts in flight when the lock was taken finish; what starts in the first second
    # started before a write had failed (busy timeout 0.5 s). After that, nothing.
    later = [s for s in starts if locked + 1.5 <= s < unlocked]
    after = [s for s in starts if s >= unlocked]
    print(f"\nwrites failing {unlocked - locked:.1f} s: handler starts in its first 1.5 s "
          f"{sum(locked <= s < locked + 1.5 for s in starts)}, later {len(later)}, "
          f"after {len(after)}")
    assert later == []
    assert after  # work started again once the writes went through
