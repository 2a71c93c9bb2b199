"""Every Python code block of the README and of the docs runs, in order, as written.

Each document's blocks share one namespace (a page reads top to bottom) and run in a fresh
folder of their own. Blocks that call a model replay a shipped cassette; the model-servers
guide runs against a real OpenAI-compatible server on loopback (the stand-in), which is
what its ``OPENAI_BASE_URL`` names for the run.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser

from planrun.dev.testing import FakeOpenAI

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
from standin import StandIn  # noqa: E402

DOCUMENTS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
PARSER = Sybil(parsers=[PythonCodeBlockParser()])


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


@contextmanager
def _model_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    with StandIn(FakeOpenAI()) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "local")
        yield {"server": server}


@contextmanager
def _nothing(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    yield {}


SETUP = {"docs/guides/models.md": _model_server, "docs/guides/batch.md": _model_server,
         "docs/concepts/tiers.md": _model_server}


def run_document(path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Run every Python block of ``path`` in order; return the namespace and the setup's."""
    document = PARSER.parse(path)
    with SETUP.get(_name(path), _nothing)(monkeypatch) as context:
        for example in document.examples():
            try:
                example.evaluate()
            except Exception as exc:
                raise AssertionError(f"{_name(path)}, line {example.line}: "
                                     f"{type(exc).__name__}: {exc}") from exc
        if "server" in context:
            context["requests"] = list(context["server"].fake.requests)
    return {**document.namespace, **context}


def _with_python_blocks() -> list[Path]:
    return [p for p in DOCUMENTS if "```python" in p.read_text(encoding="utf-8")]


