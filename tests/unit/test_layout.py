"""The package by role: the import contracts of ``pyproject.toml`` and two rules they
cannot state (no circle of imports, no private module imported from outside its package)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import planrun

SRC = Path(planrun.__file__).parent


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Every planrun module -> the planrun modules it imports (type-checking imports too)."""
    graph: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        here = _module(path)
        found = graph.setdefault(here, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.split(".")[0] == "planrun":
                    found.add(node.module)
                    found.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("planrun"))
    return {m: {i for i in found if i in graph and i != m} for m, found in graph.items()}


def _package(module: str) -> str:
    return module.rpartition(".")[0]


def test_no_private_module_is_imported_from_outside_its_package() -> None:
    graph = _imports()
    wrong = sorted(
        f"{importer} imports {imported}"
        for importer, imported_set in graph.items()
        for imported in imported_set
        if imported.rpartition(".")[2].startswith("_")
        and not imported.endswith("__init__")
        and not (importer + ".").startswith(_package(imported) + ".")
    )
    assert wrong == []


def test_no_circle_of_imports() -> None:
    graph = _imports()
    # A package imports its own modules to say what is public: that is no circle.
    edges = {m: {i for i in found if not i.startswith(m + ".")}
             for m, found in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for module in sorted(edges):
        if module not in index:
            visit(module)
    assert circles == []


def test_the_import_contracts_hold() -> None:
    linter = Path(sys.executable).with_name("lint-imports")  # from the [dev] extra
    done = subprocess.run([str(linter), "--no-cache"], capture_output=True, text=True,
                          cwd=SRC.parents[1], check=False)
    assert done.returncode == 0, done.stdout[-3000:]


def test_the_old_flat_module_paths_are_gone() -> None:
    """No import hook: an old flat path is an import error, and the package is a plain
    module."""
    import importlib
    import types

    import planrun

    for old in ("planrun.supervisor", "planrun.errors", "planrun.fixtures", "planrun.distributed"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)
    assert type(planrun) is types.ModuleType


MAX_CLASS_LINES, MAX_FUNCTION_LINES = 400, 60


def test_every_class_and_function_reads_in_one_sitting() -> None:
    """No class over 400 lines and no function over 60 anywhere in the package."""
    too_long = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            size = (node.end_lineno or node.lineno) - node.lineno + 1 \
                if isinstance(node, ast.stmt) else 0
            if (isinstance(node, ast.ClassDef) and size > MAX_CLASS_LINES) \
                    or (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) \
                    and size > MAX_FUNCTION_LINES):
                too_long.append(f"{_module(path)}.{node.name}: {size} lines")
    assert too_long == []
