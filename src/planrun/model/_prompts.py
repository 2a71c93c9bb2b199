"""Prompt templates as files, versioned with the code.

Templates live in the top-level ``prompts/`` folder of the repository, one ``<name>.md``
file each, and ship in the wheel as ``planrun/prompts``. :class:`PromptLibrary` loads them
through :mod:`importlib.resources` (falling back to the repository folder in an editable
install), or from any directory you point it at.

Placeholders use :class:`string.Template` syntax: ``$name`` or ``${name}``, and ``$$`` for
a literal dollar sign. That syntax was chosen over ``{name}`` because prompts are full of
JSON examples whose braces must stay as they are. Rendering is strict about what is
missing and lenient about what is extra:

* a placeholder with no value raises :class:`~planrun.UsageError` naming it;
* a value no placeholder uses is ignored (callers may pass a whole payload).

Strings are inserted as they are; other values as JSON (pydantic models via
``model_dump``). Every render carries a stable hash of the template name and rendered text,
recorded with each model call (``Completion.prompt_hash``, ``UsageRecord.prompt_hash``)
so a result can be traced to the exact prompt that produced it::

    prompt = PromptLibrary().render("classify_ticket", payload=ticket)
    prompt.hash   # '3f9a0c...' (16 hex digits)
"""

from __future__ import annotations

import hashlib
import json
import os
import string
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from planrun.core import KindSpec, Registry, UsageError, describe_contract

__all__ = [
    "PromptLibrary",
    "PromptTemplate",
    "RenderedPrompt",
    "default_prompt_dir",
    "describe_kinds",
    "prompt_hash",
]

SUFFIX = ".md"


def prompt_hash(name: str, text: str) -> str:
    """First 16 hex digits of sha256 over the template name and the rendered text."""
    return hashlib.sha256(f"{name}\0{text}".encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RenderedPrompt:
    """A rendered template: its name, the text, and the hash that identifies both."""

    name: str
    text: str
    hash: str

    def messages(self, system: str | None = None) -> list[dict[str, str]]:
        """The text as a one-message chat (after an optional system message)."""
        head = [{"role": "system", "content": system}] if system else []
        return [*head, {"role": "user", "content": self.text}]


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


@dataclass(frozen=True)
class PromptTemplate:
    """One template: its name, source text and the placeholders it uses."""

    name: str
    source: str

    def __post_init__(self) -> None:
        for match in string.Template.pattern.finditer(self.source):
            if match.group("invalid") is not None:
                line = self.source.count("\n", 0, match.start()) + 1
                raise UsageError(
                    f"prompt {self.name!r}, line {line}: a '$' that starts no placeholder "
                    "(write '$$' for a literal dollar sign)"
                )

    @property
    def version(self) -> str:
        """Identifies this template's text: 16 hex digits, changed by any edit."""
        return prompt_hash(self.name, self.source)

    @property
    def variables(self) -> tuple[str, ...]:
        """Placeholder names, in order of first use."""
        seen: dict[str, None] = {}
        for match in string.Template.pattern.finditer(self.source):
            name = match.group("named") or match.group("braced")
            if name:
                seen.setdefault(name, None)
        return tuple(seen)

    def render(self, **variables: Any) -> RenderedPrompt:
        """Fill every placeholder; a missing one raises :class:`UsageError` naming it."""
        missing = [name for name in self.variables if name not in variables]
        if missing:
            names = ", ".join(repr(m) for m in missing)
            raise UsageError(f"prompt {self.name!r} needs a value for {names}")
        values = {name: _as_text(variables[name]) for name in self.variables}
        text = string.Template(self.source).substitute(values)
        return RenderedPrompt(self.name, text, prompt_hash(self.name, text))


def default_prompt_dir() -> Traversable:
    """The shipped templates: ``planrun/prompts`` in the wheel, else the repository's."""
    shipped = resources.files("planrun").joinpath("prompts")
    if shipped.is_dir():
        return shipped
    # Editable install: src/planrun/prompts.py -> <repo>/prompts
    return Path(__file__).resolve().parents[3] / "prompts"


class PromptLibrary:
    """Templates from one directory (by default the ones shipped with planrun)."""

    def __init__(self, directory: str | os.PathLike[str] | Traversable | None = None) -> None:
        if directory is None:
            root: Traversable = default_prompt_dir()
        elif isinstance(directory, str | os.PathLike):
            root = Path(directory)
        else:
            root = directory
        if not root.is_dir():
            raise UsageError(f"prompt directory {str(root)!r} does not exist")
        self._root = root
        self._cache: dict[str, PromptTemplate] = {}

    def __repr__(self) -> str:
        return f"PromptLibrary({str(self._root)!r})"

    def names(self) -> list[str]:
        """Template names (file names without ``.md``), sorted."""
        return sorted(
            entry.name[: -len(SUFFIX)]
            for entry in self._root.iterdir()
            if entry.name.endswith(SUFFIX) and entry.is_file()
        )

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._root.joinpath(self._file(name)).is_file()

    @staticmethod
    def _file(name: str) -> str:
        if not name or "/" in name or "\\" in name or name.startswith("."):
            raise UsageError(f"bad prompt name {name!r}")
        return name if name.endswith(SUFFIX) else name + SUFFIX

    def get(self, name: str) -> PromptTemplate:
        """The template called ``name`` (``"decompose"`` or ``"decompose.md"``)."""
        file = self._file(name)
        key = file[: -len(SUFFIX)]
        if key not in self._cache:
            entry = self._root.joinpath(file)
            if not entry.is_file():
                raise UsageError(f"no prompt {key!r} in {str(self._root)!r}; have {self.names()}")
            self._cache[key] = PromptTemplate(key, entry.read_text(encoding="utf-8"))
        return self._cache[key]

    def render(self, name: str, /, **variables: Any) -> RenderedPrompt:
        """Render template ``name`` with ``variables``."""
        return self.get(name).render(**variables)


def describe_kinds(kinds: Registry | Iterable[KindSpec]) -> str:
    """A prompt-ready list of kinds: name, description, contract (when the kind declares
    one) and payload JSON Schema of each."""
    registry = kinds if isinstance(kinds, Registry) else Registry(kinds)
    blocks = []
    for spec in registry:
        schema = json.dumps(spec.payload_schema(), indent=2, sort_keys=True)
        description = spec.description or "(no description)"
        contract = "".join(f"\n- {line}" for line in describe_contract(spec, registry))
        blocks.append(f"### {spec.name}\n{description}\n{contract and contract + chr(10)}"
                      f"\nPayload schema:\n```json\n{schema}\n```")
    return "\n\n".join(blocks)
