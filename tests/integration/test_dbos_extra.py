"""Without the ``[dbos]`` extra, the verbs that need it say so in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dbos_support import SRC


def test_without_the_dbos_extra_the_worker_verb_says_how_to_install_it(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['dbos'] = None; from planrun.cli import main; "
            f"sys.exit(main(['worker', '--db', 'sqlite:///{tmp_path}/w.db', "
            "'--app', 'planrun.examples.tickets:make_app']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and 'pip install "planrun[dbos]"' in done.stderr
    assert not (tmp_path / "w.db.dbos").exists()