@pytest.mark.parametrize("path", _with_python_blocks(), ids=_name)
def test_every_python_block_runs(path: Path, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    run_document(path, monkeypatch)


def test_the_documents_with_code_are_all_found() -> None:
    names = {_name(p) for p in _with_python_blocks()}
    assert {"README.md", "docs/index.md", "docs/concepts/failures.md",
            "docs/guides/durable.md", "docs/guides/models.md",
            "docs/concepts/tiers.md"} <= names


def test_the_readme_is_a_front_door() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    for peer in ("LangGraph", "Pydantic AI", "CrewAI", "Temporal"):
        assert peer in text, peer
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 3  # a plan from a goal; plain functions with failures; a resume
    assert 'replay("brief")' in blocks[0]


def test_the_readme_links_only_to_pages_that_exist() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\((docs/[^)#]+)", text)
    assert links
    for link in links:
        assert (ROOT / link).is_file(), link


def test_the_model_guide_runs_against_a_real_http_server(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace = run_document(ROOT / "docs/guides/models.md", monkeypatch)
    assert namespace["report"].counts["completed"] == 1
    (request,) = namespace["requests"]
    assert request.schema_name == "label_ticket"
    assert "Charged twice" in request.prompt
    assert (tmp_path / "my_prompts" / "label_ticket.md").is_file()


def test_the_model_guide_names_every_setting() -> None:
    text = (ROOT / "docs/guides/models.md").read_text(encoding="utf-8")
    for name in ("PLANRUN_STRUCTURED", "PLANRUN_SCHEMA", "PLANRUN_COMPAT", "PLANRUN_API",
                 "OPENAI_BASE_URL", "PLANRUN_MODEL", "xgrammar", "failed to parse grammar",
                 "invalid JSON schema in format", "json_object"):
        assert name in text, name


def test_the_architecture_page_names_functions_that_exist() -> None:
    """Each ``module: function`` the rule table names is defined there (or on Scheduler)."""
    from planrun.core.scheduling._scheduler import Scheduler

    text = (ROOT / "docs/architecture.md").read_text(encoding="utf-8")
    section = text.split("## Where each rule lives", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")][2:]
    checked = 0
    for row in rows:
        module: Any = None
        for part in re.split(r";\s*", row.rstrip(" |").split(" | ")[-1]):
            where, _, names = part.rpartition(":")
            for file in re.findall(r"`([\w/]+\.py)`", part):
                found = [*(ROOT / "src/planrun").rglob(Path(file).name)]
                assert any(str(f).endswith(file) for f in found), file
            if where:
                file = where.strip(" `")
                dotted = file.removesuffix(".py").replace("/", ".")
                module = importlib.import_module(
                    f"planrun.{dotted}" if "/" in file else f"planrun.core.scheduling.{dotted}")
            for name in re.findall(r"`([A-Za-z_.]+)`", names if where else part):
                owner, _, attr = name.rpartition(".")
                if owner:
                    assert owner == "Scheduler" and hasattr(Scheduler, attr), name
                else:
                    assert hasattr(module, name) or hasattr(Scheduler, name), name
                checked += 1
    assert checked >= 30


def test_a_cassette_name_nobody_ships_is_one_clear_error() -> None:
    from planrun.core import UsageError
    from planrun.testing import replay

    with pytest.raises(UsageError, match=r"no cassette 'brieff'.*have .*brief"), \
            replay("brieff"):
        pass


def test_every_shipped_example_cassette_replays_by_name_from_planrun_testing() -> None:
    from planrun.testing import shipped_cassette, shipped_names

    names = shipped_names()
    assert {"brief", "tickets", "release", "triage", "examples", "taskbench"} <= set(names)
    assert all(shipped_cassette(name).is_file() for name in names)


def test_the_cli_reference_is_written_from_the_parser() -> None:
    """Every verb and every flag the parser declares is in the generated reference."""
    import argparse

    from planrun.cli._main import _build_parser
    from planrun.cli._reference import _subcommands, cli_reference

    text = cli_reference()
    sections = dict(re.findall(r"^#+ `(planrun [^`]+)`\n(.*?)(?=^#+ `|\Z)", text, re.S | re.M))

    def walk(parser: argparse.ArgumentParser, name: str) -> int:
        count = 0
        for verb, _, sub in _subcommands(parser):
            full = f"{name} {verb}"
            assert full in sections, full
            for action in sub._actions:
                for flag in action.option_strings:
                    if flag not in ("-h", "--help"):
                        assert f"`{flag}" in sections[full], (full, flag)
                        count += 1
            count += walk(sub, full)
        return count

    assert walk(_build_parser(), "planrun") > 100
    run = sections["planrun run"]
    for wanted in ("--deadline S", "--quiet", "--model", "replan", "--on-dead"):
        assert wanted in run, wanted


_PRIVATE = re.compile(r"\bplanrun(?:\.[A-Za-z0-9]\w*)*\._\w+")
"""A dotted name reaching into planrun below a private (underscored) part."""


def _notebook_code() -> dict[str, str]:
    import json

    code: dict[str, str] = {}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        code[path.name] = "\n".join("".join(c["source"]) for c in cells
                                    if c["cell_type"] == "code")
    return code


def test_notebooks_use_public_names_only() -> None:
    """A notebook teaches what a user may import: no private module, no private name, not
    even in a string (mock.patch("planrun.model._prompts....") is an import too)."""
    import ast

    books = _notebook_code()
    assert books
    for name, code in books.items():
        assert not _PRIVATE.findall(code), (name, _PRIVATE.findall(code))
        tree = ast.parse("\n".join(line for line in code.splitlines()
                                   if not line.lstrip().startswith(("%", "!"))))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("planrun"):
                parts = [*str(node.module).split("."), *(a.name for a in node.names)]
            elif isinstance(node, ast.Import):
                parts = [p for a in node.names if a.name.startswith("planrun")
                         for p in a.name.split(".")]
            else:
                continue
            assert not [p for p in parts if p.startswith("_")], (name, ast.unparse(node))


def test_the_demo_transcripts_are_what_the_demo_prints(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's and the getting-started page's ``planrun demo`` transcripts are written
    by tools/make_transcripts.py from the demo itself; here the demo runs again and each
    must match (run ids and durations masked), and a figure the demo no longer prints
    is caught."""
    import make_transcripts

    outputs: dict[str, str] = {}
    assert make_transcripts.problems(outputs) == []
    brief = outputs["brief"]
    assert max(map(len, brief.splitlines())) <= make_transcripts.WIDTH
    assert "active: -" in brief.splitlines()  # the progress display ends its line
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    usage = next(line for line in readme.splitlines() if line.startswith("usage: "))
    stale = tmp_path / "README.md"
    stale.write_text(readme.replace(usage, "usage: 8 requests, 5323 tokens"), encoding="utf-8")
    monkeypatch.setattr(make_transcripts, "DOCUMENTS", (stale,))
    monkeypatch.setattr(make_transcripts, "REPO", tmp_path)
    assert make_transcripts.problems(outputs) == [
        "README.md: a demo transcript differs from the demo"]


def test_the_pytest_example_of_the_fixtures_guide_runs_under_pytest(tmp_path: Path) -> None:
    """The guide's planrun_cassette test, run by pytest with the plugin as the guide says:
    it passes on the cassette, and fails on one that lacks a request it makes."""
    import json
    import os
    import shutil
    import subprocess

    from planrun.testing import shipped_cassette

    text = (ROOT / "docs/guides/fixtures.md").read_text(encoding="utf-8")
    [test] = [b for b in re.findall(r"```python\n(.*?)```", text, re.S)
              if "@pytest.mark.planrun_cassette" in b]
    [command] = [line for line in text.splitlines() if line.startswith("pytest -p ")]
    (tmp_path / "test_release.py").write_text(test, encoding="utf-8")
    (tmp_path / "fixtures").mkdir()
    cassette = tmp_path / "fixtures" / "release.json"
    shutil.copy(shipped_cassette("release"), cassette)
    argv = [sys.executable, "-m", *command.split("#")[0].split(), "-p", "no:cacheprovider"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}

    def pytest_run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)

    passed = pytest_run()
    assert passed.returncode == 0 and "1 passed" in passed.stdout, passed.stdout[-2000:]
    data = json.loads(cassette.read_text(encoding="utf-8"))
    data["interactions"] = data["interactions"][:-1]  # the smoke test's request is gone
    cassette.write_text(json.dumps(data), encoding="utf-8")
    failed = pytest_run()
    assert failed.returncode == 1 and "1 failed" in failed.stdout
    assert "no recording" in failed.stdout, failed.stdout[-2000:]
