"""Every notebook runs top to bottom, offline, without an error (nbclient)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks() -> None:
    names = {p.name for p in NOTEBOOKS}
    assert {"strategies.ipynb"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_offline_from_any_folder_even_with_a_key_set(
        path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A key in the environment does not make a notebook live (only LIVE = True does), and
    # it runs from a folder outside the repository. OPENAI_BASE_URL points at a closed
    # port (tests/conftest.py), so a call that went out would fail the cell.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-proj-notebook-key-that-must-not-be-used-0000")
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError on the first failing cell
    errors = [o for c in notebook.cells if c.cell_type == "code"
              for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
