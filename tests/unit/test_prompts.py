"""planrun.prompts: templates as files, strict rendering, stable hashes."""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path

import pytest
from pydantic import BaseModel

from planrun.core._errors import UsageError
from planrun.core._registry import KindSpec, Registry
from planrun.model import _prompts as prompts_module
from planrun.model._prompts import (
    PromptLibrary,
    PromptTemplate,
    RenderedPrompt,
    default_prompt_dir,
    describe_kinds,
    prompt_hash,
)

SHIPPED = [
    "analyse",
    "classify_ticket",
    "decompose",
    "deploy",
    "draft_reply",
    "migrate",
    "research",
    "smoke_test",
    "write_brief",
]


class Migration(BaseModel):
    database: str
    version: int


def _library(tmp_path: Path, **files: str) -> PromptLibrary:
    for name, text in files.items():
        (tmp_path / f"{name}.md").write_text(text, encoding="utf-8")
    return PromptLibrary(tmp_path)


def test_every_shipped_template_is_there() -> None:
    assert PromptLibrary().names() == SHIPPED


def test_shipped_worker_templates_take_the_payload_and_inputs() -> None:
    library = PromptLibrary()
    for name in SHIPPED:
        if name == "decompose":
            continue
        variables = library.get(name).variables
        assert variables[0] == "payload" and set(variables) <= {"payload", "inputs"}, name
        rendered = library.render(name, payload={"ticket": "My invoice is wrong"}, inputs={})
        assert '"ticket": "My invoice is wrong"' in rendered.text
        assert "$" not in rendered.text


def test_decompose_template_states_the_rules() -> None:
    library = PromptLibrary()
    template = library.get("decompose")
    assert set(template.variables) == {"goal", "kinds", "min_tasks", "max_tasks"}
    registry = Registry([KindSpec("migrate_db", "Apply a schema migration", Migration)])
    text = library.render(
        "decompose", goal="Ship v2", kinds=describe_kinds(registry), min_tasks=3, max_tasks=8
    ).text
    assert "Ship v2" in text
    assert "between 3 and 8 tasks" in text
    assert "### migrate_db" in text and "Apply a schema migration" in text
    assert '"version"' in text  # the payload schema is listed
    assert "earlier" in text and "depends_on" in text
    assert "Prefer independence" in text
    assert "Return only the JSON plan" in text
    assert '{"kind": "<kind>", "payload": {...}, "depends_on": [0]}' in text  # braces kept
    assert "$" not in text


def test_missing_variables_are_named(tmp_path: Path) -> None:
    library = _library(tmp_path, t="Hello $name, you are ${age} and $name again; $mood.")
    with pytest.raises(UsageError, match="'name', 'age', 'mood'"):
        library.render("t")
    with pytest.raises(UsageError, match="'mood'") as caught:
        library.render("t", name="Ann", age=3)
    assert "'name'" not in str(caught.value)


def test_extra_variables_are_ignored(tmp_path: Path) -> None:
    library = _library(tmp_path, t="Hi $name")
    assert library.render("t", name="Bo", unused=1).text == "Hi Bo"


def test_values_other_than_strings_are_json(tmp_path: Path) -> None:
    library = _library(tmp_path, t="$a|$b|$c|$d")
    text = library.render("t", a=3, b=["x"], c=Migration(database="main", version=2), d="s").text
    assert text == '3|[\n  "x"\n]|{\n  "database": "main",\n  "version": 2\n}|s'


def test_dollar_escape_and_literal_braces(tmp_path: Path) -> None:
    library = _library(tmp_path, t='Costs $$5 for {"n": $n} and {name}')
    assert library.render("t", n=1).text == 'Costs $5 for {"n": 1} and {name}'


def test_a_stray_dollar_is_reported_with_its_line(tmp_path: Path) -> None:
    library = _library(tmp_path, t="ok\nprice: $5")
    with pytest.raises(UsageError, match="line 2"):
        library.get("t")


def test_hash_is_stable_and_covers_name_and_text(tmp_path: Path) -> None:
    library = _library(tmp_path, a="Hi $x", b="Hi $x")
    first = library.render("a", x="1")
    assert first == library.render("a", x="1")
    assert first.hash == hashlib.sha256(b"a\0Hi 1").hexdigest()[:16]
    assert first.hash == prompt_hash("a", "Hi 1")
    assert len(first.hash) == 16
    assert library.render("a", x="2").hash != first.hash
    assert library.render("b", x="1").hash != first.hash


def test_names_with_or_without_suffix_and_bad_names(tmp_path: Path) -> None:
    library = _library(tmp_path, t="x")
    assert library.get("t") is library.get("t.md")
    assert "t" in library and "missing" not in library
    with pytest.raises(UsageError, match=r"no prompt 'missing'.*\['t'\]"):
        library.get("missing")
    for bad in ["../etc/passwd", "a/b", "", ".hidden"]:
        with pytest.raises(UsageError):
            library.get(bad)


def test_a_user_directory(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a prompt")
    library = _library(tmp_path, decompose="My own planner for $goal")
    assert library.names() == ["decompose"]
    assert library.render("decompose", goal="x").text == "My own planner for x"
    assert str(tmp_path) in repr(library)


def test_a_missing_directory_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        PromptLibrary(tmp_path / "nope")


def test_default_directory_falls_back_to_the_repository() -> None:
    root = default_prompt_dir()
    assert root.joinpath("decompose.md").is_file()
    repo = Path(__file__).resolve().parents[2] / "prompts"
    assert Path(str(root)).resolve() == repo.resolve()


def test_default_directory_prefers_the_installed_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "planrun"
    (package / "prompts").mkdir(parents=True)
    (package / "prompts" / "decompose.md").write_text("installed $goal")

    def files(name: str) -> Path:
        assert name == "planrun"
        return package

    monkeypatch.setattr(resources, "files", files)
    assert PromptLibrary().render("decompose", goal="g").text == "installed g"
    assert prompts_module.default_prompt_dir() == package / "prompts"


def test_rendered_prompt_as_messages() -> None:
    prompt = RenderedPrompt("n", "text", "h")
    assert prompt.messages() == [{"role": "user", "content": "text"}]
    assert prompt.messages(system="s")[0] == {"role": "system", "content": "s"}


def test_template_variables_in_order() -> None:
    assert PromptTemplate("t", "$b ${a} $b $$c").variables == ("b", "a")


def test_describe_kinds_without_payload_model() -> None:
    text = describe_kinds([KindSpec("ping")])
    assert "### ping" in text and "(no description)" in text and '"type": "object"' in text
