"""Every notebook runs top to bottom, offline, from any folder, and shows what it stores.

The notebooks are stored with their outputs (``tools/make_notebooks.py`` writes and runs
them). Here each runs again from a scratch folder with an API key set (a key alone never
makes a notebook live) and its fresh outputs must be the stored ones, with run ids,
durations and scratch paths masked.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import make_notebooks  # noqa: E402

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks_and_they_match_their_source() -> None:
    assert {p.name for p in NOTEBOOKS} == set(make_notebooks.BOOKS)
    for path in NOTEBOOKS:
        assert make_notebooks.problems(path.name) == []


def test_the_notebooks_read_as_prose_not_as_tests() -> None:
    for name, cells in make_notebooks.BOOKS.items():
        code = "\n".join(text for kind, text in cells if kind == "code")
        assert "assert " not in code, name
        if "replay(" in code:  # calls a model: live only when switched on
            assert "LIVE = False" in code, name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_offline_from_any_folder_and_shows_what_it_stores(
        path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # OPENAI_BASE_URL points at a closed port (tests/conftest.py), so a call that went out
    # would fail the cell.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-proj-notebook-key-that-must-not-be-used-0000")
    stored = nbformat.read(path, as_version=4)
    fresh = make_notebooks.execute(nbformat.read(path, as_version=4))
    errors = [o for c in fresh.cells if c.cell_type == "code"
              for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    assert make_notebooks.outputs(fresh) == make_notebooks.outputs(stored)
    assert any(cell for cell in make_notebooks.outputs(stored))
